"""PsClient against real ps-master + ps-server processes on loopback."""

import threading
import time

import grpc
import numpy as np
import pytest

from conftest import NUM_VSHARDS, Proc, binary
from elastic_ps import PsClient, PsError, TableConflictError, routing
from elastic_ps._stubs import ps_pb2

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(shared_cluster):
    with PsClient(master=shared_cluster.master.address, deadline_s=5) as c:
        yield c


def owned_bitmap(describe):
    bits = np.unpackbits(np.frombuffer(describe.owned_vshards, dtype=np.uint8), bitorder="little")
    return bits[:describe.num_vshards].astype(bool)


def test_map_matches_pod_ownership(client):
    m = client.shard_map
    assert m.num_vshards == NUM_VSHARDS and len(m.addresses) == 2 and m.epoch > 0
    for i, (address, d) in enumerate(client.describe().items()):
        assert address == m.addresses[i]
        assert np.array_equal(owned_bitmap(d), m.owner == i)


def test_routing_matches_pods_and_wrong_route_is_refused(client):
    client.create_table("route", 4, optimizer="sgd")
    ids = np.random.default_rng(3).integers(-(2**62), 2**62, size=20000)
    rows = client.pull("route", ids)  # every id to its owner: no FAILED_PRECONDITION
    assert rows.shape == (20000, 4) and rows.dtype == np.float32
    m = client.shard_map
    pods = m.pods_of("route", ids)
    for i, address in enumerate(m.addresses):
        mine = ids[pods == i]
        assert mine.size > 5000  # both pods own a fair share
        req = ps_pb2.PullRequest(epoch=m.epoch)
        req.tables.add(table="route", ids=mine.astype("<i8").tobytes())
        got = client.raw_call(address, "Pull", req)
        assert np.array_equal(np.frombuffer(got.tables[0].values, "<f4").reshape(-1, 4),
                              rows[pods == i])
        other = m.addresses[1 - i]
        with pytest.raises(PsError) as e:
            client.raw_call(other, "Pull", req)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert e.value.wrong_shard is not None  # from the refusal's detail, not its text
        epoch, vshard = e.value.wrong_shard
        assert epoch <= m.epoch and m.owner[vshard] == i


def test_pull_is_stable_and_sgd_push_is_exact(client):
    client.create_table("sgd", 8, optimizer="sgd", learning_rate=1.0)
    ids = np.array([5, 9, 5, -3, 2**40, 9, 5])
    before = client.pull("sgd", ids)
    assert np.array_equal(before, client.pull("sgd", ids))
    assert np.array_equal(before[0], before[2]) and np.array_equal(before[1], before[5])
    assert np.all(before != 0)  # normal initializer
    grads = np.arange(7 * 8, dtype=np.float32).reshape(7, 8) / 8
    client.push("sgd", ids, grads)  # table lr 1.0
    after = client.pull("sgd", ids)
    # duplicates summed: id 5 at rows 0, 2, 6; id 9 at rows 1, 5
    expected = {5: grads[0] + grads[2] + grads[6], 9: grads[1] + grads[5], -3: grads[3],
                2**40: grads[4]}
    for k, i in enumerate(ids):
        assert np.array_equal(after[k], before[k] - expected[int(i)]), k
    # learning_rate override
    client.push("sgd", [-3], np.ones((1, 8)), learning_rate=0.5)
    assert np.array_equal(client.pull("sgd", [-3])[0], after[3] - 0.5)


def test_duplicate_gradients_are_summed_in_order(client):
    # Singles, short runs and long runs (a hot id), shuffled: each id's update is the sum of
    # its gradients (was a unit test of the Python de-duplication, now the C++ client's).
    client.create_table("dupsum", 5, optimizer="sgd", learning_rate=1.0, initializer="zeros")
    rng = np.random.default_rng(5)
    ids = np.concatenate([rng.integers(0, 10**6, 3000), rng.integers(0, 50, 2000),
                          np.full(300, 7), np.full(40, -1)])
    rng.shuffle(ids)
    grads = rng.standard_normal((ids.shape[0], 5)).astype(np.float32)
    client.push("dupsum", ids, grads)
    uniq, inverse = np.unique(ids, return_inverse=True)
    expected = np.zeros((uniq.shape[0], 5), np.float32)
    np.add.at(expected, inverse, grads)
    np.testing.assert_allclose(client.pull("dupsum", uniq), -expected, rtol=1e-5, atol=1e-5)


