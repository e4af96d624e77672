"""Evaluation metrics in numpy (no scikit-learn): AUC and log loss."""

import numpy as np


def auc(labels, scores):
    """Area under the ROC curve: the probability that a random positive scores above a
    random negative, ties counting one half (the Mann-Whitney U statistic from average
    ranks). ``labels`` are 0/1 (anything > 0.5 is positive), ``scores`` any real numbers.
    Raises ValueError when the lengths differ or one class is absent."""
    y = np.asarray(labels).reshape(-1) > 0.5
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if len(y) != len(s):
        raise ValueError(f"auc: {len(y)} labels but {len(s)} scores")
    pos = int(y.sum())
    neg = len(y) - pos
    if pos == 0 or neg == 0:
        raise ValueError(f"auc: needs both classes, got {pos} positives and {neg} negatives")
    order = np.argsort(s, kind="mergesort")
    ss = s[order]
    # Average 1-based rank of each run of equal scores.
    starts = np.flatnonzero(np.r_[True, ss[1:] != ss[:-1]])
    ends = np.r_[starts[1:], len(ss)]
    avg = (starts + ends + 1) / 2.0
    ranks = np.empty(len(ss))
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def logloss(labels, probs, eps=1e-7):
    """Mean binary cross-entropy of probabilities ``probs`` against 0/1 ``labels``."""
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    p = np.clip(np.asarray(probs, dtype=np.float64).reshape(-1), eps, 1 - eps)
    return float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())
