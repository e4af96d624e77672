"""A short throughput check of the Python client: pull and push of random ids.

    PYTHONPATH=client/python:build/python /usr/bin/python3 client/python/tools/bench_client.py \
        [--master=HOST:PORT] [--rows=100000] [--dim=64] [--reps=5]

Without --master it starts a ps-master and two in-memory ps-server pods on loopback
(binaries from $PS_BUILD_DIR/bin or build/bin) and stops them afterwards.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

from elastic_ps import PsClient  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--master", default="", help="an existing cluster's master")
    ap.add_argument("--rows", type=int, default=100000, help="ids per call")
    ap.add_argument("--dim", type=int, default=64, help="embedding dimension")
    ap.add_argument("--reps", type=int, default=5, help="timed calls of each kind")
    args = ap.parse_args()
    cluster = None
    master = args.master
    if not master:
        import conftest

        cluster = conftest.Cluster(tempfile.mkdtemp(prefix="bench-"), data_dirs=False).start()
        master = cluster.master.address
    try:
        with PsClient(master=master) as ps:
            table = f"bench_{args.dim}"
            ps.create_table(table, args.dim, optimizer="adagrad", learning_rate=0.05)
            rng = np.random.default_rng(0)
            ids = rng.integers(0, 10**8, size=args.rows)
            grads = rng.standard_normal((args.rows, args.dim), dtype=np.float32)
            ps.pull(table, ids)
            ps.push(table, ids, grads)
            for name, fn in [("pull", lambda: ps.pull(table, ids)),
                             ("push", lambda: ps.push(table, ids, grads))]:
                t = time.perf_counter()
                for _ in range(args.reps):
                    fn()
                dt = (time.perf_counter() - t) / args.reps
                print(f"{name}: {args.rows} rows x dim {args.dim}: {dt * 1000:.1f} ms/call, "
                      f"{args.rows / dt / 1e6:.2f} M rows/s, "
                      f"{args.rows * args.dim * 4 / dt / 1e6:.0f} MB/s")
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
