"""Routing of rows to vshards and pods, computed by the C++ rules themselves
(common/routing/hash.h and vshards.h, bound in elastic_ps._core): the SDK has no copy.

    Mix64(x)          the splitmix64 finalizer
    NameHash(name)    FNV-1a 64 of the UTF-8 bytes of a table or tensor name
    RouteHash(h, id)  Mix64(h ^ Mix64(uint64(id)))
    VShardOf(r, V)    r & (V - 1), V a power of two
    DenseVShard(n, V) VShardOf(RouteHash(NameHash(n), 0), V)
    StaticOwner(v, V, P) = v * P // V   (pod i of a static map of P pods)

Arrays in, arrays out: one C++ loop per call, no per-element Python work.
"""

import numpy as np

from ._native import core as _core


def as_ids(ids):
    """Any integer array-like (or scalar) as a 1-D native int64 array (C-contiguous).

    uint64 values are reinterpreted bit for bit (the C++ routing casts int64 to uint64);
    non-integer input raises ValueError."""
    a = np.asarray(ids)
    if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
        raise ValueError(f"ids must be integers, got dtype {a.dtype}")
    a = a.reshape(-1)
    if a.dtype == np.uint64:
        a = a.view(np.int64)
    return np.ascontiguousarray(a, dtype=np.int64)


def mix64(x):
    """Mix64 of every element of a uint64 (or int64) array -> a new uint64 array."""
    a = np.asarray(x)
    shape = a.shape
    return _core.mix64_array(as_ids(a)).reshape(shape)


def mix64_int(x):
    """Mix64 of one Python int (0 <= x < 2^64)."""
    return _core.mix64(int(x) & ((1 << 64) - 1))


def name_hash(name):
    """FNV-1a 64 of a table or tensor name (str or bytes), as a Python int."""
    return _core.name_hash(name if isinstance(name, str) else bytes(name))


def route_hash(table_hash, ids):
    """RouteHash(table_hash, id) for every id (int64 array-like) -> uint64 array."""
    return _core.route_hash(int(table_hash), as_ids(ids))


def check_num_vshards(num_vshards):
    """num_vshards as an int if it is a power of two in [1, 65536]; else ValueError."""
    return _core.check_num_vshards(int(num_vshards))


def vshards(table, ids, num_vshards):
    """The vshard of every id of `table` (name or NameHash int) -> uint32 array."""
    h = name_hash(table) if isinstance(table, (str, bytes)) else int(table)
    return _core.vshards(h, as_ids(ids), int(num_vshards))


def dense_vshard(name, num_vshards):
    """The vshard of dense tensor `name` (routed as row 0 of its name)."""
    return _core.dense_vshard(name if isinstance(name, str) else bytes(name), int(num_vshards))


def static_owners(num_vshards, num_pods):
    """owner[v] of the static map of `num_pods` pods (ps-server --shard=i/num_pods)."""
    if int(num_pods) < 0:
        raise ValueError(f"a static map of {num_pods} pods")
    return _core.static_owners(int(num_vshards), int(num_pods))
