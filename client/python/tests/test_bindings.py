"""The Python binding of the C++ client (elastic_ps._core) against one real pod: rows
written into caller-owned buffers, the GIL released during calls and waits, buffers kept
alive by asynchronous handles, done-callbacks, and the errors' codes.

A pod stopped with SIGSTOP holds a call in flight for as long as a test needs, whatever the
machine's speed: nothing here depends on timing.
"""

import gc
import os
import signal
import threading
import time
import weakref

import grpc
import numpy as np
import pytest

from conftest import Proc, binary
from elastic_ps import PsClient, PsError, TableConflictError

pytestmark = pytest.mark.integration

DIM = 8


@pytest.fixture(scope="module")
def pod(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pod")
    port_file = tmp / "ps.port"
    p = Proc("ps-server", [binary("ps-server", "PS_SERVER_BINARY"), "--host=127.0.0.1",
                           "--port=0", f"--port_file={port_file}", "--num_vshards=64",
                           "--shutdown_grace_ms=200"], tmp / "ps.log", port_file).start()
    yield p
    os.kill(p.popen.pid, signal.SIGCONT)  # in case a test stopped there
    p.stop()


@pytest.fixture(scope="module")
def client(pod):
    # A long deadline: a call to the stopped pod must wait for SIGCONT, not time out.
    with PsClient(servers=[pod.address], deadline_s=60, max_attempts=1) as c:
        c.create_table("rows", DIM, optimizer="sgd", learning_rate=1.0, initializer="normal",
                       seed=3)
        yield c


class Stopped:
    """SIGSTOP the pod for the block (calls to it stay in flight), SIGCONT after."""

    def __init__(self, pod):
        self.pid = pod.popen.pid

    def resume(self):
        os.kill(self.pid, signal.SIGCONT)

    def __enter__(self):
        os.kill(self.pid, signal.SIGSTOP)
        # The signal is delivered asynchronously: wait until every thread is stopped.
        _until(lambda: _stopped(self.pid), "the pod stopped")
        return self

    def __exit__(self, *exc):
        self.resume()


def _stopped(pid):
    """True once every thread of `pid` is stopped (state T)."""
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:  # a thread that just ended
            pass
    return all(s == "T" for s in states)


def _until(predicate, what, timeout_s=60):
    """Polls `predicate` (a bound on a test that went wrong, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.01)


# ---- buffers ----


def test_pull_writes_into_the_callers_buffer(client):
    ids = np.array([5, 9, 5, -3, 2**40])
    expected = client.pull("rows", ids)
    out = np.full((5, DIM), np.nan, np.float32)
    got = client.pull("rows", ids, out=out)
    assert got is out and np.array_equal(out, expected)
    assert np.array_equal(out[0], out[2])  # the duplicate copied
    h = client.pull_async("rows", ids, out=np.zeros((5, DIM), np.float32))
    assert np.array_equal(h.result(), expected)
    multi = {"rows": np.zeros((5, DIM), np.float32)}
    r = client.pull_multi({"rows": ids}, out=multi)
    assert r["rows"] is multi["rows"] and np.array_equal(r["rows"], expected)


def test_pull_into_a_torch_tensor(client):
    torch = pytest.importorskip("torch")
    ids = torch.tensor([1, 2, 3, 1])
    out = torch.zeros((4, DIM))
    client.pull("rows", ids.numpy(), out=out)
    assert np.array_equal(out.numpy(), client.pull("rows", [1, 2, 3, 1]))


@pytest.mark.parametrize("bad", [
    np.zeros((3, DIM), np.float64),            # dtype
    np.zeros((4, DIM), np.float32),            # rows
    np.zeros((3, DIM + 1), np.float32),        # dim
    np.zeros(3 * DIM, np.float32),             # 1-D
    np.zeros((3, 2 * DIM), np.float32)[:, ::2],  # not contiguous
    np.zeros((DIM, 3), np.float32).T,          # Fortran order
    [[0.0] * DIM] * 3,                         # a list: rows would land in a copy
])
def test_out_buffers_of_the_wrong_kind_are_refused(client, bad):
    with pytest.raises(ValueError):
        client.pull("rows", [1, 2, 3], out=bad)
    with pytest.raises(ValueError):
        client.pull_async("rows", [1, 2, 3], out=bad)


def test_read_only_out_buffer_is_refused(client):
    out = np.zeros((3, DIM), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        client.pull("rows", [1, 2, 3], out=out)


def test_ids_of_any_integer_array(client):
    expected = client.pull("rows", np.array([1, 2, 3], np.int64))
    for ids in ([1, 2, 3], np.array([1, 2, 3], np.int32), np.array([1, 2, 3], np.uint64),
                np.array([[1, 2, 3]]), np.repeat([1, 2, 3], 2)[::2]):  # 2-D; strided
        assert np.array_equal(client.pull("rows", ids), expected)
    assert np.array_equal(client.pull("rows", np.array([2**64 - 1], np.uint64)),
                          client.pull("rows", [-1]))
    for bad in ([1.5], np.array([True, False])):
        with pytest.raises(ValueError):
            client.pull("rows", bad)
    assert client.pull("rows", []).shape == (0, DIM)


def test_push_async_reads_its_arrays_before_returning(client):
    client.create_table("copied", 2, optimizer="sgd", learning_rate=1.0, initializer="zeros")
    ids, grads = np.array([1, 2]), np.ones((2, 2), np.float32)
    h = client.push_async("copied", ids, grads)
    ids[:] = 7
    grads[:] = 100
    h.result()
    assert np.array_equal(client.pull("copied", [1, 2, 7]), [[-1, -1], [-1, -1], [0, 0]])


class Buffer(np.ndarray):
    """An ndarray that can be watched with a weak reference."""


def test_dropped_handle_keeps_its_buffers_until_the_rows_land(client, pod):
    ids = np.arange(100, 200)
    expected = client.pull("rows", ids)
    landed = []
    done = threading.Event()

    def on_done(handle):
        landed.append((threading.current_thread().name, handle.result().copy()))
        done.set()

    with Stopped(pod) as stopped:
        out = np.zeros((100, DIM), np.float32).view(Buffer)
        watch_out = weakref.ref(out)
        client.pull_async("rows", ids.copy(), out=out).add_done_callback(on_done)
        silent = np.zeros((100, DIM), np.float32).view(Buffer)
        watch_silent = weakref.ref(silent)
        client.pull_async("rows", ids.copy(), out=silent)  # no callback: dropped at once
        del out, silent
        gc.collect()
        # The caller holds nothing; the calls do.
        assert watch_out() is not None and watch_silent() is not None
        assert not done.is_set()
        stopped.resume()
        assert done.wait(60)
    (thread, rows), = landed
    assert thread == "elastic_ps-callbacks" and np.array_equal(rows, expected)

    def released():
        gc.collect()
        return watch_silent() is None and watch_out() is None

    _until(released, "buffers released once their calls are done")


def test_done_callbacks(client):
    seen = []
    h = client.pull_async("rows", [1])
    h.result()
    h.add_done_callback(lambda x: seen.append(("at once", threading.current_thread().name, x)))
    assert seen == [("at once", threading.current_thread().name, h)]

    def boom(_):
        raise RuntimeError("a callback that fails is logged, not raised")

    h2 = client.pull_async("rows", [2])
    h2.add_done_callback(boom)
    h2.add_done_callback(lambda x: seen.append(("later", x)))
    h2.result()
    _until(lambda: len(seen) == 2, "the second callback ran")
    assert seen[1] == ("later", h2)


# ---- the GIL ----


def _count_then_resume(stopped, target, counter, started):
    """Counts to `target` in pure Python (it needs the GIL all along), then lets the pod go."""
    started.wait()
    while counter[0] < target:
        counter[0] += 1
    stopped.resume()


@pytest.mark.parametrize("form", ["pull", "wait", "result"])
def test_other_threads_run_during_a_long_call(client, pod, form):
    # The pod is stopped, so the call cannot finish until the other thread has counted to
    # the end and resumed the pod. Were the GIL held during the call, that thread could not
    # count, and the call would end only at its deadline (60 s), failed.
    ids = np.arange(10)
    expected = client.pull("rows", ids)
    counter, started, target = [0], threading.Event(), 200_000
    with Stopped(pod) as stopped:
        t = threading.Thread(target=_count_then_resume, args=(stopped, target, counter, started))
        t.start()
        if form == "pull":
            started.set()
            rows = client.pull("rows", ids)
        else:
            h = client.pull_async("rows", ids)
            started.set()
            if form == "wait":
                assert h.wait()
            rows = h.result()
        t.join()
    assert counter[0] == target
    assert np.array_equal(rows, expected)


def test_result_timeout_while_the_call_runs(client, pod):
    with Stopped(pod):
        h = client.pull_async("rows", [1, 2])
        assert not h.done(), h.exception()
        assert h.running()
        assert h.wait(timeout=0.01) is False
        with pytest.raises(TimeoutError):
            h.result(timeout=0.01)
    assert h.wait() and h.done() and h.result().shape == (2, DIM)


# ---- errors ----


def test_errors_carry_their_status_codes(client):
    with pytest.raises(PsError) as e:
        client.pull("no_such_table", [1])
    assert e.value.code == grpc.StatusCode.NOT_FOUND and "no_such_table" in e.value.message
    h = client.pull_async("no_such_table", [1])
    assert h.done()
    assert isinstance(h.exception(), PsError) and h.exception().code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(PsError) as e:
        h.result()
    assert e.value.code == grpc.StatusCode.NOT_FOUND

    bad = np.ones((2, DIM), np.float32)
    bad[1, 3] = np.inf
    for push in (lambda: client.push("rows", [1, 2], bad),
                 lambda: client.push_async("rows", [1, 2], bad).result()):
        with pytest.raises(PsError) as e:
            push()
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "non-finite" in e.value.message and "id 2 element 3" in e.value.message

    with pytest.raises(TableConflictError) as e:
        client.create_table("rows", DIM + 1)
    assert e.value.code == grpc.StatusCode.ALREADY_EXISTS and isinstance(e.value, PsError)
    with pytest.raises(PsError) as e:
        client.create_table("zero_dim", 0)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(PsError) as e:
        client.pull_dense(["no_such_tensor"])
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_unreachable_pod_and_closed_client(pod, tmp_path):
    server = binary("ps-server", "PS_SERVER_BINARY")
    pf = tmp_path / "gone.port"
    gone = Proc("gone", [server, "--host=127.0.0.1", "--port=0", f"--port_file={pf}",
                         "--num_vshards=64"], tmp_path / "gone.log", pf).start()
    c = PsClient(servers=[gone.address], deadline_s=2, max_attempts=2)
    c.create_table("t", 2)
    gone.kill()
    with pytest.raises(PsError) as e:
        c.pull("t", [1])
    assert e.value.code == grpc.StatusCode.UNAVAILABLE and gone.address in e.value.message
    c.close()
    c.close()  # idempotent
    with pytest.raises(PsError) as e:
        c.pull("t", [1])
    assert e.value.code == grpc.StatusCode.CANCELLED


def test_close_waits_for_the_calls_in_flight(client, pod):
    c = PsClient(servers=[pod.address], deadline_s=60)
    with Stopped(pod) as stopped:
        h = c.pull_async("rows", [1, 2, 3])
        closer = threading.Thread(target=c.close)
        closer.start()
        stopped.resume()
        closer.join()
        assert h.done()  # close returned only once the call was done
    assert np.array_equal(h.result(), client.pull("rows", [1, 2, 3]))


# ---- identity and counters (PsClient::SetIdentity, client_stats) ----


def test_restarted_client_with_a_fixed_identity_loses_no_push(client, pod):
    """A process restarted with the same worker_id and the default incarnation: its push
    keys start from the clock, so the pod applies its pushes (none is answered
    `duplicate` and dropped)."""
    client.create_table("restart", 1, optimizer="sgd", learning_rate=1.0, initializer="zeros")
    for run in range(2):  # the first process, then its restart
        with PsClient(servers=[pod.address], worker_id=77, incarnation=1) as c:
            for _ in range(3):
                c.push("restart", [5], np.ones((1, 1), np.float32))
            stats = c.client_stats()
            assert stats["pushes"] == 3 and stats["push_rpcs"] == 3
            assert stats["duplicate_pushes"] == 0 and stats["reused_keys"] == 0
    # SGD, learning rate 1: each applied push subtracts 1.
    assert client.pull("restart", [5])[0, 0] == -6.0


def test_set_identity_and_counters(client, pod):
    with PsClient(servers=[pod.address], worker_id=5, incarnation=1) as c:
        assert (c.worker_id, c.incarnation) == (5, 1)
        before = c.next_push_key().sequence
        c.set_identity(5, 2)
        assert (c.worker_id, c.incarnation) == (5, 2)
        key = c.next_push_key()
        assert (key.worker_id, key.incarnation) == (5, 2) and key.sequence > before
        for bad in ((0, 1), (5, 0)):
            with pytest.raises(ValueError):
                c.set_identity(*bad)
        c.pull("rows", [1, 2])
        c.push("rows", [1], np.zeros((1, DIM), np.float32))
        stats = c.client_stats()
        assert stats["pulls"] == 1 and stats["pushes"] == 1
        assert set(stats) == {"pulls", "pushes", "push_rpcs", "duplicate_pushes", "reused_keys",
                              "retries", "map_refreshes", "reroutes", "read_fallbacks"}