def test_read_only_pull_does_not_create_rows(client):
    client.create_table("ro", 2, optimizer="sgd")
    rows_before = sum(t.rows for d in client.describe().values() for t in d.tables
                      if t.spec.name == "ro")
    v = client.pull("ro", np.arange(100, 200), read_only=True)
    rows_after = sum(t.rows for d in client.describe().values() for t in d.tables
                     if t.spec.name == "ro")
    assert rows_before == rows_after == 0
    assert np.array_equal(v, client.pull("ro", np.arange(100, 200)))  # same initial values


def test_multi_table(client):
    client.create_table("mt_a", 4, optimizer="sgd", learning_rate=1.0)
    client.create_table("mt_b", 16, optimizer="sgd", learning_rate=1.0, initializer="zeros")
    ia, ib = np.arange(50), np.arange(1000, 1300)
    got = client.pull_multi({"mt_a": ia, "mt_b": ib})
    assert got["mt_a"].shape == (50, 4) and got["mt_b"].shape == (300, 16)
    assert not got["mt_b"].any()
    client.push_multi({"mt_a": (ia, np.ones((50, 4))), "mt_b": (ib, np.full((300, 16), 2.0))})
    again = client.pull_multi({"mt_a": ia, "mt_b": ib})
    assert np.array_equal(again["mt_a"], got["mt_a"] - 1)
    assert np.all(again["mt_b"] == -2)
    assert client.pull_multi({"mt_a": []})["mt_a"].shape == (0, 4)


def test_dense(client):
    client.create_dense("dense_w", (3, 5), optimizer="sgd", learning_rate=1.0,
                        initializer="constant", value=2.0)
    client.create_dense("dense_b", 7, optimizer="sgd", learning_rate=1.0, initializer="zeros")
    got = client.pull_dense(["dense_w", "dense_b"])
    assert got["dense_w"].shape == (3, 5) and np.all(got["dense_w"] == 2)
    assert got["dense_b"].shape == (7,) and not got["dense_b"].any()
    g = np.arange(15, dtype=np.float32).reshape(3, 5)
    client.push_dense({"dense_w": g, "dense_b": np.ones(7)})
    got = client.pull_dense(["dense_w", "dense_b"])
    assert np.array_equal(got["dense_w"], 2 - g) and np.all(got["dense_b"] == -1)
    with pytest.raises(ValueError):
        client.push_dense({"dense_w": np.ones(14)})


def test_create_is_idempotent_and_conflicts_raise(client):
    a = client.create_table("idem", 4, optimizer="adam", learning_rate=0.01)
    b = client.create_table("idem", 4, optimizer="adam", learning_rate=0.01)
    assert a == b and a.optimizer.beta1 > 0  # normalized: defaults filled in
    assert "idem" in client.tables()
    with pytest.raises(TableConflictError) as e:
        client.create_table("idem", 8, optimizer="adam", learning_rate=0.01)
    assert e.value.code == grpc.StatusCode.ALREADY_EXISTS
    spec = ps_pb2.TableSpec(name="from_spec", dim=3)
    spec.optimizer.kind = ps_pb2.OptimizerSpec.SGD
    assert client.create_table(spec).dim == 3
    with pytest.raises(ValueError):
        client.create_table("bad", 4, optimizer="nope")
    with pytest.raises(ValueError):
        client.create_table("bad", 4, colour=3)
    with pytest.raises(PsError) as e:
        client.create_table("bad", 0)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_push_key_applied_once(client):
    client.create_table("dedup", 4, optimizer="sgd", learning_rate=1.0, initializer="zeros")
    m = client.shard_map
    pod = int(m.pods_of("dedup", [77])[0])
    key = client.next_push_key()
    req = ps_pb2.PushRequest(epoch=m.epoch, key=key)
    req.tables.add(table="dedup", ids=np.array([77], "<i8").tobytes(),
                   grads=np.ones(4, "<f4").tobytes())
    first = client.raw_call(m.addresses[pod], "Push", req)
    second = client.raw_call(m.addresses[pod], "Push", req)
    assert not first.duplicate and second.duplicate
    assert np.all(client.pull("dedup", [77]) == -1)


