"""Throughput of the Python client (elastic_ps on the C++ core) against one pod, at the
shape and depth of ps-bench, and optionally ps-bench itself on the same pod, alternated.

    PYTHONPATH=client/python:build/python /usr/bin/python3 client/python/tools/bench_client.py \
        [--server=HOST:PORT] [--batch=1024] [--dim=64] [--inflight=1,8] [--ops=pull,push] \
        [--seconds=5] [--rounds=1] [--compare]

Without --server it starts one in-memory ps-server on loopback (from $PS_BUILD_DIR/bin or
build/bin) and stops it by pid at the end. The table is ps-bench's (bench_d<dim>_adagrad,
uniform [-0.01, 0.01) initializer, Adagrad); rows [0, --rows) are created first, then each
timed run draws uniform batches from them, as ps-bench does. --inflight=1 uses the blocking
calls (pull(..., out=buf), push); deeper runs keep that many asynchronous handles in
flight, waiting for the oldest before issuing the next. --compare runs
`ps-bench --target=grpc` with the same shape and depth after each Python run (rounds
alternate) and prints the medians and their ratio; the last line is one JSON object.
"""

import argparse
import collections
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

from elastic_ps import PsClient  # noqa: E402
from elastic_ps._stubs import ps_pb2  # noqa: E402


def _bin_dir():
    b = os.environ.get("PS_BUILD_DIR")
    root = Path(b) if b else HERE.parents[2] / "build"
    return root / "bin"


def _table_spec(dim):
    spec = ps_pb2.TableSpec(name=f"bench_d{dim}_adagrad", dim=dim)
    spec.initializer.kind = ps_pb2.InitializerSpec.UNIFORM
    spec.initializer.low, spec.initializer.high = -0.01, 0.01
    spec.optimizer.kind = ps_pb2.OptimizerSpec.ADAGRAD
    return spec


def _pod_cpu(pid):
    """CPU seconds (user + system) the process `pid` used so far; None if unknown."""
    if pid is None:
        return None
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Meter:
    """Wall time, this process's CPU, its children's CPU and the pod's CPU over a run."""

    def __init__(self, pod_pid):
        self.pod_pid = pod_pid

    def __enter__(self):
        self.t, self.cpu, self.kids = time.perf_counter(), time.process_time(), _children_cpu()
        self.pod = _pod_cpu(self.pod_pid)
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t
        self.own = time.process_time() - self.cpu
        self.children = _children_cpu() - self.kids
        pod = _pod_cpu(self.pod_pid)
        self.pod_cpu = None if pod is None else pod - self.pod


def _children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_python(ps, table, op, depth, batches, grads, outs, seconds):
    """(calls, seconds) of `op` at `depth` calls in flight for about `seconds`."""
    n = len(batches)
    done = 0
    start = time.perf_counter()
    end = start + seconds
    if depth == 1:
        while time.perf_counter() < end:
            ids = batches[done % n]
            if op == "pull":
                ps.pull(table, ids, out=outs[0])
            else:
                ps.push(table, ids, grads)
            done += 1
    else:
        # The oldest call is done before its slot's buffer is used again.
        inflight = collections.deque()
        while time.perf_counter() < end:
            if len(inflight) == depth:
                inflight.popleft().result()
                done += 1
            ids = batches[(done + len(inflight)) % n]
            if op == "pull":
                inflight.append(ps.pull_async(table, ids, out=outs[(done + len(inflight)) % depth]))
            else:
                inflight.append(ps.push_async(table, ids, grads))
        while inflight:
            inflight.popleft().result()
            done += 1
    return done, time.perf_counter() - start


def run_ps_bench(server, op, depth, args):
    """(rows/s, calls) of ps-bench at the same shape and depth."""
    out = subprocess.run(
        [str(_bin_dir() / "ps-bench"), "--target=grpc", f"--servers={server}", f"--op={op}",
         f"--dim={args.dim}", f"--batch={args.batch}", f"--rows={args.rows}",
         f"--inflight={depth}", f"--seconds={args.seconds}", "--optimizer=adagrad",
         "--populate=false", *args.ps_bench_args.split()], capture_output=True, text=True,
        check=True).stdout
    j = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    return j["rows_per_s"], j["rows_per_s"] * j["seconds"] / j["batch"]


