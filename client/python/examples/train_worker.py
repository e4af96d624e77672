"""A training worker: DeepFM on Criteo-format data against the parameter server.

    /usr/bin/python3 examples/train_worker.py --master HOST:PORT --job NAME \\
        --manifest DIR/manifest.json [--records_per_task N --epochs E] [--no_create]
        [--batch 256] [--eval_dir DIR] [--trace FILE] [--step_trace FILE]
        [--staleness 1] [--prefetch 1] [--dense_every 1] [--init_seed S] [--summary FILE]

Registers with the master, creates the job from the manifest (idempotent: every worker
may pass the same definition; ``--no_create`` only joins it), takes the model's input
standardization from the manifest (deepfm.input_stats), then takes tasks until the job
is done:

- train task: records [first, end) of its file in ``ceil(n / batch)`` minibatches of
  nearly equal size (criteo.batch_sizes, balanced); each step computes the loss on the
  batch's rows and pushes the row and dense gradients (asynchronous SGD: other workers
  push concurrently, the servers' Adagrad applies each push). Pipelined
  (elastic_ps.pipeline): the next batch's rows are pulled while this one computes
  (``--prefetch``), pushes are asynchronous with at most ``--staleness`` S steps in
  flight (a step sees all of this worker's updates but those of its S latest steps; 0:
  the unpipelined loop, exactly), the dense parameters are refreshed every
  ``--dense_every`` steps by a pull issued ahead. Every push of a task is acknowledged
  before the task is reported with its record count and pushes per table.
- eval task (after each epoch's training): predictions with read-only pulls, written to
  ``--eval_dir/epoch<E>-task<ID>.npz`` (labels, probabilities); examples/evaluate.py
  computes the AUC over them.

``--trace FILE`` appends one JSON line per task accepted by the master (task id, file,
range, records, kind, attempt, worker) for exactly-once accounting. ``--summary FILE``
writes one JSON object at the end: records trained, the training loops' seconds and CPU
seconds of the process (reading and parsing the data excluded, as baseline.py's figure
excludes its reading), the wall-clock seconds of the training tasks, records/s of both,
the pipeline settings, the most steps seen in flight, and the seconds the training thread
waited, by what for (benchmarks/train_throughput.sh reads it). Progress goes to stdout
every ``--log_every_s``. SIGTERM: finish the current task, report it, leave.
SIGKILL: the master re-queues the held task when the lease expires.
"""

import argparse
import json
import logging
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from elastic_ps import criteo, manifest  # noqa: E402
from elastic_ps.client import PsError  # noqa: E402
from elastic_ps.pipeline import TrainPipeline  # noqa: E402
from elastic_ps.worker import Worker  # noqa: E402

import deepfm  # noqa: E402


class Progress:
    """Prints a progress line every `every_s` seconds."""

    def __init__(self, name, every_s):
        self.name = name
        self.every_s = every_s
        self.last = time.time()
        self.records = 0
        self.losses = []
        self.total_records = 0

    def step(self, n, loss, task):
        self.records += n
        self.total_records += n
        self.losses.append(loss)
        now = time.time()
        if now - self.last >= self.every_s:
            print(f"{self.name}: task {task.task_id} (epoch {task.epoch}) "
                  f"{self.records / (now - self.last):.0f} records/s, "
                  f"loss {np.mean(self.losses):.4f}, {self.total_records} records trained",
                  flush=True)
            self.last, self.records, self.losses = now, 0, []


class Totals:
    """What the worker's training tasks took, for --summary."""

    def __init__(self):
        self.records = 0
        self.steps = 0
        # The training loops, reading and parsing excluded: their wall clock less the
        # reading's own CPU time (TrainPipeline.read_thread_seconds), so that the client's
        # threads working while the training thread reads count as training.
        self.train_seconds = 0.0
        self.train_cpu_seconds = 0.0  # the process's CPU time in them (all threads)
        self.read_seconds = 0.0  # wall clock of reading (other threads' work included)
        self.read_thread_seconds = 0.0  # the training thread's CPU time reading
        self.first = None  # time.time(): first training task taken, last one reported
        self.last = None


