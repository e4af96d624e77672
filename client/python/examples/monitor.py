"""Progress of a training job, from the master's status and the workers' logs.

    /usr/bin/python3 examples/monitor.py --master HOST:PORT --job NAME [--logs 'GLOB']
        [--state FILE] [--every_s 3] [--until_done] [--timeout_s 600]

Prints one line per interval: elapsed time, tasks done / total (doing, failed), training
records done / total, records/s since the previous line, live workers and pods, and the
newest loss found in the worker logs (lines "... loss X ..."). ``--state FILE`` rewrites
FILE with shell assignments after every poll (STATE, RECORDS_DONE, RECORDS_TOTAL,
TASKS_DONE, TASKS_TOTAL, TASKS_FAILED, EVAL_RECORDS, LIVE_WORKERS, LIVE_PODS) for scripts.
Without --until_done it polls once. Exits 0 when the job SUCCEEDED, 3 when it FAILED,
1 on timeout, 2 while running (single poll).
"""

import argparse
import glob
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

import grpc  # noqa: E402

from elastic_ps._stubs import master_pb2, master_pb2_grpc  # noqa: E402

_LOSS = re.compile(r"loss (\d+\.\d+)")
_STATES = {1: "RUNNING", 2: "SUCCEEDED", 3: "FAILED"}


def newest_loss(pattern):
    best, when = None, -1.0
    for path in glob.glob(pattern) if pattern else []:
        try:
            mtime = os.path.getmtime(path)
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - 4096))
                tail = f.read().decode(errors="replace")
        except OSError:
            continue
        found = _LOSS.findall(tail)
        if found and mtime > when:
            best, when = float(found[-1]), mtime
    return best


def job_state(status, job):
    for j in status.jobs:
        if j.name == job:
            return j
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--master", required=True, help="master host:port")
    ap.add_argument("--job", required=True, help="job name")
    ap.add_argument("--logs", help="glob of worker logs to take the loss from")
    ap.add_argument("--state", help="rewrite this file with shell assignments every poll")
    ap.add_argument("--every_s", type=float, default=3.0, help="poll interval")
    ap.add_argument("--until_done", action="store_true", help="poll until the job ends")
    ap.add_argument("--timeout_s", type=float, default=600.0, help="with --until_done")
    args = ap.parse_args()
    stub = master_pb2_grpc.MasterStub(grpc.insecure_channel(args.master))
    t0 = time.time()
    last_t, last_records = t0, None
    trained_at = None  # when the training records first reached the total
    while True:
        try:
            st = stub.Status(master_pb2.StatusRequest(), timeout=5.0)
        except grpc.RpcError as e:  # the master restarting: try again next round
            print(f"monitor: master status: {e.code().name}", flush=True)
            st = None
        j = job_state(st, args.job) if st is not None else None
        state = "UNKNOWN"
        if j is not None:
            state = _STATES.get(j.state, "UNKNOWN")
            now = time.time()
            rate = 0.0
            if last_records is not None and now > last_t:
                rate = (j.train_records_done - last_records) / (now - last_t)
            last_t, last_records = now, j.train_records_done
            if trained_at is None and j.train_records_done >= j.train_records_total > 0:
                trained_at = now
            live_w = sum(1 for w in st.workers if w.state == master_pb2.WorkerInfo.LIVE)
            live_p = sum(1 for p in st.pods if p.state == master_pb2.PodInfo.LIVE)
            loss = newest_loss(args.logs)
            print(f"[{now - t0:5.0f} s] {state.lower():9s} tasks {j.tasks_done}/"
                  f"{j.tasks_total} done ({j.tasks_doing} doing, {j.tasks_failed} failed), "
                  f"train records {j.train_records_done}/{j.train_records_total}, "
                  f"{rate:6.0f} records/s, eval records {j.eval_records_done}, "
                  f"workers {live_w} live, pods {live_p}/{len(st.pods)} live"
                  + (f", loss {loss:.4f}" if loss is not None else ""), flush=True)
            if args.state:
                tmp = args.state + ".tmp"
                with open(tmp, "w") as f:
                    f.write(f"STATE={state}\nRECORDS_DONE={j.train_records_done}\n"
                            f"RECORDS_TOTAL={j.train_records_total}\n"
                            f"TASKS_DONE={j.tasks_done}\nTASKS_TOTAL={j.tasks_total}\n"
                            f"TASKS_FAILED={j.tasks_failed}\n"
                            f"EVAL_RECORDS={j.eval_records_done}\n"
                            f"LIVE_WORKERS={live_w}\nLIVE_PODS={live_p}\n")
                os.replace(tmp, args.state)
        elif st is not None:
            print(f"monitor: no job {args.job} yet", flush=True)
        if state in ("SUCCEEDED", "FAILED") and args.until_done and trained_at is not None:
            secs = trained_at - t0
            print(f"monitor: {j.train_records_done} training records in {secs:.1f} s "
                  f"({j.train_records_done / secs:.0f} records/s; from the monitor's start, "
                  f"worker start-up included, to the last training report)", flush=True)
            if args.state:
                with open(args.state, "a") as f:
                    f.write(f"TRAIN_SECONDS={secs:.1f}\n")
        if state == "SUCCEEDED":
            return 0
        if state == "FAILED":
            return 3
        if not args.until_done:
            return 2
        if time.time() - t0 > args.timeout_s:
            print(f"monitor: job {args.job} not done after {args.timeout_s:.0f} s", flush=True)
            return 1
        time.sleep(args.every_s)


if __name__ == "__main__":
    sys.exit(main())
