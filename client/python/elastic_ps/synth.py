"""Synthetic Criteo-format data from a hidden ground-truth model.

    /usr/bin/python3 -m elastic_ps.synth --out DIR --records N --files K --seed S \\
        --holdout M [--vocab_scale X]

writes ``DIR/train-00000.tsv`` .. (K files, N records in all), ``DIR/holdout.tsv`` (M
records from the same distribution) and ``DIR/manifest.json``::

    {"files": [{"path": ..., "records": n}, ...], "holdout": {"path": ..., "records": m},
     "seed": S, "bayes_auc": ..., "ctr": ..., "dense_mean": [13 floats],
     "dense_std": [13 floats], ...}

(``dense_mean`` / ``dense_std``: ``criteo.dense_stats`` of the training files, the input
standardization of examples/deepfm.py, stored so readers need not recompute it.) The
format is elastic_ps.manifest's, which writes it for data of any other origin.

The hidden model (all of it a pure function of the seed):

- Categorical field f has a vocabulary of V_f values (from tens to ``vocab_scale`` x 1M,
  spread log-uniformly over the fields) drawn with a bounded Zipf law of exponent s_f in
  [1.05, 1.4]; rank r becomes the 32-bit value ``hash(seed, f, r)``, written as 8 hex
  digits. Some fields are empty with a small probability. Large N gives millions of
  distinct ids.
- logit = bias + sum_f a_f * w(f, v_f) + sum_d b_d * z_d + sum_(f,g) c_fg * u(f, v_f) u(g, v_g)
  where w and u are standard-normal-like values drawn from ``hash(seed, f, v)`` (so any
  process can evaluate the model without a table), z_d is the standardized log1p of
  integer feature d, and (f, g) run over a few field pairs (a factorization-machine
  learnable interaction).
- label ~ Bernoulli(sigmoid(logit)). The manifest records the Bayes AUC on the holdout
  file (the AUC of the true probabilities, the best any model can reach).

Everything is vectorized numpy; the output is written in blocks of ``BLOCK`` records.
"""

import argparse
import os
import sys
import time

import numpy as np

from elastic_ps import criteo
from elastic_ps import manifest as manifest_format
from elastic_ps.metrics import auc

