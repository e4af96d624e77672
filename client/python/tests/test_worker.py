"""Worker against a real ps-master (+ pods): registration, tasks, reports, lost workers,
SIGTERM."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from elastic_ps import PsError, Worker
from elastic_ps._stubs import master_pb2
from elastic_ps.worker import TaskLostError

pytestmark = pytest.mark.integration
HERE = Path(__file__).resolve().parent


def spawn(cluster, job, mode, *extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.Popen([sys.executable, str(HERE / "worker_proc.py"),
                             cluster.master.address, job, mode, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def read_until(proc, prefix, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(prefix):
            return line.split()
    raise AssertionError(f"no {prefix!r} from the worker; stderr:\n{proc.stderr.read()[-3000:]}")


def job_info(w):
    info = w.job_info()
    assert info is not None
    return info


def test_tasks_handed_out_and_reported(cluster):
    with Worker(cluster.master.address, "small") as w:
        assert w.worker_id > 0 and w.incarnation == 1 and w.lease_ms == cluster.lease_ms
        n = w.create_job(files=[("a", 100), ("b", 50)], epochs=2, records_per_task=40,
                         eval_files=[("e", 10)])
        assert n == w.create_job(files=[("a", 100), ("b", 50)], epochs=2, records_per_task=40,
                                 eval_files=[("e", 10)])  # idempotent
        with pytest.raises(PsError) as e:
            w.create_job(files=[("a", 1)], epochs=1, records_per_task=1)
        assert e.value.code == grpc.StatusCode.ALREADY_EXISTS
        seen = []
        for task in w.tasks():
            seen.append((task.kind, task.epoch, task.file, task.first_record, task.end_record))
            assert task.attempt == 1
            with w.task_scope(task) as t:
                t.table_pushes = {"emb": 2}
        assert len(seen) == n == 2 * (3 + 2 + 1)
        assert seen[0][:2] == ("train", 0) and ("eval", 0, "e", 0, 10) in seen
        # every record of every epoch exactly once
        for epoch in range(2):
            ranges = sorted((f, a, b) for k, ep, f, a, b in seen if ep == epoch and k == "train")
            assert ranges == [("a", 0, 40), ("a", 40, 80), ("a", 80, 100), ("b", 0, 40),
                              ("b", 40, 50)]
        info = job_info(w)
        assert info.state == master_pb2.JobInfo.SUCCEEDED and info.tasks_done == n
        assert info.train_records_done == 300
        assert {t.name: t.version for t in w.status().tables}["emb"] == 2 * n


def test_failed_task_is_retried(cluster):
    with Worker(cluster.master.address, "flaky") as w:
        w.create_job(files=[("f", 10)], epochs=1, records_per_task=10)
        attempts = []
        for task in w.tasks():
            attempts.append(task.attempt)
            if task.attempt == 1:
                with pytest.raises(RuntimeError):
                    with w.task_scope(task):
                        raise RuntimeError("bad record")
            else:
                with w.task_scope(task):
                    pass
        assert attempts == [1, 2]
        assert job_info(w).state == master_pb2.JobInfo.SUCCEEDED
        # reporting it again with the same args: an accepted duplicate
        w.report(task)


@pytest.mark.lease_ms(1000)
def test_killed_worker_task_requeued(cluster):
    with Worker(cluster.master.address, "requeue") as w:
        w.create_job(files=[("f", 30)], epochs=1, records_per_task=10)
        proc = spawn(cluster, "requeue", "hold")
        try:
            held = int(read_until(proc, "HOLDING")[1])
            time.sleep(cluster.lease_ms / 1000 * 1.5)  # heartbeats keep it alive
            doing = [t for t in w.status().doing_tasks if t.job == "requeue"]
            assert [t.task_id for t in doing] == [held]
            proc.kill()
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        attempts = {}
        for task in w.tasks():  # waits for the lease to expire, then gets the held task
            attempts[task.task_id] = task.attempt
            w.report(task)
        assert attempts[held] == 2 and len(attempts) == 3
        assert job_info(w).state == master_pb2.JobInfo.SUCCEEDED


def test_sigterm_finishes_task_and_leaves(cluster):
    with Worker(cluster.master.address, "preempt") as w:
        w.create_job(files=[("f", 100)], epochs=1, records_per_task=10)
        proc = spawn(cluster, "preempt", "sigterm", "0.3")
        try:
            wid = int(read_until(proc, "WORKER")[1])
            read_until(proc, "DONE")
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err[-3000:]
        assert out.rstrip().endswith("LEFT")
        done_by_it = 1 + out.count("DONE ")
        st = w.status()
        me = {x.worker_id: x for x in st.workers}[wid]
        assert me.state == master_pb2.WorkerInfo.LEFT and me.tasks_doing == 0
        assert not [t for t in st.doing_tasks if t.worker_id == wid]
        info = job_info(w)
        assert info.tasks_done == done_by_it < 10  # stopped early, every task reported
        for task in w.tasks():
            w.report(task)
        assert job_info(w).state == master_pb2.JobInfo.SUCCEEDED


@pytest.mark.lease_ms(1000)
def test_lost_lease_reregisters(cluster):
    w = Worker(cluster.master.address, "lease", heartbeat=False)
    try:
        w.create_job(files=[("f", 20)], epochs=1, records_per_task=10)
        task = next(iter(w.tasks()))
        time.sleep(cluster.lease_ms / 1000 * 2.5)  # no heartbeats: the lease expires
        with pytest.raises(TaskLostError):
            w.report(task)
        assert w.incarnation == 1
        got = []
        for t in w.tasks():  # re-registers as incarnation 2 and gets the re-queued task
            got.append(t.task_id)
            w.report(t)
        assert w.incarnation == 2 and w.reregistrations == 1
        assert sorted(got) == [0, 1]
        assert w.client.incarnation == 2  # push keys follow the new incarnation
    finally:
        w.leave()


def test_master_restart_mid_job(cluster):
    with Worker(cluster.master.address, "restart") as w:
        w.create_job(files=[("f", 60)], epochs=1, records_per_task=10)
        done = []
        for task in w.tasks():
            if len(done) == 2:
                cluster.restart_master()  # SIGKILL; same port and data dir
            w.report(task)
            done.append(task.task_id)
        assert sorted(done) == list(range(6))
        info = job_info(w)
        assert info.state == master_pb2.JobInfo.SUCCEEDED and info.train_records_done == 60


@pytest.mark.lease_ms(1000)
def test_heartbeat_thread_reregisters_after_a_stall(cluster):
    with Worker(cluster.master.address, "stall") as w:
        w.create_job(files=[("f", 10)], epochs=1, records_per_task=10)
        task = w.get_task()
        stall_s = cluster.lease_ms / 1000 * 2.5
        w._pause_heartbeats_for_test(stall_s)  # no heartbeat goes out: a stalled process
        time.sleep(stall_s)
        deadline = time.monotonic() + 5
        while w.incarnation == 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert w.incarnation == 2 and w.reregistrations == 1
        with pytest.raises(TaskLostError):
            w.report(task)
        again = w.get_task()
        assert again.task_id == task.task_id and again.attempt == 2
        w.report(again)
        assert job_info(w).state == master_pb2.JobInfo.SUCCEEDED
