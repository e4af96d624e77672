"""Deterministic simulation of asynchronous training, in one process, without a PS.

The baseline's model and optimizers (examples/deepfm.py local_model), but the gradient of
step t is computed on the parameters as they were ``s_t`` updates earlier (a stale read,
what an asynchronous worker sees when ``s_t`` pushes of other workers land between its pull
and its push); the update is applied to the current parameters, as the servers do.

    /usr/bin/python3 examples/async_sim.py --manifest DIR/manifest.json \\
        [--staleness 1] [--max_staleness 0] [--stale sparse,dense] [--seeds 0,1,2]
        [--task_records N] [--order_seed S] [--no_standardize] [--set NAME=VALUE]

``--staleness S``: every step reads S updates late (2 evenly paced workers: S = 1).
``--max_staleness M`` > S: s_t uniform in [S, M] (uneven workers on a busy machine).
``--stale``: which parameters are read stale (the others are read fresh), to locate the
cost: ``sparse``, ``dense``, or the dense parts ``mlp`` / ``linear``. ``--task_records``:
the workers' minibatches (tasks of N records); ``--order_seed``: a shuffled minibatch
order; ``--no_standardize``: the model without its input standardization; ``--set``: a
deepfm hyperparameter. Prints the held-out AUC per seed and their mean. For measurement
only.
"""

import argparse
import collections
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import baseline as bl  # noqa: E402
import deepfm  # noqa: E402


def simulate(prepared, seed=0, staleness=0, max_staleness=0, stale=("sparse", "dense"),
             batch=deepfm.BATCH, order_seed=None, task_records=None):
    """Trains like baseline.train_baseline with stale reads; returns the held-out AUC."""
    model, opts = deepfm.local_model(prepared.num_rows, prepared.stats, seed)
    work, _ = deepfm.local_model(prepared.num_rows, prepared.stats, seed)
    rng = np.random.default_rng(1000 + seed)
    hi = max(staleness, max_staleness)
    history = collections.deque(maxlen=hi + 1)  # snapshots before each step, oldest first
    sparse_stale = "sparse" in stale
    names = [n for n, _ in model.dense_net.named_parameters()]
    dense_stale = [("dense" in stale or n.split(".")[0] in stale) for n in names]
    emb, wemb = model.embedding.weight, work.embedding.weight
    dparams = list(model.dense_net.parameters())
    wparams = list(work.dense_net.parameters())
    for dense, cat, labels in bl.batches(prepared, batch, order_seed=order_seed,
                                               task_records=task_records):
        s = staleness if hi == staleness else int(rng.integers(staleness, hi + 1))
        if hi == 0:
            net = model
        else:
            history.append((emb.detach().clone() if sparse_stale else None,
                            [p.detach().clone() for p in dparams]))
            old = history[max(0, len(history) - 1 - s)]
            wemb.data = old[0] if sparse_stale else emb.data
            for wp, p, o, st in zip(wparams, dparams, old[1], dense_stale):
                wp.data = o if st else p.data
            net = work
            for p in work.parameters():
                p.grad = None
        loss = deepfm.loss_fn(net(dense, cat), labels)
        for o in opts:
            o.zero_grad()
        loss.backward()
        if net is work:
            emb.grad = wemb.grad
            for p, wp in zip(dparams, wparams):
                p.grad = wp.grad
        for o in opts:
            o.step()
    return bl.evaluate(model, prepared)["auc"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", required=True, help="manifest.json of elastic_ps.synth")
    ap.add_argument("--staleness", type=int, default=0, help="updates each read is late")
    ap.add_argument("--max_staleness", type=int, default=0, help="> staleness: random")
    ap.add_argument("--stale", default="sparse,dense", help="which parameters read stale")
    ap.add_argument("--seeds", default="0,1,2", help="initialisation seeds")
    ap.add_argument("--order_seed", type=int, default=None,
                    help="shuffle the batches' order with this seed (default: file order)")
    ap.add_argument("--task_records", type=int, default=None,
                    help="minibatches within tasks of this many records, as the workers")
    ap.add_argument("--set", action="append", default=[],
                    help="NAME=VALUE: override a deepfm hyperparameter (e.g. SPARSE_LR=0.2)")
    ap.add_argument("--no_standardize", action="store_true",
                    help="train without the input standardization (mean 0, std 1)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for kv in args.set:
        k, v = kv.split("=", 1)
        setattr(deepfm, k, type(getattr(deepfm, k))(v))
    with open(args.manifest) as f:
        m = json.load(f)
    stats = deepfm.input_stats(m)
    if args.no_standardize:
        stats = ([0.0] * len(stats[0]), [1.0] * len(stats[1]))
    prepared = bl.prepare([(e["path"], e["records"]) for e in m["files"]],
                          m["holdout"]["path"], stats)
    aucs = [simulate(prepared, int(s), args.staleness, args.max_staleness,
                     tuple(args.stale.split(",")), order_seed=args.order_seed,
                     task_records=args.task_records)
            for s in args.seeds.split(",")]
    print(f"staleness {args.staleness}..{max(args.staleness, args.max_staleness)} "
          f"stale={args.stale} {' '.join(args.set)}: AUC "
          f"{' '.join(f'{a:.4f}' for a in aucs)} mean {np.mean(aucs):.4f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
