"""Single-process baseline: the same DeepFM as the PS workers, trained with
torch.nn.EmbeddingBag and torch's Adagrad (same learning rates and initial accumulator as
the servers) on the same files in the same record order and the same minibatches as the
workers (with --records_per_task, the job's task size), then evaluated on held-out data.

    /usr/bin/python3 examples/baseline.py --manifest DIR/manifest.json [--epochs 1]
        [--batch 256] [--records_per_task N] [--seed S] [--json OUT]

Feature ids are mapped to compact row indices over the training and held-out ids (an
unseen held-out id keeps its initial row, as a read-only PS pull would return). Prints
AUC, log loss, records/s; with --json writes them to OUT.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from elastic_ps import criteo, manifest  # noqa: E402
from elastic_ps.metrics import auc, logloss  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepfm  # noqa: E402


class Prepared:
    """Training and held-out data with ids mapped to compact row indices."""

    def __init__(self, data, test, compact, num_rows, stats):
        self.data, self.test, self.compact, self.num_rows = data, test, compact, num_rows
        self.stats = stats


def prepare(train_files, holdout, stats=None):
    """Reads [(path, records)] and the held-out file; maps every feature id to a compact
    row index (an unseen held-out id keeps its initial row, as a read-only PS pull would).
    ``stats``: the model's input standardization (deepfm.input_stats); None: computed
    from ``train_files`` (criteo.dense_stats, what the workers use)."""
    data = [criteo.read_all(p, 0, n) for p, n in train_files]
    test = criteo.read_all(holdout)
    all_ids = np.concatenate([d.cat.reshape(-1) for d in data] + [test.cat.reshape(-1)])
    vocab, inverse = np.unique(all_ids, return_inverse=True)
    off = 0
    compact = []
    for d in data + [test]:
        n = d.cat.size
        compact.append(inverse[off:off + n].reshape(d.cat.shape).astype(np.int64))
        off += n
    stats = stats or criteo.dense_stats(train_files)
    return Prepared(data, test, compact, len(vocab), stats)


def batches(prepared, batch, order_seed=None, task_records=None):
    """Yields (dense, cat, labels) tensors over every file in order, the minibatches the
    workers train: each file cut into tasks of ``task_records`` records (None: one task
    per file), each task into ``ceil(n / batch)`` minibatches of nearly equal size
    (``criteo.batch_sizes(n, batch, balanced=True)``). ``order_seed``: the minibatches in
    a shuffled order instead."""
    spans = []
    for i, d in enumerate(prepared.data):
        n = len(d.labels)
        step = task_records or n
        for t in range(0, n, step):
            s = t
            for size in criteo.batch_sizes(min(n, t + step) - t, batch, balanced=True):
                spans.append((i, s, s + size))
                s += size
    if order_seed is not None:
        np.random.default_rng(order_seed).shuffle(spans)
    for i, s, e in spans:
        d, c = prepared.data[i], prepared.compact[i]
        yield (torch.from_numpy(d.dense[s:e]), torch.from_numpy(c[s:e]),
               torch.from_numpy(d.labels[s:e]))


def evaluate(model, prepared):
    """{auc, logloss} of ``model`` on the held-out data."""
    test = prepared.test
    model.eval()
    with torch.no_grad():
        probs = []
        for s in range(0, len(test.labels), 4096):
            logits = model(torch.from_numpy(test.dense[s:s + 4096]),
                           torch.from_numpy(prepared.compact[-1][s:s + 4096]))
            probs.append(torch.sigmoid(logits).numpy())
    probs = np.concatenate(probs)
    return {"auc": auc(test.labels, probs), "logloss": logloss(test.labels, probs)}


def train_baseline(train_files, holdout, epochs=1, batch=deepfm.BATCH, seed=0, log=print,
                   prepared=None, stats=None, task_records=None):
    """Trains on [(path, records)] and evaluates on holdout (path). Returns a dict with
    auc, logloss, records, seconds, cpu_seconds and records_per_s (of the training loop),
    and prepare_seconds (reading the files and mapping the ids, 0 when given
    ``prepared``; not in records_per_s, as the data reading is not). ``prepared``: the result of
    :func:`prepare` for these files, to read them once for several runs; ``stats``: as
    for :func:`prepare`; ``task_records``: the job's task size, so that the minibatches
    are the workers' (:func:`batches`)."""
    t_prepare = time.time()
    prepared = prepared or prepare(train_files, holdout, stats)
    prepare_seconds = time.time() - t_prepare
    model, opts = deepfm.local_model(prepared.num_rows, prepared.stats, seed)
    t0, c0 = time.time(), time.process_time()
    records = 0
    losses = []
    for epoch in range(epochs):
        for dense, cat, labels in batches(prepared, batch, task_records=task_records):
            loss = deepfm.loss_fn(model(dense, cat), labels)
            for o in opts:
                o.zero_grad()
            loss.backward()
            for o in opts:
                o.step()
            records += len(labels)
            losses.append(float(loss))
        log(f"baseline: epoch {epoch} done, {records} records, "
            f"loss {np.mean(losses[-100:]):.4f}")
    seconds, cpu_seconds = time.time() - t0, time.process_time() - c0
    res = evaluate(model, prepared)
    res.update(records=records, seconds=seconds, records_per_s=records / seconds,
               rows=int(prepared.num_rows), prepare_seconds=prepare_seconds,
               cpu_seconds=cpu_seconds)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", required=True,
                    help="the data's manifest.json (elastic_ps.manifest or elastic_ps.synth)")
    ap.add_argument("--epochs", type=int, default=1, help="passes over the training files")
    ap.add_argument("--batch", type=int, default=deepfm.BATCH, help="minibatch size")
    ap.add_argument("--seed", type=int, default=0, help="torch seed (initial rows)")
    ap.add_argument("--records_per_task", type=int, default=None,
                    help="the PS job's task size: train on the workers' minibatches "
                    "(default: one task per file)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--json", help="write the result here as JSON")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    m = manifest.load(args.manifest)
    if not m.get("holdout"):
        ap.error(f"{args.manifest} names no held-out file (elastic_ps.manifest --holdout)")
    res = train_baseline([(e["path"], e["records"]) for e in m["files"]],
                         m["holdout"]["path"], args.epochs, args.batch, args.seed,
                         stats=deepfm.input_stats(m), task_records=args.records_per_task)
    print(f"baseline: AUC {res['auc']:.4f}  logloss {res['logloss']:.4f}  "
          f"{res['records']} records in {res['seconds']:.1f} s "
          f"({res['records_per_s']:.0f} records/s, 1 process)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