def test_bad_input(client):
    client.create_table("errs", 4, optimizer="sgd")
    with pytest.raises(PsError) as e:
        client.pull("no_such_table", [1])
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(ValueError):
        client.push("errs", [1, 2], np.ones((2, 3)))
    with pytest.raises(ValueError):
        client.push("errs", [1, 2], np.ones((3, 4)))
    with pytest.raises(ValueError):
        client.pull("errs", [1.5])
    with pytest.raises(ValueError):
        client.push("errs", [1], np.ones((1, 4)), learning_rate=-1)
    bad = np.ones((2, 4), np.float32)
    bad[1, 2] = np.nan
    before = client.pull("errs", [1, 2])
    with pytest.raises(PsError) as e:
        client.push("errs", [1, 2], bad)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "non-finite" in e.value.message
    assert np.array_equal(client.pull("errs", [1, 2]), before)
    # the pod refuses it too (sent as is)
    m = client.shard_map
    req = ps_pb2.PushRequest(epoch=m.epoch, key=client.next_push_key())
    req.tables.add(table="errs", ids=np.array([1], "<i8").tobytes(),
                   grads=np.array([0, np.inf, 0, 0], "<f4").tobytes())
    with pytest.raises(PsError) as e:
        client.raw_call(m.addresses[int(m.pods_of("errs", [1])[0])], "Push", req)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT


def _master_stub(cluster):
    from elastic_ps._stubs import master_pb2_grpc

    return master_pb2_grpc.MasterStub(grpc.insecure_channel(cluster.master.address))


def _wait_live(master, pod_id, timeout_s=60):
    """Waits until the master lists `pod_id` LIVE (it registers after opening its port)."""
    from elastic_ps._stubs import master_pb2

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = master.Status(master_pb2.StatusRequest(), timeout=5)
        if any(p.pod_id == pod_id and p.state == master_pb2.PodInfo.LIVE for p in st.pods):
            return
        time.sleep(0.05)
    raise AssertionError(f"{pod_id} did not register in {timeout_s} s")


def test_stale_map_is_refreshed_and_rerouted_exactly_once(cluster):
    # The map changes under the client for real (live moves): the pods that gave vshards
    # away refuse the client's ids, the client refreshes its map and re-routes them.
    from elastic_ps._stubs import master_pb2

    master = _master_stub(cluster)
    with PsClient(master=cluster.master.address) as c:
        c.create_table("stale", 4, optimizer="sgd", learning_rate=1.0, initializer="zeros")
        ids = np.arange(1000)
        first = c.shard_map
        assert set(first.owner.tolist()) == {0, 1}
        # ps-1's vshards move to ps-0; the client still routes half the ids to ps-1.
        master.Drain(master_pb2.DrainRequest(pod_id="ps-1"), timeout=120)
        c.push("stale", ids, np.ones((1000, 4)))
        drained = c.shard_map
        assert drained.epoch > first.epoch  # refreshed
        assert set(drained.owner.tolist()) == {0}
        # A new pod ps-2 takes half of them; the client still routes every id to ps-0.
        cluster.pods.append(cluster.start_pod(2))
        _wait_live(master, "ps-2")
        master.Rebalance(master_pb2.RebalanceRequest(), timeout=120)
        assert np.all(c.pull("stale", ids) == -1)  # applied exactly once
        assert c.shard_map.epoch > drained.epoch
        assert len(set(c.shard_map.owner.tolist())) == 2
        stats = c.stats()
        assert sum(s["rejected_wrong_shard"] for s in stats.values()) >= 2


def test_stats(client):
    s = client.stats()
    assert set(s) == set(client.shard_map.addresses)
    assert all(v["pull_requests"] > 0 for v in s.values())
    assert isinstance(client.stats(as_dict=False)[client.shard_map.addresses[0]],
                      ps_pb2.StatsResponse)


def test_threads_share_a_client(client):
    client.create_table("threads", 2, optimizer="sgd", learning_rate=1.0, initializer="zeros")
    errors = []

    def run(k):
        try:
            for _ in range(20):
                client.push("threads", [k, 1000], np.ones((2, 2)))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    rows = client.pull("threads", [0, 1, 2, 3, 1000])
    assert np.all(rows[:4] == -20) and np.all(rows[4] == -80)


