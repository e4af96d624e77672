"""The data manifest: which Criteo-format files a job trains on, their record counts, the
held-out file, and the model's input standardization.

    /usr/bin/python3 -m elastic_ps.manifest --out M.json [--holdout FILE] [--check] FILE...

counts the records of each training FILE (and of the held-out file), computes the
dense-feature statistics (``criteo.dense_stats`` over the training files: the same numbers
``examples/deepfm.py`` input_stats gives) and writes ``M.json``, which
examples/train_worker.py, baseline.py, evaluate.py and scripts/demo.sh read::

    {"files": [{"path": "/abs/train.tsv", "records": n}, ...], "records": total,
     "holdout": {"path": "/abs/holdout.tsv", "records": m} or null,
     "dense_mean": [13 floats], "dense_std": [13 floats], ...}

``elastic_ps.synth`` writes the same format (plus what it knows of its hidden model).
``--check`` also parses every record (a malformed line is an error naming it) and records
the click rate ``ctr``. Paths are stored absolute; :func:`load` also accepts paths
relative to the manifest's directory (a manifest moved with its data).
"""

import argparse
import json
import os
import sys

from elastic_ps import criteo

CHECK_BATCH = 65536


def build(files, holdout=None, check=False, log=None):
    """The manifest dict of training ``files`` (paths) and an optional ``holdout`` path.
    Raises ValueError for no files, a missing or unreadable file, a held-out file that is
    also a training file, or (``check``) a malformed record."""
    if not files:
        raise ValueError("a manifest needs at least one training file")
    paths = [os.path.abspath(f) for f in files]
    if len(set(paths)) != len(paths):
        raise ValueError("a training file is listed twice")
    hpath = os.path.abspath(holdout) if holdout else None
    if hpath in paths:
        raise ValueError(f"the held-out file {holdout} is also a training file")
    entries = [{"path": p, "records": _count(p)} for p in paths]
    total = sum(e["records"] for e in entries)
    if total == 0:
        raise ValueError("the training files hold no records")
    mean, std = criteo.dense_stats([(e["path"], e["records"]) for e in entries])
    out = {"files": entries, "records": total,
           "holdout": {"path": hpath, "records": _count(hpath)} if hpath else None,
           "dense_mean": mean, "dense_std": std}
    if check:
        clicks = sum(_check(e["path"], e["records"], log) for e in entries)
        if hpath:
            _check(hpath, out["holdout"]["records"], log)
        out["ctr"] = clicks / total
    return out


def _count(path):
    try:
        return criteo.count_records(path)
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror or e}") from None


def _check(path, records, log):
    """Parses every record of ``path``; returns the number of clicks."""
    clicks = 0
    for first in range(0, records, CHECK_BATCH):
        b = criteo.read_all(path, first, min(records, first + CHECK_BATCH))
        clicks += int(b.labels.sum())
    if log:
        log(f"manifest: {path}: {records} records parsed")
    return clicks


def write(path, manifest):
    """Writes ``manifest`` (a dict) to ``path`` as JSON, atomically."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, path)


def load(path):
    """The manifest at ``path`` with its paths made absolute (relative ones are taken
    from the manifest's directory). Raises ValueError when it lacks files or counts."""
    with open(path) as f:
        m = json.load(f)
    base = os.path.dirname(os.path.abspath(path))
    files = m.get("files")
    if not isinstance(files, list) or not files:
        raise ValueError(f"{path}: no \"files\" list")
    for e in files + ([m["holdout"]] if m.get("holdout") else []):
        if not isinstance(e, dict) or "path" not in e or not isinstance(
                e.get("records"), int) or e["records"] < 0:
            raise ValueError(f"{path}: every file needs a \"path\" and a \"records\" count "
                             f"(got {e!r})")
        e["path"] = os.path.join(base, e["path"])
    return m


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python3 -m elastic_ps.manifest",
        description="Counts the records of Criteo-format TSV files (label, 13 integer and "
        "26 categorical features, tab-separated), computes the dense-feature statistics of "
        "the training files and writes the manifest that train_worker.py, baseline.py and "
        "scripts/demo.sh read.")
    ap.add_argument("files", nargs="+", metavar="FILE", help="training files, in order")
    ap.add_argument("--out", required=True, help="the manifest to write (JSON)")
    ap.add_argument("--holdout", help="held-out file for evaluation (not trained on)")
    ap.add_argument("--check", action="store_true",
                    help="also parse every record (reports the first malformed line) and "
                    "record the click rate")
    args = ap.parse_args(argv)
    try:
        m = build(args.files, args.holdout, args.check,
                  log=lambda s: print(s, flush=True))
        write(args.out, m)
    except (ValueError, OSError) as e:
        print(f"manifest: {e}", file=sys.stderr)
        return 1
    held = f", {m['holdout']['records']} held out" if m["holdout"] else ", no held-out file"
    print(f"manifest: {m['records']} training records in {len(m['files'])} files{held}; "
          f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