def train_task(task, model, ps_opt, batch, progress, steps=None, prefetch=True, totals=None):
    """Trains on the task's range; returns (records, {table: pushes}, mean loss). Every
    push is acknowledged when it returns. ``steps``: a list to append (step start, end
    of its ps_opt.step()) times to; ``totals``: a Totals to add the task's figures to."""
    model.train()
    ps_opt.take_pushes()
    records, losses = 0, []
    # Balanced minibatches: no small last batch whose noisy gradient takes a full step
    # (tasks of 10000 records in batches of 256 ended in a batch of 16: -0.003 AUC).
    data = (deepfm.to_tensors(b) for b in criteo.read_range(
        task.file, task.first_record, task.end_record, batch, balanced=True))
    pipe = TrainPipeline(ps_opt, prefetch=lambda b: model.prefetch(b[1]), enabled=prefetch)
    t_start, c_start = time.perf_counter(), time.process_time()
    for dense, cat, labels in pipe.run(data):
        t0 = time.time()
        loss = deepfm.loss_fn(model(dense, cat), labels)
        loss.backward()
        ps_opt.step()
        ps_opt.zero_grad()
        if steps is not None:
            steps.append((t0, time.time()))
        records += len(labels)
        losses.append(float(loss))
        progress.step(len(labels), losses[-1], task)
    if totals is not None:
        totals.records += records
        totals.steps += len(losses)
        totals.read_seconds += pipe.read_seconds
        totals.read_thread_seconds += pipe.read_thread_seconds
        totals.train_seconds += time.perf_counter() - t_start - pipe.read_thread_seconds
        totals.train_cpu_seconds += time.process_time() - c_start - pipe.read_thread_seconds
    return records, ps_opt.take_pushes(), float(np.mean(losses)) if losses else 0.0


def eval_task(task, model, eval_dir, dense_binder):
    """Predicts the task's range with read-only pulls; writes labels and probabilities."""
    dense_binder.pull()  # the newest dense parameters
    model.eval()
    labels, probs = [], []
    with torch.no_grad():
        for b in criteo.read_range(task.file, task.first_record, task.end_record, 4096):
            dense, cat, y = deepfm.to_tensors(b)
            probs.append(torch.sigmoid(model(dense, cat)).numpy())
            labels.append(b.labels)
    labels = np.concatenate(labels) if labels else np.zeros(0, np.float32)
    probs = np.concatenate(probs) if probs else np.zeros(0, np.float32)
    if eval_dir:
        os.makedirs(eval_dir, exist_ok=True)
        path = os.path.join(eval_dir, f"epoch{task.epoch}-task{task.task_id}.npz")
        tmp = f"{path}.{os.getpid()}.tmp.npz"
        np.savez(tmp, labels=labels, probs=probs, path=task.file,
                 first=task.first_record, end=task.end_record)
        os.replace(tmp, path)
    return len(labels)


DEFAULT_STALENESS = 1


