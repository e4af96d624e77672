"""Pulls a fixed sample of ps-bench's table rows from one pod into a .npy file, or compares
two such files (benchmarks/recovery.sh: a lazy start's pulls during warm-up against an eager
start's of the same database).

    PYTHONPATH=client/python:build/python /usr/bin/python3 benchmarks/pull_rows.py \
        --server=127.0.0.1:PORT --rows=10000000 --sample=100000 --out=FILE.npy
    /usr/bin/python3 benchmarks/pull_rows.py --compare A.npy B.npy
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client" / "python"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", help="host:port of the pod")
    ap.add_argument("--rows", type=int, help="the table's id space [0, rows)")
    ap.add_argument("--sample", type=int, default=100000, help="ids pulled (seeded)")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--out", help=".npy file for the rows")
    ap.add_argument("--compare", nargs=2, metavar="NPY", help="compare two files bit for bit")
    args = ap.parse_args()
    if args.compare:
        a, b = (np.load(f) for f in args.compare)
        same = a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))
        print(f"{args.compare[0]} vs {args.compare[1]}: {a.shape[0]} rows, "
              f"{'identical' if same else 'DIFFERENT'}")
        sys.exit(0 if same else 1)
    from elastic_ps import PsClient  # noqa: E402

    ids = np.random.default_rng(7).choice(args.rows, size=min(args.sample, args.rows),
                                          replace=False).astype(np.int64)
    start = time.time()
    with PsClient(servers=[args.server], deadline_s=120.0) as ps:
        rows = ps.pull(f"bench_d{args.dim}_adagrad", ids, read_only=True)
    np.save(args.out, np.asarray(rows, dtype=np.float32))
    print(f"pulled {len(ids)} rows in {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
