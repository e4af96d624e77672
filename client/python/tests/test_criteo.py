"""The Criteo reader: exact record ranges, parsing, id mapping, the offset index."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from elastic_ps import criteo  # noqa: E402
from elastic_ps import synth  # noqa: E402


def _line(label, ints, cats):
    return "\t".join([str(label)] + ["" if v is None else str(v) for v in ints]
                     + ["" if c is None else c for c in cats]) + "\n"


def _write(path, lines, trailing_newline=True):
    text = "".join(lines)
    if not trailing_newline:
        text = text[:-1]
    with open(path, "w") as f:
        f.write(text)


def _numbered_file(path, n, seed=0):
    """A file whose record i has I1 = i (so a batch tells which records it holds)."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        ints = [i] + [int(x) if x >= 0 else None for x in rng.integers(-1, 50, 12)]
        cats = [None if rng.random() < 0.1 else f"{rng.integers(0, 1 << 32):08x}"
                for _ in range(26)]
        lines.append(_line(int(rng.random() < 0.3), ints, cats))
    _write(path, lines)
    return lines


def test_parse_fields_and_id_mapping(tmp_path):
    p = str(tmp_path / "a.tsv")
    ints = [0, 1, None, 99, -5, 3, 4, 5, 6, 7, 8, 9, 123456789]
    cats = ["0000000a", None, "ffffffff", "DEADBEEF"] + [f"{i:08x}" for i in range(22)]
    _write(p, [_line(1, ints, cats), _line(0, [None] * 13, [None] * 26)])
    b = criteo.read_all(p)
    assert b.labels.tolist() == [1.0, 0.0]
    assert b.labels.dtype == np.float32 and b.dense.dtype == np.float32
    assert b.cat.dtype == np.int64 and b.cat.shape == (2, 26)
    expect = [0.0 if v is None or v < 0 else np.log1p(v) for v in ints]
    np.testing.assert_allclose(b.dense[0], expect, rtol=1e-6)
    assert (b.dense[1] == 0).all()
    assert b.cat[0, 0] == criteo.feature_id(0, 10)
    assert b.cat[0, 1] == criteo.feature_id(1, None)
    assert b.cat[0, 2] == (2 << 33) | 0xFFFFFFFF
    assert b.cat[0, 3] == criteo.feature_id(3, 0xDEADBEEF)
    assert b.cat[1].tolist() == [criteo.feature_id(f, None) for f in range(26)]
    # Fields never collide: the same value in two fields gives two ids.
    assert criteo.feature_id(0, 7) != criteo.feature_id(1, 7)
    assert criteo.field_of(b.cat[0]).tolist() == list(range(26))


@pytest.mark.parametrize("n", [1, 4095, 4096, 4097, 10000])
def test_every_range_reads_exactly_its_records(tmp_path, n):
    p = str(tmp_path / "n.tsv")
    _numbered_file(p, n)
    assert criteo.count_records(p) == n
    full = criteo.read_all(p)
    rng = np.random.default_rng(n)
    cuts = sorted(set([0, n] + rng.integers(0, n + 1, 6).tolist()))
    seen = []
    for first, end in zip(cuts, cuts[1:]):
        got = []
        for b in criteo.read_range(p, first, end, batch_size=700):
            assert len(b) <= 700
            ids = np.rint(np.expm1(b.dense[:, 0])).astype(int)
            assert ids.tolist() == list(range(b.first_record, b.first_record + len(b)))
            got.extend(ids.tolist())
            np.testing.assert_array_equal(b.cat, full.cat[b.first_record:b.first_record + len(b)])
        assert got == list(range(first, end))
        seen.extend(got)
    assert seen == list(range(n))  # every record exactly once across the "tasks"


def test_small_chunks_and_no_trailing_newline(tmp_path):
    p = str(tmp_path / "t.tsv")
    lines = _numbered_file(p, 50)
    p2 = str(tmp_path / "t2.tsv")
    _write(p2, lines, trailing_newline=False)
    assert criteo.count_records(p2) == 50
    a = criteo.read_all(p)
    b = criteo.read_all(p2)
    np.testing.assert_array_equal(a.cat, b.cat)
    # Tiny read chunks: lines straddle chunk borders.
    chunks = list(criteo.iter_line_chunks(p2, 3, 47, chunk_bytes=37))
    data = b"".join(c for _, c in chunks)
    assert data.decode() == "".join(lines[3:47])


def test_index_is_cached_beside_the_file_and_refreshed_on_change(tmp_path):
    p = str(tmp_path / "c.tsv")
    _numbered_file(p, 9000)
    idx = criteo.line_index(p)
    assert idx.num_lines == 9000 and len(idx.offsets) == 3
    side = f"{p}.idx{criteo.INDEX_STRIDE}.npy"
    assert os.path.exists(side)
    with open(p, "rb") as f:
        data = f.read()
    line_starts = [0] + [i + 1 for i, c in enumerate(data) if c == 10]
    assert idx.offsets.tolist() == [line_starts[0], line_starts[4096], line_starts[8192]]
    criteo._index_cache.clear()
    assert criteo.line_index(p).offsets.tolist() == idx.offsets.tolist()  # from disk
    _numbered_file(p, 100, seed=3)
    os.utime(p, ns=(1, 1))
    assert criteo.count_records(p) == 100


