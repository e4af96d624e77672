"""The pipelined training loop (elastic_ps.pipeline, elastic_ps.step_sync and the PS
modules' prefetch): S = 0 is the unpipelined loop bit for bit; at most S steps in flight;
a pull waits for exactly the pushes it must see; an asynchronous push's error is raised
at the next step and never lost.

Exactness runs against the in-process fake and against a real master with two pods; the
ordering tests use fakes whose calls complete when the test says so (no timing)."""

import itertools
import os
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from elastic_ps.client import PsError  # noqa: E402
from elastic_ps.pipeline import TrainPipeline  # noqa: E402
from elastic_ps.torch_modules import (KeyedJagged, PsDense, PsEmbeddingBag,  # noqa: E402
                                      PsEmbeddingBagCollection, PsEmbeddingBagConfig,
                                      PsOptimizer)
from fake_ps import FakePsClient  # noqa: E402

_names = itertools.count()


def _prefix():
    return f"p{os.getpid()}_{next(_names)}"


# ---- a small model over two tables and a PS-held head ----


class Model(nn.Module):
    """Table "<p>.t1" serves feature "a" (one id per sample) and "b" (bags of 0-3 ids);
    "<p>.t2" serves "c" (two ids per sample, mean); a linear head on the PS."""

    def __init__(self, client, prefix, init, create=True):
        super().__init__()
        spec = dict(optimizer="sgd", learning_rate=0.5, create=create, **init)
        self.emb = PsEmbeddingBagCollection(client, [
            PsEmbeddingBagConfig(f"{prefix}.t1", 4, "sum", ["a", "b"], **spec),
            PsEmbeddingBagConfig(f"{prefix}.t2", 3, "mean", ["c"], **spec)])
        self.head = nn.Linear(4 + 4 + 3, 1)
        self.dense = PsDense(client, self.head, f"{prefix}.head/", create=create,
                             optimizer="sgd", learning_rate=0.5,
                             initializers={"weight": {"kind": "constant", "value": 0.1},
                                           "bias": {"kind": "zeros"}})

    def forward(self, kj):
        e = self.emb(kj)
        return self.head(torch.cat([e["a"], e["b"], e["c"]], 1)).squeeze(1)


def _batches(n=30, size=16, seed=3):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        lens = rng.integers(0, 4, size)
        offsets = np.concatenate([[0], np.cumsum(lens)[:-1]])
        a = rng.integers(0, 20, size)
        kj = KeyedJagged.from_offsets({
            "a": (torch.from_numpy(a), None),
            "b": (torch.from_numpy(rng.integers(0, 15, int(lens.sum()))),
                  torch.from_numpy(offsets)),
            "c": (torch.from_numpy(rng.integers(100, 110, size * 2)),
                  torch.arange(0, size * 2, 2))})
        out.append((kj, torch.from_numpy((a < 8).astype(np.float32))))  # learnable
    return out


