"""python3 -m elastic_ps.manifest: record counts, the dense statistics, the format that
train_worker.py / baseline.py read, and its errors."""

import json
import math
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYROOT = os.path.dirname(HERE)
sys.path.insert(0, PYROOT)

from elastic_ps import criteo, manifest, synth  # noqa: E402


def _line(label, ints, cats):
    return "\t".join([str(label)] + ["" if i is None else str(i) for i in ints]
                     + ["" if c is None else f"{c:08x}" for c in cats]) + "\n"


def _write(path, lines):
    with open(path, "w") as f:
        f.writelines(lines)
    return str(path)


@pytest.fixture
def files(tmp_path):
    """Two small training files (3 and 2 records, the second without a final newline) and a
    held-out file; integer feature I1 takes known values, the others are empty or 0."""
    rest = [0] * 12
    cats = [0xDEADBEEF] + [None] * 25
    a = _write(tmp_path / "a.tsv", [_line(1, [0] + rest, cats), _line(0, [3] + rest, cats),
                                    _line(0, [None] + [None] * 12, cats)])
    b = _write(tmp_path / "b.tsv", [_line(1, [-5] + rest, cats), _line(1, [8] + rest, cats)])
    with open(b) as f:
        text = f.read()
    with open(b, "w") as f:
        f.write(text.rstrip("\n"))
    h = _write(tmp_path / "h.tsv", [_line(0, [1] + rest, cats)] * 4)
    return a, b, h


def test_counts_and_statistics(files, tmp_path):
    a, b, h = files
    m = manifest.build([a, b], holdout=h)
    assert [e["records"] for e in m["files"]] == [3, 2] and m["records"] == 5
    assert m["holdout"] == {"path": os.path.abspath(h), "records": 4}
    # I1 after log(1 + max(x, 0)): 0, log 4, 0 (empty), 0 (negative), log 9.
    xs = [0.0, math.log(4), 0.0, 0.0, math.log(9)]
    mean = sum(xs) / 5
    std = math.sqrt(sum(x * x for x in xs) / 5 - mean * mean)
    assert m["dense_mean"][0] == pytest.approx(mean, rel=1e-6)
    assert m["dense_std"][0] == pytest.approx(std, rel=1e-5)
    assert m["dense_std"][1] == 1.0  # a constant feature: reported as 1
    assert (m["dense_mean"], m["dense_std"]) == criteo.dense_stats([(a, 3), (b, 2)])


def test_the_cli_writes_what_the_workers_read(files, tmp_path):
    a, b, h = files
    out = tmp_path / "m.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [PYROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    r = subprocess.run([sys.executable, "-m", "elastic_ps.manifest", "--out", str(out),
                        "--holdout", h, "--check", a, b], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert "5 training records in 2 files, 4 held out" in r.stdout
    m = manifest.load(str(out))
    assert m == json.load(open(out))
    assert m["ctr"] == pytest.approx(3 / 5)
    sys.path.insert(0, os.path.join(PYROOT, "examples"))
    import deepfm

    assert deepfm.input_stats(m) == (m["dense_mean"], m["dense_std"])
    # Errors: a missing file, a held-out file that is trained on, no files.
    r = subprocess.run([sys.executable, "-m", "elastic_ps.manifest", "--out", str(out),
                        str(tmp_path / "nope.tsv")], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "nope.tsv" in r.stderr
    r = subprocess.run([sys.executable, "-m", "elastic_ps.manifest", "--out", str(out),
                        "--holdout", a, a, b], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "also a training file" in r.stderr


def test_check_reports_a_malformed_line(files, tmp_path):
    a, b, h = files
    # In the held-out file, which the statistics do not read: only --check parses it.
    bad = _write(tmp_path / "bad.tsv", open(h).readlines() + ["1\t2\t3\n"])
    assert manifest.build([a, b], holdout=bad)["holdout"]["records"] == 5
    with pytest.raises(ValueError, match="line 5 has 3 fields"):
        manifest.build([a, b], holdout=bad, check=True)


def test_relative_paths_and_the_synth_format(tmp_path):
    d = tmp_path / "data"
    m = synth.generate(str(d), records=300, files=2, seed=2, holdout=50)
    loaded = manifest.load(str(d / "manifest.json"))
    assert loaded["files"] == m["files"] and loaded["holdout"] == m["holdout"]
    rebuilt = manifest.build([e["path"] for e in m["files"]], m["holdout"]["path"])
    for k in ("files", "records", "holdout", "dense_mean", "dense_std"):
        assert rebuilt[k] == m[k], k
    # A manifest moved with its data, its paths relative to it.
    rel = {"files": [{"path": "train-00000.tsv", "records": 150}], "holdout": None}
    (d / "rel.json").write_text(json.dumps(rel))
    assert manifest.load(str(d / "rel.json"))["files"][0]["path"] == str(d / "train-00000.tsv")
    (d / "broken.json").write_text(json.dumps({"files": [{"path": "x"}]}))
    with pytest.raises(ValueError, match="records"):
        manifest.load(str(d / "broken.json"))