def test_errors_name_the_problem(tmp_path):
    p = str(tmp_path / "bad.tsv")
    _write(p, [_line(1, [1] * 13, ["0000000a"] * 26), "1\t2\t3\n"])
    with pytest.raises(ValueError, match="line 2 has 3 fields"):
        criteo.read_all(p)
    _write(p, [_line(1, [1] * 13, ["zz00000a"] + ["0000000a"] * 25)])
    with pytest.raises(ValueError, match="C1 is not hex"):
        criteo.read_all(p)
    _write(p, [_line(1, [1] * 12 + ["1x"], ["0000000a"] * 26)])
    with pytest.raises(ValueError, match="I13 is not a decimal"):
        criteo.read_all(p)
    _write(p, [_line(2, [1] * 13, ["0000000a"] * 26)])
    with pytest.raises(ValueError, match="label"):
        criteo.read_all(p)
    _write(p, [_line(1, [1] * 13, ["0000000a"] * 26)])
    with pytest.raises(ValueError, match="past the end"):
        list(criteo.read_range(p, 0, 2))


def test_reads_synth_output(tmp_path):
    m = synth.generate(str(tmp_path), records=3000, files=2, seed=5, holdout=500)
    for e in m["files"]:
        b = criteo.read_all(e["path"])
        assert len(b) == e["records"] == criteo.count_records(e["path"])
        assert set(np.unique(b.labels).tolist()) <= {0.0, 1.0}
        assert (criteo.field_of(b.cat) == np.arange(26)).all()


def test_random_lines_match_a_plain_python_parse(tmp_path):
    rng = np.random.default_rng(7)
    lines, expect_dense, expect_cat = [], [], []
    for _ in range(3000):
        ints = []
        for _ in range(13):
            r = rng.random()
            ints.append(None if r < 0.2 else int(rng.integers(-10**6, 0)) if r < 0.3
                        else int(rng.integers(0, 10**int(rng.integers(1, 18)))))
        cats = [None if rng.random() < 0.2 else f"{int(rng.integers(0, 1 << 32)):08x}"
                for _ in range(26)]
        lines.append(_line(int(rng.integers(0, 2)), ints, cats))
        expect_dense.append([np.log1p(max(v or 0, 0)) for v in ints])
        expect_cat.append([criteo.feature_id(f, None if c is None else int(c, 16))
                           for f, c in enumerate(cats)])
    p = str(tmp_path / "r.tsv")
    _write(p, lines)
    b = criteo.read_all(p)
    np.testing.assert_allclose(b.dense, np.array(expect_dense, np.float32), rtol=1e-6)
    assert b.cat.tolist() == expect_cat


def test_dense_stats_over_the_first_records_of_each_file(tmp_path):
    m = synth.generate(str(tmp_path), records=6000, files=2, seed=3, holdout=0)
    files = [(e["path"], e["records"]) for e in m["files"]]
    # 2 files, sample 4000: the first 2000 records of each.
    mean, std = criteo.dense_stats(files, sample=4000)
    x = np.concatenate([criteo.read_all(p, 0, 2000).dense for p, _ in files]).astype(np.float64)
    np.testing.assert_allclose(mean, x.mean(0), rtol=1e-9)
    np.testing.assert_allclose(std, x.std(0), rtol=1e-6)
    assert (criteo.dense_stats(files, sample=4000)) == (mean, std)  # deterministic
    # The manifest holds the stats of the default sample (here every record).
    full = np.concatenate([criteo.read_all(p).dense for p, _ in files]).astype(np.float64)
    np.testing.assert_allclose(m["dense_mean"], full.mean(0), rtol=1e-9)
    np.testing.assert_allclose(m["dense_std"], full.std(0), rtol=1e-6)


def test_dense_stats_of_a_constant_feature_is_std_one(tmp_path):
    p = tmp_path / "c.tsv"
    p.write_text("".join("1\t" + "\t".join(["7"] * 13) + "\t" + "\t".join([""] * 26) + "\n"
                         for _ in range(10)))
    mean, std = criteo.dense_stats([(str(p), 10)])
    np.testing.assert_allclose(mean, [np.log(8.0)] * 13, rtol=1e-6)
    assert std == [1.0] * 13
    with pytest.raises(ValueError):
        criteo.dense_stats([])


def test_batch_sizes_plain_and_balanced():
    assert criteo.batch_sizes(10000, 256) == [256] * 39 + [16]
    assert criteo.batch_sizes(10000, 256, drop_last=True) == [256] * 39
    assert criteo.batch_sizes(10000, 256, balanced=True) == [250] * 40
    assert criteo.batch_sizes(5000, 256, balanced=True) == [250] * 20
    sizes = criteo.batch_sizes(1001, 100, balanced=True)
    assert sum(sizes) == 1001 and len(sizes) == 11 and max(sizes) - min(sizes) <= 1
    assert criteo.batch_sizes(0, 256, balanced=True) == []
    assert criteo.batch_sizes(3, 256, balanced=True) == [3]
    with pytest.raises(ValueError):
        criteo.batch_sizes(10, 0)


@pytest.mark.parametrize("first,end", [(0, 10000), (17, 4113), (4095, 4097)])
def test_balanced_read_range_reads_its_records_in_nearly_equal_batches(tmp_path, first, end):
    p = str(tmp_path / "n.tsv")
    _numbered_file(p, 10000)
    got, sizes = [], []
    for b in criteo.read_range(p, first, end, batch_size=256, balanced=True):
        ids = np.rint(np.expm1(b.dense[:, 0])).astype(int)
        assert ids.tolist() == list(range(b.first_record, b.first_record + len(b)))
        got.extend(ids.tolist())
        sizes.append(len(b))
    assert got == list(range(first, end))
    assert sizes == criteo.batch_sizes(end - first, 256, balanced=True)
