#!/usr/bin/python3
"""Pushes small batches through the master in a loop and writes one line per successful
push: its start and end (unix seconds). benchmarks/replication.sh failover reads it to
find when pushes were accepted again after a pod was killed. Runs until killed.

Usage: push_probe.py --master=HOST:PORT --out=FILE [--table=probe] [--ids=256] [--dim=8]
"""
import argparse
import sys
import time

import numpy as np

from elastic_ps import PsClient


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--master", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--table", default="probe")
    p.add_argument("--ids", type=int, default=256)
    p.add_argument("--dim", type=int, default=8)
    a = p.parse_args()
    # Generous retries: a push whose primary died waits for the failover, then succeeds.
    client = PsClient(master=a.master, deadline_s=30.0, max_attempts=1000, max_backoff_s=0.1)
    client.create_table(a.table, dim=a.dim, optimizer="sgd")
    rng = np.random.default_rng(1)
    grads = np.full((a.ids, a.dim), 0.01, dtype=np.float32)
    with open(a.out, "w", buffering=1) as out:
        while True:
            ids = rng.integers(0, 1 << 40, size=a.ids, dtype=np.int64)
            start = time.time()
            try:
                client.push(a.table, ids, grads)
            except Exception as e:  # noqa: BLE001 - a failed push is reported, not fatal
                print(f"push failed after {time.time() - start:.3f} s: {e}", file=sys.stderr,
                      flush=True)
                continue
            out.write(f"{start:.6f} {time.time():.6f}\n")


if __name__ == "__main__":
    main()