def _per_call(client_cpu, pod_cpu, calls):
    text = f"CPU per call: client {client_cpu / calls * 1e6:.0f} us"
    if pod_cpu is not None:
        text += f", pod {pod_cpu / calls * 1e6:.0f} us"
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="", help="an existing pod (host:port); else one is started")
    ap.add_argument("--batch", type=int, default=1024, help="ids per call")
    ap.add_argument("--dim", type=int, default=64, help="floats per row")
    ap.add_argument("--rows", type=int, default=1_000_000, help="the id space [0, rows)")
    ap.add_argument("--inflight", default="1,8", help="comma-separated depths")
    ap.add_argument("--ops", default="pull,push", help="pull, push or both")
    ap.add_argument("--seconds", type=float, default=5.0, help="timed seconds per run")
    ap.add_argument("--rounds", type=int, default=1, help="repetitions (medians reported)")
    ap.add_argument("--compare", action="store_true", help="also run ps-bench, alternated")
    ap.add_argument("--ps_bench_args", default="",
                    help="more ps-bench flags, e.g. '--drive=threads --threads=1'")
    args = ap.parse_args()
    depths = [int(d) for d in args.inflight.split(",")]
    ops = args.ops.split(",")

    pod = None
    pod_pid = None
    server = args.server
    if not server:
        import conftest

        tmp = Path(tempfile.mkdtemp(prefix="bench-client-"))
        pod = conftest.Proc("ps-server", [str(_bin_dir() / "ps-server"), "--host=127.0.0.1",
                                          "--port=0", f"--port_file={tmp / 'port'}"],
                            tmp / "ps.log", tmp / "port").start()
        server = pod.address
        pod_pid = pod.popen.pid
    results = collections.defaultdict(list)
    try:
        with PsClient(servers=[server], deadline_s=60) as ps:
            spec = _table_spec(args.dim)
            ps.create_table(spec)
            t = time.perf_counter()
            scratch = np.empty((args.batch, args.dim), np.float32)
            for first in range(0, args.rows, args.batch):
                ids = np.arange(first, min(first + args.batch, args.rows), dtype=np.int64)
                ps.pull(spec.name, ids, out=scratch[:ids.shape[0]])
            print(f"populated {args.rows} rows in {time.perf_counter() - t:.1f} s")
            rng = np.random.default_rng(42)
            num_batches = min(max(args.rows // args.batch, 64), 4096)
            batches = [rng.integers(0, args.rows, args.batch, dtype=np.int64)
                       for _ in range(num_batches)]
            grads = (0.001 * (np.arange(args.batch * args.dim) % 13) - 0.006).astype(
                np.float32).reshape(args.batch, args.dim)
            outs = [np.empty((args.batch, args.dim), np.float32) for _ in range(max(depths))]
            for r in range(args.rounds):
                for op in ops:
                    for depth in depths:
                        with Meter(pod_pid) as m:
                            calls, secs = run_python(ps, spec.name, op, depth, batches, grads,
                                                     outs, args.seconds)
                        py = calls * args.batch / secs
                        results[(op, depth, "python")].append(py)
                        line = (f"round {r + 1} {op:4s} inflight {depth}: python {py:,.0f} "
                                f"rows/s ({_per_call(m.own, m.pod_cpu, calls)})")
                        if args.compare:
                            with Meter(pod_pid) as m:
                                cxx, calls = run_ps_bench(server, op, depth, args)
                            results[(op, depth, "ps-bench")].append(cxx)
                            line += (f", ps-bench {cxx:,.0f} rows/s "
                                     f"({_per_call(m.children, m.pod_cpu, calls)}), "
                                     f"ratio {py / cxx:.2f}")
                        print(line, flush=True)
    finally:
        if pod is not None:
            pod.stop()
    summary = {"batch": args.batch, "dim": args.dim, "rounds": args.rounds, "runs": []}
    for op in ops:
        for depth in depths:
            py = statistics.median(results[(op, depth, "python")])
            entry = {"op": op, "inflight": depth, "python_rows_per_s": round(py)}
            text = f"median {op:4s} inflight {depth}: python {py:,.0f} rows/s"
            if args.compare:
                cxx = statistics.median(results[(op, depth, "ps-bench")])
                entry.update(ps_bench_rows_per_s=round(cxx), ratio=round(py / cxx, 3))
                text += f", ps-bench {cxx:,.0f} rows/s, ratio {py / cxx:.2f}"
            summary["runs"].append(entry)
            print(text)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