def _train(client, prefix, init, staleness, pipelined, batches):
    """Trains Model on ``batches``; returns (losses, rows {table: (ids, rows)}, dense)."""
    model = Model(client, prefix, init)
    opt = PsOptimizer(model, dense=[model.dense], staleness=staleness)
    ids = {f"{prefix}.t1": np.arange(0, 20), f"{prefix}.t2": np.arange(100, 110)}
    start = {t: client.pull(t, i, read_only=True) for t, i in ids.items()}
    loop = TrainPipeline(opt, lambda b: model.emb.prefetch(b[0])).run(batches) \
        if pipelined else iter(batches)
    losses = []
    for kj, y in loop:
        loss = nn.functional.binary_cross_entropy_with_logits(model(kj), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    opt.flush()
    opt.close()
    rows = {t[len(prefix):]: client.pull(t, i, read_only=True) for t, i in ids.items()}
    for t, i in ids.items():  # every row was trained
        assert (rows[t[len(prefix):]] != start[t]).any(axis=1).all(), t
    names = [f"{prefix}.head/weight", f"{prefix}.head/bias"]
    dense = {n[len(prefix):]: v for n, v in client.pull_dense(names).items()}
    return losses, rows, dense


@pytest.fixture(params=["fake", pytest.param("cluster", marks=pytest.mark.integration)])
def backend(request):
    """(make a client, initializer spec, whether two tables of equal names start equal)."""
    if request.param == "fake":
        yield (FakePsClient, {"initializer": "normal", "stddev": 0.1}, True)
        return
    from elastic_ps.client import PsClient

    address = request.getfixturevalue("shared_cluster").master.address
    clients = []

    def make():
        clients.append(PsClient(master=address, deadline_s=10))
        return clients[-1]

    # Rows of tables of different names start equal only with a constant initializer.
    yield (make, {"initializer": "constant", "value": 0.05}, False)
    for c in clients:
        c.close()


def test_s0_pipeline_is_bit_identical_to_the_unpipelined_loop(backend):
    make, init, fresh = backend
    batches = _batches()
    prefix = _prefix()
    # Two fresh fakes may use the same names; one cluster needs new ones.
    plain = _train(make(), prefix, init, 0, False, batches)
    piped = _train(make(), prefix if fresh else _prefix(), init, 0, True, batches)
    assert plain[0] == piped[0]  # every step's loss
    for t in plain[1]:
        np.testing.assert_array_equal(plain[1][t], piped[1][t])
    for n in plain[2]:
        np.testing.assert_array_equal(plain[2][n], piped[2][n])


@pytest.mark.parametrize("staleness", [1, 2])
def test_pipelined_training_learns(backend, staleness):
    make, init, _ = backend
    batches = _batches(n=150)
    losses, _, _ = _train(make(), _prefix(), init, staleness, True, batches)
    assert np.mean(losses[-30:]) < 0.5 * np.mean(losses[:30])


# ---- fakes whose calls complete when the test says so ----


class ManualClient(FakePsClient):
    """Pushes (sparse and dense) complete when ``release`` is called, oldest first; pulls
    complete at once and are recorded when issued."""

    def __init__(self):
        super().__init__()
        self.held = []  # (future, apply)
        self.issued = []  # ids of each pull_multi_async, in issue order

    def push_multi_async(self, requests, learning_rate=0.0):
        f = Future()
        self.held.append((f, lambda: self.push_multi(requests, learning_rate)))
        return f

    def push_dense_async(self, grads, learning_rate=0.0):
        f = Future()
        self.held.append((f, lambda: self.push_dense(grads, learning_rate)))
        return f

    def pull_multi_async(self, requests, read_only=False):
        self.issued.append(np.concatenate([np.asarray(i) for i in requests.values()]))
        f = Future()
        f.set_result(self.pull_multi(requests, read_only))
        return f

    def release(self, n=1, error=None):
        for _ in range(n):
            f, apply = self.held.pop(0)
            if error is None:
                apply()
                f.set_result(None)
            else:
                f.set_exception(error)

    def was_pulled(self, ids):
        return any(np.array_equal(np.sort(p), np.sort(ids)) for p in self.issued)


def _bag_step(bag, opt, ids):
    bag(ids).sum().backward()
    opt.step()
    opt.zero_grad()


def test_a_pull_is_issued_only_once_the_pushes_it_must_see_are_acknowledged():
    """Staleness 2: the rows of step t are pulled once the pushes of steps <= t - 3 are
    acknowledged, not before; earlier steps' prefetches go out at once."""
    c = ManualClient()
    bag = PsEmbeddingBag(c, "t", 2, optimizer="sgd", learning_rate=1.0)
    opt = PsOptimizer(bag, staleness=2)
    b = [torch.tensor([[10 * k + 1], [10 * k + 2]]) for k in range(5)]
    bag.prefetch(b[0])
    bag.prefetch(b[1])
    assert c.was_pulled([1, 2]) and c.was_pulled([11, 12])
    _bag_step(bag, opt, b[0])  # step 0: its push is held
    bag.prefetch(b[2])  # for step 2: needs steps <= -1 only
    assert c.was_pulled([21, 22])
    _bag_step(bag, opt, b[1])  # step 1: two steps in flight now
    assert opt.sync.in_flight == 2
    bag.prefetch(b[3])  # for step 3: must see step 0's push, which is held
    assert not c.was_pulled([31, 32])
    c.release()  # step 0's push is acknowledged: the pull goes out
    assert c.was_pulled([31, 32])
    c.release()
    _bag_step(bag, opt, b[2])
    _bag_step(bag, opt, b[3])
    c.release(2)
    opt.flush()
    assert opt.sync.max_in_flight == 2


def test_s0_pulls_the_next_batch_after_this_step_is_pushed():
    """Staleness 0: the prefetch of step 1 goes out only once step 0's push (sparse and
    dense) is acknowledged; that step 0 waits for it is shown by a push that is released
    from another thread (the step returns only after the release)."""
    c = ManualClient()
    bag = PsEmbeddingBag(c, "t", 2, optimizer="sgd", learning_rate=1.0)
    opt = PsOptimizer(bag, staleness=0)
    bag.prefetch(torch.tensor([[1], [2]]))
    bag.prefetch(torch.tensor([[3], [4]]))
    assert c.was_pulled([1, 2]) and not c.was_pulled([3, 4])
    released = threading.Event()

    def release_when_held():
        while not c.held:  # the step has started its push
            threading.Event().wait(0.001)
        released.set()
        c.release()

    t = threading.Thread(target=release_when_held)
    t.start()
    _bag_step(bag, opt, torch.tensor([[1], [2]]))
    assert released.is_set()  # step() returned after the push was acknowledged
    t.join()
    assert c.was_pulled([3, 4])


class CountingClient(FakePsClient):
    """Pushes run on a thread pool; each push records how many of the earlier pushes of
    its kind were not yet done when it was issued."""

    def __init__(self):
        super().__init__()
        self.pool = ThreadPoolExecutor(2)
        self.lock = threading.Lock()
        self.futures = {"sparse": [], "dense": []}
        self.earlier_open = {"sparse": 0, "dense": 0}  # the most seen

    def _issue(self, kind, fn, *args):
        with self.lock:
            open_ = sum(not f.done() for f in self.futures[kind])
            self.earlier_open[kind] = max(self.earlier_open[kind], open_)
            f = self.pool.submit(fn, *args)
            self.futures[kind].append(f)
        return f

    def push_multi_async(self, requests, learning_rate=0.0):
        return self._issue("sparse", self.push_multi, requests, learning_rate)

    def push_dense_async(self, grads, learning_rate=0.0):
        return self._issue("dense", self.push_dense, grads, learning_rate)


@pytest.mark.parametrize("staleness", [1, 2])
def test_never_more_than_s_steps_in_flight(staleness):
    c = CountingClient()
    batches = _batches(n=40)
    model = Model(c, "m", {"initializer": "normal", "stddev": 0.1})
    opt = PsOptimizer(model, dense=[model.dense], staleness=staleness)
    for kj, y in TrainPipeline(opt, lambda b: model.emb.prefetch(b[0])).run(batches):
        nn.functional.binary_cross_entropy_with_logits(model(kj), y).backward()
        opt.step()
        opt.zero_grad()
    # When a step's push was issued, at most S - 1 earlier steps' pushes were open.
    assert c.earlier_open["sparse"] <= staleness - 1
    assert c.earlier_open["dense"] <= staleness - 1
    assert 1 <= opt.sync.max_in_flight <= staleness
    assert opt.sync.in_flight == 0  # run() flushed
    c.pool.shutdown()


def test_an_async_push_error_surfaces_at_the_next_step_once():
    c = ManualClient()
    bag = PsEmbeddingBag(c, "t", 2, optimizer="sgd", learning_rate=1.0)
    opt = PsOptimizer(bag, staleness=2)
    ids = torch.tensor([[1], [2]])
    _bag_step(bag, opt, ids)
    c.release(error=PsError(grpc.StatusCode.UNAVAILABLE, "pod went away"))
    with pytest.raises(PsError) as e:
        bag(ids)  # the next step's forward
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    _bag_step(bag, opt, ids)  # raised once: the loop may go on
    c.release()
    opt.flush()

    # The failure arrives after the next step's forward: its step() raises it.
    _bag_step(bag, opt, ids)
    bag(ids).sum().backward()
    c.release(error=PsError(grpc.StatusCode.INTERNAL, "boom"))
    with pytest.raises(PsError, match="boom"):
        opt.step()
    opt.zero_grad()

    # The last step of a loop: flush() raises it, and TrainPipeline.run flushes.
    _bag_step(bag, opt, ids)
    c.release(error=PsError(grpc.StatusCode.INTERNAL, "last one"))
    with pytest.raises(PsError, match="last one"):
        opt.flush()
    opt.flush()  # nothing left

    pipe = TrainPipeline(opt, bag.prefetch)
    with pytest.raises(PsError, match="at the end"):
        for k, b in enumerate(pipe.run([ids, ids])):
            _bag_step(bag, opt, b)
            c.release(error=PsError(grpc.StatusCode.INTERNAL, "at the end") if k else None)


def test_discard_settles_a_failed_task():
    c = ManualClient()
    bag = PsEmbeddingBag(c, "t", 2, optimizer="sgd", learning_rate=1.0)
    opt = PsOptimizer(bag, staleness=2)
    ids = torch.tensor([[1], [2]])
    _bag_step(bag, opt, ids)
    bag.prefetch(torch.tensor([[5], [6]]))
    threading.Thread(target=lambda: c.release(error=PsError(grpc.StatusCode.INTERNAL,
                                                             "x"))).start()
    errors = opt.discard()
    assert [str(e) for e in errors] == ["INTERNAL: x"]
    assert opt.sync.in_flight == 0
    bag(ids)  # a different input: the dropped prefetch is not used, nothing raised


def test_a_prefetch_for_another_input_is_dropped_and_the_rows_pulled_again():
    c = FakePsClient()
    bag = PsEmbeddingBag(c, "t", 2, optimizer="sgd", learning_rate=1.0)
    PsOptimizer(bag, staleness=1)
    bag.prefetch(torch.tensor([[1], [2]]))
    out = bag(torch.tensor([[3], [4]]))
    np.testing.assert_array_equal(out.detach().numpy(), c.pull("t", [3, 4]))


def test_rows_land_in_the_buffer_given_to_the_client():
    """A client whose pulls take ``out=`` buffers gets them from the module, and the
    leaf tensor is that buffer (no copy)."""

    class OutClient(FakePsClient):
        def __init__(self):
            super().__init__()
            self.outs = []

        def pull_multi(self, requests, read_only=False, out=None):
            assert out is not None
            for t, ids in requests.items():
                out[t][...] = self.pull(t, ids, read_only)
                self.outs.append(out[t])
            return out

        def pull_multi_async(self, requests, read_only=False, out=None):
            f = Future()
            f.set_result(self.pull_multi(requests, read_only, out))
            return f

    c = OutClient()
    emb = PsEmbeddingBagCollection(c, [PsEmbeddingBagConfig("t", 3, optimizer="sgd")])
    PsOptimizer(emb, staleness=1)
    kj = KeyedJagged.from_dense({"t": torch.tensor([[7], [8], [7]])})
    for prefetched in (False, True):  # pulled by the forward, and ahead of it
        if prefetched:
            emb.prefetch(kj)
        out = emb(kj)["t"]
        np.testing.assert_array_equal(out.detach().numpy(), c.pull("t", [7, 8, 7]))
        assert np.shares_memory(c.outs[-1], out.detach().numpy())
    assert len(c.outs) == 2
