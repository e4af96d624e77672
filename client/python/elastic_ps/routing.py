"""Routing of rows to vshards and pods: a vectorized numpy port of common/routing/hash.h.

These functions must give exactly the values of the C++ ones (the pods refuse ids of
vshards they do not own):

    Mix64(x)          the splitmix64 finalizer
    NameHash(name)    FNV-1a 64 of the UTF-8 bytes of a table or tensor name
    RouteHash(h, id)  Mix64(h ^ Mix64(uint64(id)))
    VShardOf(r, V)    r & (V - 1), V a power of two
    DenseVShard(n, V) VShardOf(RouteHash(NameHash(n), 0), V)
    StaticOwner(v, V, P) = v * P // V   (pod i of a static map of P pods)

uint64 arithmetic in numpy wraps modulo 2^64 like C++; numpy's overflow warnings (raised
for scalars only) are silenced.
"""

import numpy as np

_MASK64 = (1 << 64) - 1
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)


def mix64(x):
    """splitmix64 finalizer of a uint64 array (returns a new uint64 array)."""
    x = np.array(x, dtype=np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> _S30
        x *= _M1
        x ^= x >> _S27
        x *= _M2
        x ^= x >> _S31
    return x


def mix64_int(x):
    """Mix64 of one Python int (0 <= x < 2^64), in pure Python."""
    x &= _MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return x


def name_hash(name):
    """FNV-1a 64 of a table or tensor name (str or bytes), as a Python int."""
    data = name.encode("utf-8") if isinstance(name, str) else bytes(name)
    h = 0xCBF29CE484222325
    for c in data:
        h ^= c
        h = (h * 0x100000001B3) & _MASK64
    return h


def as_ids(ids):
    """Any integer array-like (or scalar) as a 1-D little-endian int64 array.

    uint64 values are reinterpreted bit for bit (the C++ routing casts int64 to uint64);
    non-integer input raises ValueError."""
    a = np.asarray(ids)
    if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
        raise ValueError(f"ids must be integers, got dtype {a.dtype}")
    a = a.reshape(-1)
    if a.dtype == np.uint64:
        a = a.view(np.int64)
    return np.ascontiguousarray(a, dtype="<i8")


def route_hash(table_hash, ids):
    """RouteHash(table_hash, id) for every id (int64 array-like) -> uint64 array."""
    ids = as_ids(ids)
    return mix64(np.uint64(table_hash) ^ mix64(ids.view(np.uint64)))


def check_num_vshards(num_vshards):
    v = int(num_vshards)
    if v < 1 or v > 65536 or v & (v - 1):
        raise ValueError(f"num_vshards = {v} must be a power of two in [1, 65536]")
    return v


def vshards(table, ids, num_vshards):
    """The vshard of every id of `table` (name or NameHash int) -> uint32 array."""
    h = name_hash(table) if isinstance(table, (str, bytes)) else int(table)
    v = check_num_vshards(num_vshards)
    return (route_hash(h, ids) & np.uint64(v - 1)).astype(np.uint32)


def dense_vshard(name, num_vshards):
    """The vshard of dense tensor `name` (routed as row 0 of its name)."""
    v = check_num_vshards(num_vshards)
    return mix64_int(name_hash(name) ^ mix64_int(0)) & (v - 1)


def static_owners(num_vshards, num_pods):
    """owner[v] of the static map of `num_pods` pods (ps-server --shard=i/num_pods)."""
    v = check_num_vshards(num_vshards)
    if num_pods < 1 or num_pods > v:
        raise ValueError(
            f"a static map of {num_pods} pods needs 1..num_vshards ({v}) pods")
    return (np.arange(v, dtype=np.uint64) * np.uint64(num_pods) // np.uint64(v)).astype(np.uint32)