BLOCK = 100_000
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x):
    """The splitmix64 finalizer over a uint64 array (wrapping arithmetic)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x + _GOLD
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def _hash(*parts):
    h = np.uint64(0)
    for p in parts:
        h = splitmix64(np.asarray(p).astype(np.uint64) ^ h)
    return h


def _unit(h):
    """uint64 hash -> float64 uniform in (0, 1)."""
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def _gauss(h):
    """uint64 hash -> standard normal (Box-Muller on two halves of two hashes)."""
    u1 = _unit(h)
    u2 = _unit(splitmix64(h))
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


class HiddenModel:
    """The ground truth for one seed; see the module docstring."""

    NUM_PAIRS = 6

    def __init__(self, seed, vocab_scale=1.0):
        self.seed = int(seed)
        rng = np.random.default_rng([self.seed, 7])
        nf = criteo.NUM_CAT
        # Vocabulary sizes: log-uniform from 20 to vocab_scale * 2M, shuffled over fields.
        top = max(100.0, 2e6 * vocab_scale)
        self.vocab = np.unique(np.round(np.geomspace(20, top, nf)).astype(np.int64))
        self.vocab = rng.permutation(np.resize(self.vocab, nf))
        self.zipf_s = rng.uniform(1.05, 1.4, nf)
        self.missing = np.where(rng.random(nf) < 0.3, rng.uniform(0.01, 0.2, nf), 0.0)
        # Weight scale per field: a few strong fields, many weak ones.
        self.field_scale = rng.gamma(1.0, 0.14, nf)
        self.dense_scale = rng.normal(0.0, 0.2, criteo.NUM_DENSE)
        # Integer features: geometric-like counts with per-feature means.
        self.dense_mean = np.exp(rng.uniform(0.0, 6.0, criteo.NUM_DENSE))
        pairs = set()
        while len(pairs) < self.NUM_PAIRS:
            f, g = sorted(rng.choice(nf, 2, replace=False).tolist())
            pairs.add((f, g))
        self.pairs = sorted(pairs)
        self.pair_scale = rng.uniform(0.2, 0.4, self.NUM_PAIRS)
        self.bias = -1.3

    def weight(self, field, value):
        """w(f, v): the first-order weight of value(s) ``value`` of field ``field``."""
        return _gauss(_hash(self.seed, 1, field, value))

    def factor(self, field, value):
        """u(f, v): the interaction factor of value(s) ``value`` of field ``field``."""
        return _gauss(_hash(self.seed, 2, field, value))

    def sample(self, n, stream):
        """n records from random stream ``stream``: (labels int, ints int64 (n,13) with -1
        meaning empty, values int64 (n,26) with -1 meaning empty, probabilities)."""
        rng = np.random.default_rng([self.seed, 11, stream])
        nf = criteo.NUM_CAT
        values = np.empty((n, nf), dtype=np.int64)
        logit = np.full(n, self.bias)
        for f in range(nf):
            s, v = self.zipf_s[f], float(self.vocab[f])
            u = rng.random(n)
            # Bounded Zipf by inverse CDF of the continuous power law on [1, V+1).
            one = 1.0 - s
            r = np.floor((1.0 + u * ((v + 1.0) ** one - 1.0)) ** (1.0 / one)).astype(np.int64)
            r = np.clip(r, 1, int(v))
            val = (_hash(self.seed, 3, f, r) & np.uint64(0xFFFFFFFF)).astype(np.int64)
            miss = rng.random(n) < self.missing[f]
            val[miss] = -1
            values[:, f] = val
            logit += self.field_scale[f] * np.where(miss, 0.0, self.weight(f, val))
        for (f, g), c in zip(self.pairs, self.pair_scale):
            a, b = values[:, f], values[:, g]
            term = self.factor(f, a) * self.factor(g, b)
            logit += c * np.where((a < 0) | (b < 0), 0.0, term)
        ints = rng.geometric(1.0 / (1.0 + self.dense_mean), size=(n, criteo.NUM_DENSE)) - 1
        ints = ints.astype(np.int64)
        z = np.log1p(ints)
        z = (z - np.log1p(self.dense_mean)) / 1.0
        logit += z @ self.dense_scale
        empty = rng.random((n, criteo.NUM_DENSE)) < 0.05
        ints[empty] = -1
        p = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(n) < p).astype(np.int64)
        return labels, ints, values, p


def format_records(labels, ints, values):
    """Criteo TSV bytes for the records (ints/values of -1 are written empty)."""
    n = len(labels)
    cols = [np.where(labels > 0, b"1", b"0").tolist()]
    for d in range(ints.shape[1]):
        col = ints[:, d].astype("S20").tolist()
        if (ints[:, d] < 0).any():
            col = [b"" if x == b"-1" else x for x in col]
        cols.append(col)
    hexdig = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    shifts = np.arange(28, -1, -4, dtype=np.int64)
    for f in range(values.shape[1]):
        v = values[:, f]
        nib = (np.maximum(v, 0)[:, None] >> shifts) & 15
        chars = np.ascontiguousarray(hexdig[nib]).view("S8").ravel()
        col = chars.tolist()
        if (v < 0).any():
            for i in np.flatnonzero(v < 0).tolist():
                col[i] = b""
        cols.append(col)
    if n == 0:
        return b""
    return b"\n".join(map(b"\t".join, zip(*cols))) + b"\n"


def write_file(model, path, records, stream):
    """Writes ``records`` records of stream ``stream`` to ``path`` (atomically); returns
    the labels and true probabilities."""
    tmp = f"{path}.tmp"
    labels_all, p_all = [], []
    with open(tmp, "wb") as out:
        for b, start in enumerate(range(0, records, BLOCK)):
            n = min(BLOCK, records - start)
            labels, ints, values, p = model.sample(n, stream * 1_000_003 + b)
            out.write(format_records(labels, ints, values))
            labels_all.append(labels)
            p_all.append(p)
    os.replace(tmp, path)
    if not labels_all:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(labels_all), np.concatenate(p_all)


def generate(out, records, files, seed, holdout, vocab_scale=1.0, log=None):
    """Writes the data set (see the module docstring) and returns the manifest dict."""
    if records < 0 or holdout < 0 or files < 1:
        raise ValueError(f"need records >= 0, holdout >= 0, files >= 1 (got {records}, "
                         f"{holdout}, {files})")
    os.makedirs(out, exist_ok=True)
    model = HiddenModel(seed, vocab_scale)
    t0 = time.time()
    entries = []
    pos = 0
    labels_sum = 0
    for k in range(files):
        n = records // files + (1 if k < records % files else 0)
        path = os.path.join(out, f"train-{k:05d}.tsv")
        labels, _ = write_file(model, path, n, stream=k + 1)
        labels_sum += int(labels.sum())
        entries.append({"path": os.path.abspath(path), "records": n})
        pos += n
    hpath = os.path.join(out, "holdout.tsv")
    hlabels, hp = write_file(model, hpath, holdout, stream=0)
    mean, std = (criteo.dense_stats([(e["path"], e["records"]) for e in entries])
                 if records else (None, None))
    manifest = {
        "files": entries,
        "records": records,
        "holdout": {"path": os.path.abspath(hpath), "records": holdout},
        "seed": seed,
        "vocab_scale": vocab_scale,
        "ctr": labels_sum / records if records else 0.0,
        "bayes_auc": auc(hlabels, hp) if holdout and 0 < hlabels.sum() < holdout else None,
        "dense_mean": mean,
        "dense_std": std,
        "seconds": round(time.time() - t0, 3),
    }
    manifest_format.write(os.path.join(out, "manifest.json"), manifest)
    if log:
        size = sum(os.path.getsize(e["path"]) for e in entries) + os.path.getsize(hpath)
        log(f"synth: {records} training records in {files} files + {holdout} held out, "
            f"{size / 1e6:.1f} MB in {manifest['seconds']:.1f} s; ctr {manifest['ctr']:.3f}, "
            f"Bayes AUC on holdout {manifest['bayes_auc']}")
    return manifest


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python3 -m elastic_ps.synth",
        description="Writes Criteo-format TSV files drawn from a hidden logistic model, and "
        "manifest.json (files, record counts, holdout file, Bayes AUC).")
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--records", type=int, required=True, help="training records in all")
    ap.add_argument("--files", type=int, default=1, help="training files to split them in")
    ap.add_argument("--seed", type=int, default=1, help="seed of the hidden model and samples")
    ap.add_argument("--holdout", type=int, default=0, help="records in holdout.tsv")
    ap.add_argument("--vocab_scale", type=float, default=1.0,
                    help="scales the vocabulary sizes (1: the largest field has 2M values)")
    args = ap.parse_args(argv)
    try:
        generate(args.out, args.records, args.files, args.seed, args.holdout,
                 args.vocab_scale, log=lambda m: print(m, flush=True))
    except (ValueError, OSError) as e:
        print(f"synth: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
