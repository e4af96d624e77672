"""elastic_ps.routing (the C++ functions, bound) equals the C++ routing of the pods
(common/routing/hash.h, run by route_hash_tool) value for value, and golden values."""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from elastic_ps import routing

# Printed by route_hash_tool (the C++ functions): (table, id, RouteHash, vshard of 256).
GOLDEN = [
    ("emb", 0, 16323032099361013110, 118),
    ("emb", 1, 13211719431694875956, 52),
    ("emb", -1, 7595177507497739503, 239),
    ("emb", 42, 259639154254354209, 33),
    ("emb", 2**63 - 1, 5053643016343589855, 223),
    ("emb", -(2**63), 12898960611015990402, 130),
    ("emb", 123456789012, 2356185982732637614, 174),
    ("user/ids.v2", 7, 12384580390875419934, 30),
    ("", 5, 16334476278097966642, 50),
]
NAME_HASHES = {"emb": 14045626733740132655, "user/ids.v2": 17025325337186078315,
               "": 14695981039346656037}
DENSE_VSHARDS_256 = {"emb": 118, "user/ids.v2": 185, "": 155}


def test_golden_values():
    for name, h in NAME_HASHES.items():
        assert routing.name_hash(name) == h
    for table, i, route, v in GOLDEN:
        h = routing.name_hash(table)
        assert int(routing.route_hash(h, [i])[0]) == route, (table, i)
        assert int(routing.vshards(table, np.array([i]), 256)[0]) == v
    for name, v in DENSE_VSHARDS_256.items():
        assert routing.dense_vshard(name, 256) == v


def test_scalar_and_vector_agree():
    ids = np.random.default_rng(1).integers(-(2**63), 2**63 - 1, size=1000, dtype=np.int64)
    h = routing.name_hash("t")
    vec = routing.route_hash(h, ids)
    for i, r in zip(ids[:200], vec[:200]):
        assert routing.mix64_int(h ^ routing.mix64_int(int(i) & (2**64 - 1))) == int(r)


def test_input_forms():
    a = routing.vshards("emb", [1, 2, 3], 64)
    assert a.dtype == np.uint32 and a.shape == (3,)
    assert np.array_equal(routing.vshards("emb", np.array([[1, 2, 3]], dtype=np.int32), 64), a)
    assert np.array_equal(routing.vshards("emb", np.array([1, 2, 3], dtype=np.uint64), 64), a)
    # uint64 ids are their int64 bit patterns
    big = np.array([2**64 - 1], dtype=np.uint64)
    assert np.array_equal(routing.vshards("emb", big, 256), routing.vshards("emb", [-1], 256))
    with pytest.raises(ValueError):
        routing.as_ids([1.5])
    with pytest.raises(ValueError):
        routing.vshards("emb", [1], 100)  # not a power of two
    assert routing.as_ids([]).shape == (0,)


def test_static_owners_match_cxx_rule():
    for v, p in [(64, 2), (256, 3), (8, 8), (1, 1), (256, 7)]:
        owner = routing.static_owners(v, p)
        assert [int(o) for o in owner] == [x * p // v for x in range(v)]
    with pytest.raises(ValueError):
        routing.static_owners(4, 5)


def _tool():
    path = os.environ.get("PS_ROUTE_HASH_BINARY")
    if not path:
        b = os.environ.get("PS_BUILD_DIR")
        root = Path(b) if b else Path(__file__).resolve().parents[3] / "build"
        path = str(root / "tests" / "route_hash_tool")
    if not Path(path).is_file():
        pytest.skip(f"route_hash_tool not built ({path})")
    return path


@pytest.mark.parametrize("table", ["emb", "a", "user/ids.v2", "x" * 128, "tëst"])
def test_many_ids_against_cxx(table):
    rng = np.random.default_rng(len(table))
    ids = np.concatenate([
        np.arange(-1000, 1000, dtype=np.int64),
        rng.integers(-(2**63), 2**63 - 1, size=5000, dtype=np.int64),
        np.array([2**63 - 1, -(2**63)], dtype=np.int64),
    ])
    text = table + "\n" + "\n".join(str(int(i)) for i in ids) + "\n"
    out = subprocess.run([_tool()], input=text.encode("utf-8"), capture_output=True, check=True,
                         timeout=30).stdout.decode().splitlines()
    assert out[0] == f"NAME_HASH {routing.name_hash(table)}"
    assert out[1] == f"DENSE_VSHARD_256 {routing.dense_vshard(table, 256)}"
    rows = np.array([line.split() for line in out[2:]], dtype=object)
    assert len(rows) == len(ids)
    cxx_ids = np.array([int(x) for x in rows[:, 0]], dtype=np.int64)
    cxx_hash = np.array([int(x) for x in rows[:, 1]], dtype=np.uint64)
    cxx_v = np.array([int(x) for x in rows[:, 2]], dtype=np.uint32)
    assert np.array_equal(cxx_ids, ids)
    assert np.array_equal(routing.route_hash(routing.name_hash(table), ids), cxx_hash)
    assert np.array_equal(routing.vshards(table, ids, 256), cxx_v)
