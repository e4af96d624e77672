"""Compact pulls (issue 17) and the feature-lifecycle arguments of create_table, against
real ps-master + ps-server processes on loopback: bfloat16 / float16 values equal the
float32 values rounded to nearest even bit for bit, in every form the SDK returns them
(numpy, torch, widened, into `out`), at half the bytes; the PyTorch modules' pull_dtype;
create_table's admission / eviction / clipping spec reaches the pods and round-trips."""

import os
import signal
import sys
import time

import numpy as np
import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from elastic_ps import PsClient, PsError  # noqa: E402
from elastic_ps._stubs import ps_pb2  # noqa: E402
from elastic_ps.client import table_spec  # noqa: E402
from elastic_ps.torch_modules import (PsEmbeddingBag, PsEmbeddingBagCollection,  # noqa: E402
                                      PsEmbeddingBagConfig, PsOptimizer)

pytestmark = [pytest.mark.integration,
              # numpy's float16 reference overflows to inf, as the pods do, and says so
              pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")]

DIM = 6


@pytest.fixture(scope="module")
def client(shared_cluster):
    with PsClient(master=shared_cluster.master.address, worker_id=11, incarnation=1,
                  deadline_s=10) as c:
        yield c


def bf16_bits(f32):
    """float32 -> bfloat16 bits, round to nearest even, computed here independently of
    the C++ code (finite inputs)."""
    u = np.ascontiguousarray(f32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.fixture(scope="module")
def table(client):
    """A table whose rows span fp16's range: large, tiny (subnormal in fp16) and ordinary
    values, and an id list with repeats."""
    name = "compact_rows"
    client.create_table(name, DIM, optimizer="sgd", learning_rate=1.0, initializer="normal",
                        stddev=3.0)
    ids = np.array([(i * 7919) % 401 - 50 for i in range(700)], dtype=np.int64)
    uniq = np.unique(ids)
    scale = np.where(np.arange(len(uniq)) % 3 == 0, 3e4, np.where(
        np.arange(len(uniq)) % 3 == 1, 1e-6, 1.0)).astype(np.float32)
    grads = (np.random.default_rng(3).standard_normal((len(uniq), DIM)) * scale[:, None])
    client.push(name, uniq, grads.astype(np.float32))
    return name, ids, client.pull(name, ids)


def test_numpy_forms_equal_the_rounded_float32_bit_for_bit(client, table):
    name, ids, f32 = table
    half = client.pull(name, ids, dtype=np.float16)
    assert half.dtype == np.float16 and half.shape == f32.shape
    assert np.array_equal(half.view(np.uint16), f32.astype(np.float16).view(np.uint16))
    assert np.isinf(half).any(), "values beyond 65504 overflow to inf, as documented"
    # numpy has no bfloat16: "bfloat16" returns float32 holding the bf16 values exactly.
    widened = client.pull(name, ids, dtype="bfloat16")
    assert widened.dtype == np.float32
    want = (bf16_bits(f32).astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(widened.view(np.uint32), want.view(np.uint32))
    # Into a caller's float32 buffer (widened) and float16 buffer (raw).
    out = np.empty_like(f32)
    assert client.pull(name, ids, dtype=np.float16, out=out) is out
    assert np.array_equal(out, f32.astype(np.float16).astype(np.float32))
    out16 = np.empty(f32.shape, np.float16)
    client.pull(name, ids, dtype="float16", out=out16)
    assert np.array_equal(out16.view(np.uint16), f32.astype(np.float16).view(np.uint16))


def test_torch_forms_equal_torch_rounding(client, table):
    name, ids, f32 = table
    ref = torch.from_numpy(f32)
    for dtype in (torch.bfloat16, torch.float16):
        got = client.pull(name, ids, dtype=dtype)
        assert isinstance(got, torch.Tensor) and got.dtype == dtype
        assert torch.equal(got.view(torch.int16), ref.to(dtype).view(torch.int16)), dtype
        out = torch.empty(f32.shape, dtype=dtype)
        assert client.pull(name, ids, dtype=dtype, out=out) is out
        assert torch.equal(out.view(torch.int16), ref.to(dtype).view(torch.int16)), dtype
    assert torch.equal(client.pull(name, ids, dtype=torch.bfloat16).view(torch.int16),
                       torch.from_numpy(bf16_bits(f32).view(np.int16)))


def test_multi_and_async_forms(client, table):
    name, ids, f32 = table
    got = client.pull_multi({name: ids}, dtype=torch.bfloat16)[name]
    assert torch.equal(got, torch.from_numpy(f32).to(torch.bfloat16))
    h = client.pull_async(name, ids, dtype=np.float16)
    assert np.array_equal(h.result(), f32.astype(np.float16))
    h = client.pull_multi_async({name: ids}, dtype="bfloat16", read_only=True)
    assert np.array_equal(h.result()[name], torch.from_numpy(f32).to(torch.bfloat16).float()
                          .numpy())


def test_compact_answer_carries_half_the_bytes(client, table):
    name, ids, _ = table
    uniq = np.unique(ids)
    m = client.shard_map
    pods = m.pods_of(name, uniq)
    address = m.addresses[pods[0]]
    mine = uniq[pods == pods[0]]
    req = ps_pb2.PullRequest(epoch=m.epoch, read_only=True)
    req.tables.add(table=name, ids=mine.astype("<i8").tobytes())
    full = client.raw_call(address, "Pull", req).tables[0].values
    req.value_type = ps_pb2.BFLOAT16
    compact = client.raw_call(address, "Pull", req).tables[0].values
    assert len(full) == len(mine) * DIM * 4
    assert len(compact) * 2 == len(full)
    f = np.frombuffer(full, "<f4")
    assert np.array_equal(np.frombuffer(compact, "<u2"), bf16_bits(f))


def test_bad_dtype_and_out(client, table):
    name, ids, f32 = table
    with pytest.raises(ValueError, match="dtype"):
        client.pull(name, ids, dtype=np.int32)
    with pytest.raises(ValueError, match="16-bit"):
        client.pull(name, ids, dtype=np.float16, out=np.empty(f32.shape, np.float64))
    with pytest.raises(ValueError, match="float32"):
        client.pull(name, ids, out=np.empty(f32.shape, np.float16))  # a float32 pull


@pytest.mark.parametrize("pull_dtype", [torch.bfloat16, torch.float16])
def test_module_pull_dtype_computes_in_float32_on_rounded_rows(client, pull_dtype):
    """The forward equals nn.EmbeddingBag's over the rounded rows, in float32; the
    gradient pushed is float32 (SGD lr 1 moves each row by exactly -grad)."""
    name = f"compact_bag_{str(pull_dtype)[6:]}"
    bag = PsEmbeddingBag(client, name, 4, mode="sum", optimizer="sgd", learning_rate=1.0,
                         pull_dtype=pull_dtype)
    opt = PsOptimizer(bag)
    rng = np.random.default_rng(4)
    ids = rng.choice([3, 5, 1 << 40, -9, 77], size=(5, 3))
    uniq = np.unique(ids)
    before = client.pull(name, uniq)
    ref = torch.nn.EmbeddingBag(len(uniq), 4, mode="sum")
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(before).to(pull_dtype).float())
    compact = torch.from_numpy(np.searchsorted(uniq, ids))
    out = bag(torch.from_numpy(ids))
    assert out.dtype == torch.float32
    expect = ref(compact)
    torch.testing.assert_close(out, expect, rtol=0, atol=0)
    weights = torch.from_numpy(rng.standard_normal((5, 4)).astype(np.float32) * 1e-3)
    (out * weights).sum().backward()
    (expect * weights).sum().backward()
    assert opt.step() == {name: len(uniq)}
    after = client.pull(name, uniq)
    np.testing.assert_allclose(after - before, -ref.weight.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_collection_pull_dtype(client):
    name = "compact_ebc"
    ebc = PsEmbeddingBagCollection(client, [PsEmbeddingBagConfig(
        name, 3, "sum", ["f"], optimizer="sgd", learning_rate=1.0)], pull_dtype=torch.bfloat16)
    assert ebc.pull_dtype == torch.bfloat16
    from elastic_ps.torch_modules import KeyedJagged
    ids = torch.tensor([4, 8, 4, 15], dtype=torch.int64)
    kj = KeyedJagged.from_offsets({"f": (ids, torch.tensor([0, 2]))})
    with torch.no_grad():
        out = ebc(kj)["f"]
    rows = client.pull(name, ids.numpy(), read_only=True, dtype="bfloat16")
    torch.testing.assert_close(out, torch.from_numpy(
        np.stack([rows[0] + rows[1], rows[2] + rows[3]])), rtol=0, atol=0)
    with pytest.raises(ValueError, match="pull_dtype"):
        PsEmbeddingBagCollection(client, [PsEmbeddingBagConfig(name, 3, "sum", ["f"])],
                                 pull_dtype=torch.int8)


def test_create_table_lifecycle_arguments_reach_the_pods(client):
    spec = client.create_table("life_args", 8, optimizer="sgd", admit_after=3, ttl_s=3600,
                               max_rows=1000000, eviction="lru", clip_value=5.0, clip_norm=10.0)
    assert spec.admission.min_count == 3
    assert spec.eviction.ttl_seconds == 3600 and spec.eviction.max_rows == 1000000
    assert spec.eviction.policy == ps_pb2.EvictionSpec.LRU
    assert spec.clip_value == 5.0 and spec.clip_norm == 10.0
    described = [t.spec for d in client.describe().values() for t in d.tables
                 if t.spec.name == "life_args"]
    assert len(described) == len(client.shard_map.addresses)
    assert all(s == spec for s in described)
    # The same arguments again: idempotent (the pods compare the normalized specs).
    assert client.create_table("life_args", 8, optimizer="sgd", admit_after=3, ttl_s=3600,
                               max_rows=1000000, eviction="lru", clip_value=5.0,
                               clip_norm=10.0) == spec
    plain = client.create_table("life_plain", 8, optimizer="sgd", admit_after=1)
    assert not plain.HasField("admission") and not plain.HasField("eviction")


def test_lifecycle_arguments_are_checked():
    assert table_spec("t", 4, max_rows=10).eviction.policy == ps_pb2.EvictionSpec.LFU
    for bad in (dict(admit_after=-1), dict(ttl_s=1.5), dict(max_rows=True),
                dict(eviction="fifo", ttl_s=5), dict(eviction="lfu")):
        with pytest.raises(ValueError):
            table_spec("t", 4, **bad)



# ---- read-only pulls served by followers (issue 16, with --replication=2) ----


@pytest.fixture
def replicated(tmp_path):
    """Two durable pods under ps-master --replication=2 (each follows the other's vshards),
    with a master lease (30 s) long enough that a stopped pod is not failed over during the
    test (>= 20 s after it stops): only the client's fallback can serve its vshards then."""
    from conftest import Cluster
    c = Cluster(tmp_path, num_ps=2, lease_ms=30000, master_args=["--replication=2"])
    try:
        c.start()
        yield c
    finally:
        for p in c.pods:  # a stopped pod must run again to stop
            if p.popen is not None and p.popen.poll() is None:
                os.kill(p.popen.pid, signal.SIGCONT)
        c.stop()


def test_read_only_pull_falls_back_to_a_follower(replicated):
    with PsClient(master=replicated.master.address, worker_id=12, incarnation=1) as setup:
        # The first pod's first assignment names its follower before that one registered
        # (no address); it learns the address at its next heartbeat (lease / 3). Until
        # both pods are at the same epoch a push would wait for a follower it cannot reach.
        deadline = time.monotonic() + 120
        while True:
            epochs = [d.epoch for d in setup.describe().values()]
            if len(epochs) == 2 and len(set(epochs)) == 1:
                break
            assert time.monotonic() < deadline, f"pods never agreed on an epoch: {epochs}"
            time.sleep(0.2)
        setup.create_table("replicated", 4, optimizer="sgd", learning_rate=1.0)
        ids = np.arange(0, 400, dtype=np.int64)
        # One push per pod (acknowledged once both copies hold it). A push of one key
        # spanning both pods deadlocks under mutual followers today: each pod's follower
        # side finds the key "being applied" by that pod's own part (an issue-16 bug).
        pods = setup.shard_map.pods_of("replicated", ids)
        for p in np.unique(pods):
            part = ids[pods == p]
            setup.push("replicated", part, np.ones((len(part), 4), np.float32))
        want = setup.pull("replicated", ids, read_only=True)
    # A reader that gives up on a silent pod soon (the fallback comes after one attempt),
    # and a trainer that gives up at once; both connected before the pod stops.
    with PsClient(master=replicated.master.address, worker_id=13, incarnation=1,
                  deadline_s=3.0, max_attempts=2) as c, \
            PsClient(master=replicated.master.address, worker_id=14, incarnation=1,
                     deadline_s=1.0, max_attempts=1) as trainer:
        m = c.shard_map
        stopped = replicated.pods[0]
        down = m.pod_ids.index("ps-0")
        on_stopped = ids[m.pods_of("replicated", ids) == down]
        assert 0 < len(on_stopped) < len(ids)
        os.kill(stopped.popen.pid, signal.SIGSTOP)
        try:
            before = c.client_stats()["read_fallbacks"]
            got = c.pull("replicated", ids, read_only=True)
            assert np.array_equal(got, want)  # the follower's rows are the primary's
            compact = c.pull("replicated", ids, read_only=True, dtype=torch.bfloat16)
            assert torch.equal(compact, torch.from_numpy(want).to(torch.bfloat16))
            assert c.client_stats()["read_fallbacks"] >= before + 2
            # A training pull may create rows: the primary's alone, which does not answer.
            with pytest.raises(PsError):
                trainer.pull("replicated", on_stopped)
        finally:
            os.kill(stopped.popen.pid, signal.SIGCONT)
