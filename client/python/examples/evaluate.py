"""Held-out AUC of the PS-trained DeepFM.

    /usr/bin/python3 examples/evaluate.py --eval_dir DIR [--epoch E]
        AUC over the predictions the workers' eval tasks wrote (the newest epoch by
        default; every eval task's range once).
    /usr/bin/python3 examples/evaluate.py --master HOST:PORT --manifest M [--file F]
        evaluates the model on the PS directly (read-only pulls, nothing created) on F
        (default: the manifest's held-out file); the manifest gives the model's input
        standardization.

Prints ``AUC <f> logloss <f> records <n>``; --json OUT writes them as JSON.
"""

import argparse
import glob
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

from elastic_ps.metrics import auc, logloss  # noqa: E402


def from_eval_dir(eval_dir, epoch=None):
    """(labels, probs) over the eval-task outputs of `epoch` (None: the newest)."""
    files = glob.glob(os.path.join(eval_dir, "epoch*-task*.npz"))
    epochs = sorted({int(re.search(r"epoch(\d+)-", f).group(1)) for f in files})
    if not epochs:
        raise ValueError(f"no eval outputs in {eval_dir}")
    epoch = epochs[-1] if epoch is None else epoch
    labels, probs, ranges = [], [], set()
    for f in sorted(files):
        if not os.path.basename(f).startswith(f"epoch{epoch}-"):
            continue
        z = np.load(f)
        key = (str(z["path"]), int(z["first"]), int(z["end"]))
        if key in ranges:
            continue
        ranges.add(key)
        labels.append(z["labels"])
        probs.append(z["probs"])
    return np.concatenate(labels), np.concatenate(probs)


def from_ps(master, path, stats, batch=4096):
    """(labels, probs) of the PS model on ``path``; ``stats``: deepfm.input_stats of the
    job's manifest."""
    import torch

    from elastic_ps import criteo
    from elastic_ps.client import PsClient

    import deepfm

    client = PsClient(master=master)
    model, _ = deepfm.ps_model(client, stats, create=False)
    model.eval()
    labels, probs = [], []
    with torch.no_grad():
        for b in criteo.read_range(path, 0, criteo.count_records(path), batch):
            dense, cat, _ = deepfm.to_tensors(b)
            probs.append(torch.sigmoid(model(dense, cat)).numpy())
            labels.append(b.labels)
    return np.concatenate(labels), np.concatenate(probs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--eval_dir", help="directory of the eval tasks' outputs")
    ap.add_argument("--epoch", type=int, help="with --eval_dir: which epoch (default newest)")
    ap.add_argument("--master", help="evaluate the PS model directly (with --manifest)")
    ap.add_argument("--manifest", help="with --master: the job's manifest.json")
    ap.add_argument("--file", help="with --master: this Criteo file instead of the "
                    "manifest's held-out file")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args()
    if args.eval_dir:
        labels, probs = from_eval_dir(args.eval_dir, args.epoch)
    elif args.master and args.manifest:
        import deepfm

        from elastic_ps import manifest

        m = manifest.load(args.manifest)
        if not args.file and not m.get("holdout"):
            ap.error(f"{args.manifest} names no held-out file: give --file")
        labels, probs = from_ps(args.master, args.file or m["holdout"]["path"],
                                deepfm.input_stats(m))
    else:
        ap.error("give --eval_dir, or --master and --manifest")
    res = {"auc": auc(labels, probs), "logloss": logloss(labels, probs),
           "records": int(len(labels))}
    print(f"AUC {res['auc']:.4f} logloss {res['logloss']:.4f} records {res['records']}",
          flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
