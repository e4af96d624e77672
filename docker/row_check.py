#!/usr/bin/python3
"""Reads back what a DeepFM job (client/python/examples/train_worker.py) trained, for
scripts/container-test.sh, which runs it in the worker image on the cluster's network:

    python3 row_check.py dump    --master HOST:PORT --manifest M > rows.npz
    python3 row_check.py compare --master HOST:PORT --manifest M --pod ps-0 < rows.npz

dump: every embedding row the job's training files name (deepfm.TABLE, the ids of every
record's categorical fields) and every dense tensor, pulled read-only (a row that is
missing comes back at its initial value and is not created), as an .npz on stdout, with
the pod that owns each row.
compare: pulls the same rows again and compares them bit for bit with the dump on stdin;
prints one JSON line (rows, rows on --pod, rows that differ, dense tensors that differ)
and exits 0 when nothing differs and --pod owns at least one row, 1 otherwise.

The SDK comes from the image (PYTHONPATH); the model's conventions from its examples.
"""

import argparse
import io
import json
import sys

import numpy as np

sys.path.insert(0, "/opt/elastic-ps/python/examples")

import deepfm  # noqa: E402
from elastic_ps import PsClient, criteo  # noqa: E402


def read_rows(client, manifest):
    ids = [criteo.read_all(e["path"], 0, e["records"]).cat.reshape(-1)
           for e in manifest["files"]]
    ids = np.unique(np.concatenate(ids)) if ids else np.zeros(0, np.int64)
    rows = client.pull(deepfm.TABLE, ids, read_only=True) if len(ids) else np.zeros((0, 0))
    m = client.shard_map
    owner = np.asarray(m.pod_ids)[m.pods_of(deepfm.TABLE, ids)] if len(ids) else []
    names = sorted(client.dense_tensors())
    dense = client.pull_dense(names) if names else {}
    return ids, rows, np.asarray(owner, dtype=str), dense


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["dump", "compare"])
    ap.add_argument("--master", required=True, help="the master's HOST:PORT")
    ap.add_argument("--manifest", required=True, help="the job's manifest.json")
    ap.add_argument("--pod", help="compare: the pod that was killed (must own rows)")
    args = ap.parse_args()
    with open(args.manifest) as f:
        manifest = json.load(f)
    client = PsClient(master=args.master, connect_timeout_s=120)
    ids, rows, owner, dense = read_rows(client, manifest)
    if args.mode == "dump":
        buf = io.BytesIO()
        np.savez(buf, ids=ids, rows=rows, owner=owner,
                 dense_names=np.asarray(sorted(dense), dtype=str),
                 **{f"dense_{i}": dense[n] for i, n in enumerate(sorted(dense))})
        sys.stdout.buffer.write(buf.getvalue())
        return 0
    ref = np.load(io.BytesIO(sys.stdin.buffer.read()))
    same_ids = np.array_equal(ref["ids"], ids)
    # Bit for bit: a float compare would take -0.0 for 0.0 and fail NaN == NaN.
    differ = (int(np.count_nonzero((ref["rows"].view(np.uint32) != rows.view(np.uint32))
                                   .any(axis=1))) if same_ids else len(ids))
    names = list(ref["dense_names"])
    dense_differ = [n for i, n in enumerate(names)
                    if n not in dense or ref[f"dense_{i}"].tobytes() != dense[n].tobytes()]
    on_pod = int(np.count_nonzero(owner == args.pod)) if args.pod else 0
    ok = same_ids and differ == 0 and not dense_differ and names == sorted(dense) and (
        on_pod > 0 or not args.pod)
    print(json.dumps({"rows": int(len(ids)), "rows_on_pod": on_pod, "pod": args.pod,
                      "rows_differ": differ, "dense": len(names),
                      "dense_differ": dense_differ, "pass": bool(ok)}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
