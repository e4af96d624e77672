"""End to end: DeepFM trained asynchronously by two worker processes (examples/
train_worker.py) against a real master and two durable pods, compared with the
single-process torch.nn.EmbeddingBag baseline (examples/baseline.py) on the same data.

- Without failures: the job succeeds, every training record of the epoch is trained
  exactly once (the accepted task reports tile every file; the master's records_done is
  the epoch's size), and the held-out AUC is within 0.01 of the baseline's (the issue's
  bound; measured gaps are 0.0000-0.0015 since DeepFM standardizes its dense inputs and
  tasks train in balanced minibatches, see docs/training.md, "AUC and asynchrony").
- A worker SIGKILLed mid-task: its task is handed out again after its lease expires, the
  job still succeeds, and every record is trained at least once (exactly once in the
  master's accounting, which counts accepted reports only). Another worker gets SIGTERM:
  it finishes and reports its task, leaves, and exits 0.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYROOT = os.path.dirname(HERE)
EXAMPLES = os.path.join(PYROOT, "examples")
sys.path.insert(0, PYROOT)
sys.path.insert(0, EXAMPLES)

from elastic_ps import synth  # noqa: E402

pytestmark = pytest.mark.integration

RECORDS = 60_000
HOLDOUT = 20_000
PER_TASK = 5_000
AUC_TOLERANCE = 0.01


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("data")
    return synth.generate(str(out), records=RECORDS, files=2, seed=11, holdout=HOLDOUT)


@pytest.fixture(scope="module")
def baseline(data):
    import torch

    import baseline as bl
    import deepfm

    torch.set_num_threads(1)
    files = [(e["path"], e["records"]) for e in data["files"]]
    prepared = bl.prepare(files, data["holdout"]["path"], deepfm.input_stats(data))
    # The mean over a few initial states, so one lucky or unlucky seed does not decide.
    runs = [bl.train_baseline(files, data["holdout"]["path"], seed=s, log=lambda m: None,
                              prepared=prepared, task_records=PER_TASK)
            for s in range(3)]
    return {"auc": sum(r["auc"] for r in runs) / len(runs),
            "aucs": [r["auc"] for r in runs]}


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [PYROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def _start_worker(master, job, manifest, tmp, name, extra=()):
    log = open(tmp / f"{name}.log", "ab")
    p = subprocess.Popen(
        [sys.executable, os.path.join(EXAMPLES, "train_worker.py"), f"--master={master}",
         f"--job={job}", f"--manifest={manifest}", f"--records_per_task={PER_TASK}",
         f"--eval_dir={tmp / 'eval'}", f"--trace={tmp / 'trace.jsonl'}", f"--name={name}",
         "--log_every_s=2", *extra],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env())
    log.close()
    return p


def _manifest(data, tmp):
    path = tmp / "manifest.json"
    path.write_text(json.dumps(data))
    return str(path)


def _trace(tmp):
    with open(tmp / "trace.jsonl") as f:
        return [json.loads(line) for line in f]


def _job(master, job):
    import grpc

    from elastic_ps._stubs import master_pb2, master_pb2_grpc

    stub = master_pb2_grpc.MasterStub(grpc.insecure_channel(master))
    st = stub.Status(master_pb2.StatusRequest(), timeout=5)
    return next(j for j in st.jobs if j.name == job)


def _wait(procs, tmp, timeout):
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            logs = "\n".join(f.read_text(errors="replace")[-3000:]
                             for f in tmp.glob("w*.log"))
            pytest.fail(f"workers did not finish in {timeout} s:\n{logs}")


def _coverage(trace, data):
    """{path: [count per record]} of the accepted training reports."""
    counts = {e["path"]: [0] * e["records"] for e in data["files"]}
    for t in trace:
        if t["kind"] != "train":
            continue
        assert t["records"] == t["end"] - t["first"]
        c = counts[t["file"]]
        for i in range(t["first"], t["end"]):
            c[i] += 1
    return counts


def _auc(tmp):
    from evaluate import from_eval_dir

    from elastic_ps.metrics import auc

    labels, probs = from_eval_dir(str(tmp / "eval"))
    assert len(labels) == HOLDOUT
    return auc(labels, probs)


def test_two_workers_train_every_record_once_and_match_the_baseline(cluster, data, baseline,
                                                                    tmp_path):
    master = cluster.master.address
    manifest = _manifest(data, tmp_path)
    procs = [_start_worker(master, "e2e", manifest, tmp_path, f"w{i}") for i in range(2)]
    _wait(procs, tmp_path, timeout=150)
    assert all(p.returncode == 0 for p in procs)

    job = _job(master, "e2e")
    assert job.state == 2, job  # SUCCEEDED
    assert job.tasks_failed == 0
    assert job.train_records_total == RECORDS
    assert job.train_records_done == RECORDS
    assert job.eval_records_done == HOLDOUT
    trace = _trace(tmp_path)
    train = [t for t in trace if t["kind"] == "train"]
    assert len(train) == RECORDS // PER_TASK
    assert len({t["task_id"] for t in train}) == len(train)
    for path, c in _coverage(trace, data).items():
        assert set(c) == {1}, f"{path}: records not trained exactly once"
    assert len({t["worker"] for t in train}) == 2  # both workers trained

    auc_ps = _auc(tmp_path)
    print(f"AUC: PS {auc_ps:.4f}, baseline {baseline['auc']:.4f} (seeds: "
          f"{', '.join(f'{a:.4f}' for a in baseline['aucs'])})")
    assert baseline["auc"] > 0.65  # the model learns
    # Two asynchronous workers read parameters about one update stale (p99 2-3, max up to
    # 10 on a busy machine); with standardized inputs that costs this model about 0.001
    # AUC here (docs/training.md, "AUC and asynchrony"); the baseline's seeds spread 0.0014.
    assert abs(auc_ps - baseline["auc"]) < AUC_TOLERANCE, (auc_ps, baseline["auc"])

    # The model on the PS, evaluated directly (read-only pulls), is the one the eval tasks
    # saw: training had ended before them.
    import deepfm
    from evaluate import from_ps

    from elastic_ps.metrics import auc

    labels, probs = from_ps(master, data["holdout"]["path"], deepfm.input_stats(data))
    assert abs(auc(labels, probs) - auc_ps) < 1e-4


@pytest.mark.lease_ms(1000)
def test_sigkilled_worker_task_is_retrained(cluster, data, tmp_path):
    master = cluster.master.address
    manifest = _manifest(data, tmp_path)
    victim = _start_worker(master, "e2e-kill", manifest, tmp_path, "w-victim",
                           extra=["--hang_after_tasks=1"])
    log = tmp_path / "w-victim.log"
    # Kill it holding its second task, after its first accepted report: it takes that
    # task and stops (--hang_after_tasks), so the kill never races the task's report.
    deadline = time.monotonic() + 60
    while "holding task" not in (log.read_text(errors="replace") if log.exists() else ""):
        assert victim.poll() is None, log.read_text(errors="replace")
        assert time.monotonic() < deadline, "the victim never held a second task"
        time.sleep(0.1)
    assert "train task" in log.read_text(errors="replace")
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    procs = [_start_worker(master, "e2e-kill", manifest, tmp_path, f"w{i}") for i in range(3)]
    # SIGTERM the first survivor that finishes a task: it finishes the task it holds then,
    # reports it, leaves and exits 0; the others finish the job.
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    deadline = time.monotonic() + 90
    target = None
    while target is None:
        for i, f in enumerate(logs):
            if f.exists() and "train task" in f.read_text(errors="replace"):
                target = i
                break
        else:
            assert time.monotonic() < deadline, "no survivor finished a task"
            time.sleep(0.05)
    assert procs[target].poll() is None, "the SIGTERM target ended before it was signalled"
    os.kill(procs[target].pid, signal.SIGTERM)
    _wait(procs, tmp_path, timeout=150)
    assert all(p.returncode == 0 for p in procs)
    assert "stopped (SIGTERM)" in logs[target].read_text()

    job = _job(master, "e2e-kill")
    assert job.state == 2, job
    assert job.tasks_failed == 0
    assert job.train_records_done == RECORDS  # accepted reports count once
    trace = _trace(tmp_path)
    counts = _coverage(trace, data)
    for path, c in counts.items():
        assert min(c) >= 1, f"{path}: records never trained"
    # The killed worker's task shows up as a re-run (attempt 2) by a survivor.
    assert any(t["attempt"] >= 2 for t in trace if t["kind"] == "train"), trace
    assert _auc(tmp_path) > 0.6