def write_summary(path, totals, args, ps_opt):
    wall = (totals.last - totals.first) if totals.first and totals.last else 0.0
    out = {"records": totals.records, "steps": totals.steps,
           "train_seconds": round(totals.train_seconds, 3),
           "train_cpu_seconds": round(totals.train_cpu_seconds, 3),
           "read_seconds": round(totals.read_seconds, 3),
           "read_thread_seconds": round(totals.read_thread_seconds, 3),
           "wall_seconds": round(wall, 3),
           "records_per_s": totals.records / totals.train_seconds if totals.train_seconds
           else 0.0,
           "wall_records_per_s": totals.records / wall if wall else 0.0,
           "staleness": args.staleness, "prefetch": args.prefetch,
           "dense_every": args.dense_every, "batch": args.batch,
           "max_in_flight": ps_opt.sync.max_in_flight,
           "waited_seconds": {k: round(v, 3) for k, v in sorted(ps_opt.sync.waited.items())},
           "first_time": totals.first, "last_time": totals.last}
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--master", default=os.environ.get("PS_MASTER"),
                    help="master host:port (default: $PS_MASTER)")
    ap.add_argument("--job", required=True, help="job name")
    ap.add_argument("--manifest", required=True,
                    help="the job's manifest.json: creates the job (idempotent) and gives "
                    "the model's input standardization (dense_mean / dense_std)")
    ap.add_argument("--records_per_task", type=int, default=10000, help="with --manifest")
    ap.add_argument("--epochs", type=int, default=1, help="with --manifest")
    ap.add_argument("--no_eval", action="store_true", help="with --manifest: no eval files")
    ap.add_argument("--no_create", action="store_true",
                    help="join the job without creating it from the manifest")
    ap.add_argument("--batch", type=int, default=deepfm.BATCH, help="minibatch size")
    ap.add_argument("--admit_after", type=int, default=0,
                    help="admission: create an embedding row only at its id's N-th push "
                    "(0 or 1: at once); every worker of a job must pass the same")
    ap.add_argument("--staleness", type=int, default=DEFAULT_STALENESS,
                    help="S: pushes are asynchronous with at most S steps in flight, and a "
                    "step sees every update of this worker but those of its S latest steps "
                    "(0: synchronous, exactly the unpipelined loop)")
    ap.add_argument("--prefetch", type=int, choices=(0, 1), default=1,
                    help="1: pull the next batch's rows while this batch computes")
    ap.add_argument("--dense_every", "--pull_every", dest="dense_every", type=int, default=1,
                    help="refresh the dense parameters from the PS every this many steps "
                    "(the pull is issued ahead; --pull_every is the old name)")
    ap.add_argument("--eval_dir", help="where eval tasks write their predictions")
    ap.add_argument("--trace", help="append one JSON line per accepted task here")
    ap.add_argument("--step_trace", help="append one JSON line per training task here: the "
                    "wall-clock times of each step's start and end (staleness analysis)")
    ap.add_argument("--init_seed", type=int, default=0,
                    help="seed of the PS initializers (the same in every worker of a job)")
    ap.add_argument("--summary", help="write the worker's training figures here (JSON)")
    ap.add_argument("--hang_after_tasks", type=int, default=None,
                    help="for tests: after this many accepted training tasks, take the next "
                    "one, print 'holding task N' and stop working (heartbeats go on) until "
                    "killed: a worker that dies in the middle of a task, deterministically")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--log_every_s", type=float, default=5.0, help="progress line interval")
    ap.add_argument("--name", default=None, help="name in progress lines")
    args = ap.parse_args()
    if not args.master:
        ap.error("--master (or $PS_MASTER) is required")
    if args.staleness < 0 or args.dense_every < 1 or args.batch < 1:
        ap.error("need --staleness >= 0, --dense_every >= 1 and --batch >= 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)

    worker = Worker(args.master, args.job)
    worker.install_sigterm_handler()
    name = args.name or f"worker {worker.worker_id}"
    m = manifest.load(args.manifest)
    stats = deepfm.input_stats(m)
    if not args.no_create:
        files = [(e["path"], e["records"]) for e in m["files"]]
        holdout = m.get("holdout")
        evals = [] if args.no_eval or not holdout else [(holdout["path"], holdout["records"])]
        n = worker.create_job(files=files, epochs=args.epochs,
                              records_per_task=args.records_per_task, eval_files=evals)
        print(f"{name}: job {args.job}: {n} tasks", flush=True)
    client = worker.client
    model, ps_opt = deepfm.ps_model(client, stats, pull_every=args.dense_every,
                                    init_seed=args.init_seed, staleness=args.staleness,
                                    admit_after=args.admit_after)
    dense_binder = ps_opt.dense[0]
    progress = Progress(name, args.log_every_s)
    done = {"train": 0, "eval": 0}
    totals = Totals()
    t0 = time.time()
    for task in worker.tasks():
        if (args.hang_after_tasks is not None and task.kind == "train"
                and done["train"] >= args.hang_after_tasks):
            print(f"{name}: holding task {task.task_id} (--hang_after_tasks)", flush=True)
            while True:
                time.sleep(3600)
        try:
            if task.kind == "train":
                steps = [] if args.step_trace else None
                if totals.first is None:
                    totals.first = time.time()
                n, pushes, loss = train_task(task, model, ps_opt, args.batch, progress, steps,
                                             prefetch=bool(args.prefetch), totals=totals)
                if steps:
                    with open(args.step_trace, "a") as f:
                        f.write(json.dumps({"pid": os.getpid(), "task_id": task.task_id,
                                            "steps": steps}) + "\n")
            else:
                n, pushes, loss = eval_task(task, model, args.eval_dir, dense_binder), {}, 0.0
        except Exception as e:  # noqa: BLE001 (reported; the master retries the task)
            print(f"{name}: task {task.task_id} failed: {e}", flush=True)
            for dropped in ps_opt.discard():  # the pushes of the failed task, settled
                print(f"{name}: task {task.task_id}: also failed: {dropped}", flush=True)
            try:
                worker.report(task, ok=False, error=str(e))
            except PsError as re:
                print(f"{name}: reporting the failure: {re}", flush=True)
            continue
        try:
            worker.report(task, ok=True, records=n, table_pushes=pushes)
        except PsError as e:  # TaskLostError: the task was given to another worker
            print(f"{name}: task {task.task_id} not accepted: {e}", flush=True)
            continue
        done[task.kind] += 1
        if task.kind == "train":
            totals.last = time.time()
        if args.trace:
            with open(args.trace, "a") as f:
                f.write(json.dumps({"task_id": task.task_id, "file": task.file,
                                    "first": task.first_record, "end": task.end_record,
                                    "records": n, "kind": task.kind, "epoch": task.epoch,
                                    "attempt": task.attempt, "worker": worker.worker_id,
                                    "pid": os.getpid()}) + "\n")
        print(f"{name}: {task.kind} task {task.task_id} done: [{task.first_record}, "
              f"{task.end_record}) of {os.path.basename(task.file)}, {n} records"
              + (f", loss {loss:.4f}" if task.kind == "train" else ""), flush=True)
    stopping = worker.stopping
    ps_opt.close()
    worker.leave()
    if args.summary:
        write_summary(args.summary, totals, args, ps_opt)
    print(f"{name}: {'stopped (SIGTERM)' if stopping else 'job done'}; {done['train']} train "
          f"and {done['eval']} eval tasks in {time.time() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