def push_through(cluster, disturb):
    """Pushes +1 (SGD, lr 1) to 200 rows in a loop while `disturb()` runs, and 30 more
    pushes after it; returns the client, the push count and the count at the disturbance.
    Every push must succeed, and the rows must equal -count exactly."""
    c = PsClient(master=cluster.master.address, deadline_s=3)
    c.create_table("crash", 4, optimizer="sgd", learning_rate=1.0, initializer="zeros")
    ids = np.arange(200)
    pushes, errors, target = [0], [], [10**9]

    def pusher():
        try:
            while pushes[0] < target[0]:
                c.push("crash", ids, np.ones((200, 4)))
                pushes[0] += 1
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=pusher)
    t.start()
    time.sleep(0.3)
    at = pushes[0]
    try:
        disturb()
    finally:
        target[0] = at + 30  # keep pushing through the disturbance
        t.join(60)
    assert not t.is_alive() and not errors, errors
    n = pushes[0]
    assert at > 0 and n == at + 30, (at, n)
    rows = c.pull("crash", ids)
    assert np.all(rows == -n), (n, np.unique(rows))
    return c


def test_pod_killed_and_restarted_while_pushing(cluster):
    c = push_through(cluster, lambda: cluster.restart_pod(0))  # same id, port, data dir
    restarted = c.stats()[cluster.pods[0].address]
    assert restarted["recovered_rows"] + restarted["recovered_log_records"] > 0
    assert restarted["uptime_seconds"] < 10
    c.close()


@pytest.mark.lease_ms(1000)
def test_pod_moved_to_new_address_while_pushing(cluster):
    old = cluster.pods[0].address

    def move():
        cluster.pods[0].kill()
        cluster.pods[0] = cluster.start_pod(0, port=0)  # a new port: a new address

    c = push_through(cluster, move)
    new = cluster.pods[0].address
    assert new != old
    assert c.shard_map.addresses[c.shard_map.pod_ids.index("ps-0")] == new
    c.close()


def test_static_map_without_master(tmp_path):
    server = binary("ps-server", "PS_SERVER_BINARY")
    pods = []
    try:
        for i in range(2):
            pf = tmp_path / f"s{i}.port"
            pods.append(Proc(f"s{i}", [server, "--host=127.0.0.1", "--port=0",
                                       f"--port_file={pf}", f"--shard={i}/2",
                                       f"--num_vshards={NUM_VSHARDS}", "--shutdown_grace_ms=200"],
                             tmp_path / f"s{i}.log", pf).start())
        addrs = [p.address for p in pods]
        with PsClient(servers=addrs) as c:
            assert c.num_vshards == NUM_VSHARDS
            c.create_table("st", 4, optimizer="sgd", learning_rate=1.0, initializer="zeros")
            ids = np.arange(-500, 500)
            c.push("st", ids, np.ones((1000, 4)))
            assert np.all(c.pull("st", ids) == -1)
            assert np.array_equal(c.shard_map.owner, routing.static_owners(NUM_VSHARDS, 2))
        with pytest.raises(PsError) as e:  # listed in the wrong order
            PsClient(servers=addrs[::-1])
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        for p in pods:
            p.stop()


def test_pod_down_for_good_fails_after_the_attempts(cluster):
    with PsClient(master=cluster.master.address, max_attempts=3, deadline_s=2) as c:
        c.create_table("down", 4, optimizer="sgd")
        ids = np.arange(100)
        c.pull("down", ids)
        cluster.pods[1].kill()
        t = time.monotonic()
        with pytest.raises(PsError) as e:
            c.push("down", ids, np.ones((100, 4)))
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
        assert cluster.pods[1].address in e.value.message and "after 3 attempts" in e.value.message
        assert time.monotonic() - t < 10
        # the live pod's ids still work
        mine = ids[c.shard_map.pods_of("down", ids) == 0]
        assert c.pull("down", mine).shape == (mine.shape[0], 4)


def test_async_forms(client):
    client.create_table("async", 4, optimizer="sgd", learning_rate=1.0, initializer="zeros")
    futures = [client.push_async("async", [k, 99], np.ones((2, 4))) for k in range(8)]
    for f in futures:
        assert f.result(timeout=30) is None
    rows = client.pull_async("async", [0, 7, 99]).result(timeout=30)
    assert np.all(rows[:2] == -1) and np.all(rows[2] == -8)
    bad = client.push_async("async", [1], np.full((1, 4), np.nan))
    with pytest.raises(PsError):
        bad.result(timeout=30)
