"""The synthetic data generator: determinism, format, distribution, learnability."""

import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from elastic_ps import criteo, synth  # noqa: E402
from elastic_ps.metrics import auc  # noqa: E402


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def test_cli_is_deterministic_and_writes_a_manifest(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, ".."))
    outs = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        out = tmp_path / name
        subprocess.run([sys.executable, "-m", "elastic_ps.synth", "--out", str(out),
                        "--records", "2500", "--files", "3", "--seed", str(seed),
                        "--holdout", "400"], check=True, env=env, capture_output=True)
        outs.append(out)
    m = json.loads(_read(outs[0] / "manifest.json"))
    assert [e["records"] for e in m["files"]] == [834, 833, 833]
    assert m["holdout"]["records"] == 400 and m["seed"] == 3
    for e in m["files"] + [m["holdout"]]:
        assert criteo.count_records(e["path"]) == e["records"]
    for f in ["train-00000.tsv", "train-00002.tsv", "holdout.tsv"]:
        assert _read(outs[0] / f) == _read(outs[1] / f)  # same seed: same bytes
        assert _read(outs[0] / f) != _read(outs[2] / f)  # another seed: other data
    # Training files and the holdout are different samples.
    assert _read(outs[0] / "train-00000.tsv")[:500] != _read(outs[0] / "holdout.tsv")[:500]


def test_format_round_trips_through_the_reader():
    model = synth.HiddenModel(9)
    labels, ints, values, _ = model.sample(2000, stream=1)
    buf = synth.format_records(labels, ints, values)
    y, dense, cat = criteo.parse_lines(buf)
    assert (y == labels).all()
    np.testing.assert_allclose(dense, np.log1p(np.maximum(ints, 0)), rtol=1e-6)
    expect = np.where(values < 0, criteo.MISSING_VALUE, values) | (
        np.arange(26, dtype=np.int64) << criteo.FIELD_SHIFT)
    assert (cat == expect).all()
    assert (values < 0).any() and (ints < 0).any()  # empty fields occur


def test_zipf_values_and_many_distinct_ids():
    model = synth.HiddenModel(2)
    _, _, values, _ = model.sample(200_000, stream=1)
    distinct = sum(len(np.unique(values[:, f])) for f in range(26))
    assert distinct > 200_000  # large vocabularies: many ids are seen once
    big = int(np.argmax(model.vocab))
    _, counts = np.unique(values[:, big], return_counts=True)
    counts = np.sort(counts)[::-1]
    # Zipf: the head is heavy, the tail long.
    assert counts[0] > 50 * np.median(counts)
    assert (counts == 1).sum() > 1000


def test_hidden_model_is_learnable():
    """The Bayes AUC is well above 0.5, and a simple model fit on training samples (per
    field, smoothed log-odds of each value) reaches a clearly better-than-chance AUC on
    held-out samples: the labels depend on the features as the docs say."""
    model = synth.HiddenModel(1)
    y, _, v, p = model.sample(100_000, stream=1)
    yt, _, vt, pt = model.sample(20_000, stream=2)
    bayes = auc(yt, pt)
    assert 0.72 < bayes < 0.88
    prior = y.mean()
    base = np.log(prior / (1 - prior))
    score = np.zeros(len(yt))
    for f in range(26):
        vals, inv = np.unique(v[:, f], return_inverse=True)
        pos = np.bincount(inv, weights=y, minlength=len(vals))
        cnt = np.bincount(inv, minlength=len(vals))
        rate = (pos + 20 * prior) / (cnt + 20)
        lo = np.log(rate / (1 - rate)) - base
        idx = np.searchsorted(vals, vt[:, f])
        idx = np.minimum(idx, len(vals) - 1)
        known = vals[idx] == vt[:, f]
        score += np.where(known, lo[idx], 0.0)
    learned = auc(yt, score)
    assert learned > 0.62, learned
    assert learned < bayes
    # The probabilities the generator used are the model's: labels follow them.
    assert abs(y.mean() - p.mean()) < 0.01


def test_auc_counts_ties_as_half_and_matches_the_pairwise_definition():
    rng = np.random.default_rng(0)
    y = rng.random(300) < 0.3
    s = rng.integers(0, 20, 300).astype(float)  # many ties
    pos, neg = s[y], s[~y]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert abs(auc(y, s) - pairs / (len(pos) * len(neg))) < 1e-12
    assert auc([0, 1], [0.1, 0.9]) == 1.0
    assert auc([1, 0], [0.1, 0.9]) == 0.0
    assert auc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == 0.5
