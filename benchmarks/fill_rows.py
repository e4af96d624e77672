"""Stores rows [0, N) of ps-bench's table in one pod: one Adagrad push per id, in order.

    PYTHONPATH=client/python:build/python /usr/bin/python3 benchmarks/fill_rows.py \
        --server=127.0.0.1:PORT --rows=10000000 [--dim=64] [--batch=16384]

ps-bench's uniform pushes reach every id only after several passes; this touches each id
exactly once, so a durable pod ends up storing exactly N rows (benchmarks/recovery.sh).
The table is ps-bench's `bench_d<dim>_adagrad` (same spec), so ps-bench can push to it
afterwards.
"""

import argparse
import concurrent.futures
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client" / "python"))

from elastic_ps import PsClient  # noqa: E402
from elastic_ps._stubs import ps_pb2  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True, help="host:port of the pod")
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16384)
    ap.add_argument("--inflight", type=int, default=4)
    args = ap.parse_args()
    spec = ps_pb2.TableSpec(name=f"bench_d{args.dim}_adagrad", dim=args.dim)
    spec.initializer.kind = ps_pb2.InitializerSpec.UNIFORM
    spec.initializer.low = -0.01
    spec.initializer.high = 0.01
    spec.optimizer.kind = ps_pb2.OptimizerSpec.ADAGRAD
    start = time.time()
    with PsClient(servers=[args.server], deadline_s=60.0) as ps:
        ps.create_table(spec)
        grads = (np.arange(args.batch * args.dim, dtype=np.float32) % 13 * 0.001 - 0.006).reshape(
            args.batch, args.dim)
        with concurrent.futures.ThreadPoolExecutor(args.inflight) as pool:
            futures = []
            for first in range(0, args.rows, args.batch):
                ids = np.arange(first, min(first + args.batch, args.rows), dtype=np.int64)
                futures.append(pool.submit(ps.push, spec.name, ids, grads[: len(ids)]))
                if len(futures) >= 2 * args.inflight:
                    futures.pop(0).result()
            for f in futures:
                f.result()
    secs = time.time() - start
    print(f"stored {args.rows} rows in {secs:.1f} s ({args.rows / secs:,.0f} rows/s)")


if __name__ == "__main__":
    main()
