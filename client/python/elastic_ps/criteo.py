"""Reader for Criteo-format TSV files, by record range, as numpy batches.

Format (the Criteo display-advertising challenge layout), one record per line:

    label \\t I1 .. I13 \\t C1 .. C26 \\n

- label: 0 or 1.
- I1..I13: integer features (decimal, may be negative, may be empty).
- C1..C26: categorical features, each empty or exactly 8 hex digits (a 32-bit value).

What a batch holds (see :class:`Batch`):

- ``labels``: float32 (B,).
- ``dense``: float32 (B, 13), ``log(1 + max(x, 0))``; an empty field is 0.
- ``cat``: int64 (B, 26) feature ids. Field f (0-based) with hex value v maps to
  ``(f << 33) | v`` and an empty field to ``(f << 33) | (1 << 32)``: every (field, value)
  pair gets its own id and ids of different fields never collide. The mapping is
  reversible (``field = id >> 33``) and needs no hashing: the parameter server hashes ids
  itself when it routes them to shards, so consecutive ids spread evenly.

Reading a range ``[first, end)`` seeks through a sparse line-offset index (the byte offset
of every ``INDEX_STRIDE``-th line), built once per file by one pass of ``np.flatnonzero``
over the bytes, kept in memory and, when the directory is writable, saved beside the file
as ``<file>.idx.npy`` (reused while the file's size and mtime match). Parsing is
vectorized: a chunk of complete lines is split on tabs/newlines with numpy and every field
converted without a per-field Python loop.
"""

import os
import threading

import numpy as np

NUM_DENSE = 13
NUM_CAT = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_CAT
INDEX_STRIDE = 4096
FIELD_SHIFT = 33
MISSING_VALUE = 1 << 32

_CHUNK_BYTES = 8 << 20  # bytes parsed at a time (whole lines)
_INT_WIDTH = 19  # longest integer field accepted, sign included (fits int64)

_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i
_DIGIT = np.full(256, 255, dtype=np.uint8)
for _i in range(10):
    _DIGIT[ord("0") + _i] = _i


class Batch:
    """One minibatch: ``labels`` (B,) float32, ``dense`` (B, 13) float32, ``cat`` (B, 26)
    int64, and ``first_record``, the record number of row 0 within its file."""

    __slots__ = ("labels", "dense", "cat", "first_record")

    def __init__(self, labels, dense, cat, first_record):
        self.labels = labels
        self.dense = dense
        self.cat = cat
        self.first_record = first_record

    def __len__(self):
        return len(self.labels)


def feature_id(field, value):
    """The id of categorical field ``field`` (0..25) with 32-bit ``value`` (None: empty)."""
    if not 0 <= field < NUM_CAT:
        raise ValueError(f"categorical field {field} out of range [0, {NUM_CAT})")
    v = MISSING_VALUE if value is None else int(value)
    if not 0 <= v <= MISSING_VALUE:
        raise ValueError(f"categorical value {value} is not a 32-bit value")
    return (field << FIELD_SHIFT) | v


def field_of(ids):
    """The categorical field (0..25) of each id made by :func:`feature_id` / the reader."""
    return np.asarray(ids, dtype=np.int64) >> FIELD_SHIFT


# ---- the line-offset index ----

_index_cache = {}
_index_lock = threading.Lock()


class LineIndex:
    """Sparse line offsets of one file: ``offsets[k]`` is the byte offset of line
    ``k * stride``; ``num_lines`` counts records (a last line without newline included)."""

    def __init__(self, offsets, num_lines, stride=INDEX_STRIDE):
        self.offsets = offsets
        self.num_lines = num_lines
        self.stride = stride


def _build_index(path, stride):
    offsets = [0]
    num_lines = 0
    pos = 0
    last_byte = None
    with open(path, "rb") as f:
        while True:
            buf = f.read(_CHUNK_BYTES)
            if not buf:
                break
            nl = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == 10)
            # Line number of the line starting after each newline: num_lines + j + 1.
            starts = num_lines + 1 + np.arange(len(nl))
            take = nl[starts % stride == 0]
            offsets.extend((pos + take + 1).tolist())
            num_lines += len(nl)
            pos += len(buf)
            last_byte = buf[-1]
    if last_byte is not None and last_byte != 10:
        num_lines += 1  # a last line without its newline
    elif offsets and offsets[-1] == pos and num_lines % stride == 0 and num_lines > 0:
        offsets.pop()  # the "line" after the final newline does not exist
    return LineIndex(np.asarray(offsets, dtype=np.int64), num_lines, stride)


def line_index(path, stride=INDEX_STRIDE, cache_on_disk=True):
    """The (cached) :class:`LineIndex` of ``path``; rebuilt when the file changed."""
    st = os.stat(path)
    key = (os.path.abspath(path), stride)
    stamp = (st.st_size, st.st_mtime_ns)
    with _index_lock:
        hit = _index_cache.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
    idx = None
    side = f"{path}.idx{stride}.npy"
    if cache_on_disk and os.path.exists(side):
        try:
            arr = np.load(side)
            if arr.ndim == 1 and len(arr) >= 3 and tuple(arr[:2].tolist()) == stamp:
                idx = LineIndex(arr[3:].astype(np.int64), int(arr[2]), stride)
        except (OSError, ValueError):
            idx = None
    if idx is None:
        idx = _build_index(path, stride)
        if cache_on_disk:
            tmp = f"{side}.{os.getpid()}.tmp"
            try:
                with open(tmp, "wb") as f:
                    np.save(f, np.concatenate([np.array([*stamp, idx.num_lines], np.int64),
                                               idx.offsets]))
                os.replace(tmp, side)
            except OSError:  # a read-only data dir: keep the index in memory only
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
    with _index_lock:
        _index_cache[key] = (stamp, idx)
    return idx


def count_records(path):
    """Number of records (lines) in a Criteo file."""
    return line_index(path).num_lines


# ---- parsing ----


def parse_lines(buf, origin="<buffer>", first_line=0):
    """Parses complete lines (bytes, each ending in a newline) into (labels, dense, cat).

    Raises ValueError naming ``origin`` and the line for a malformed line.
    """
    a = np.frombuffer(buf, dtype=np.uint8)
    if len(a) == 0:
        return (np.zeros(0, np.float32), np.zeros((0, NUM_DENSE), np.float32),
                np.zeros((0, NUM_CAT), np.int64))
    if a[-1] != 10:
        raise ValueError(f"{origin}: internal error: chunk does not end with a newline")
    if a.size > 1 and (a == 13).any():  # tolerate CRLF line ends
        a = a[a != 13]
    seps = np.flatnonzero((a == 9) | (a == 10))
    nl = np.flatnonzero(a == 10)
    n = len(nl)
    if len(seps) != n * NUM_FIELDS:
        _raise_bad_line(a, nl, origin, first_line)
    seps = seps.reshape(n, NUM_FIELDS)
    if not np.array_equal(seps[:, -1], nl):
        _raise_bad_line(a, nl, origin, first_line)
    starts = np.empty_like(seps)
    starts[:, 1:] = seps[:, :-1] + 1
    starts[0, 0] = 0
    starts[1:, 0] = nl[:-1] + 1
    lens = seps - starts

    # label: one character 0/1
    if not (lens[:, 0] == 1).all():
        bad = int(np.flatnonzero(lens[:, 0] != 1)[0])
        raise ValueError(f"{origin}: line {first_line + bad + 1}: label must be 0 or 1")
    lab = a[starts[:, 0]]
    if not ((lab == 48) | (lab == 49)).all():
        bad = int(np.flatnonzero((lab != 48) & (lab != 49))[0])
        raise ValueError(f"{origin}: line {first_line + bad + 1}: label must be 0 or 1")
    labels = (lab - 48).astype(np.float32)

    dense = _parse_ints(a, starts[:, 1:1 + NUM_DENSE], seps[:, 1:1 + NUM_DENSE], origin,
                        first_line)
    dense = np.log1p(np.maximum(dense, 0).astype(np.float64)).astype(np.float32)

    cat = _parse_hex(a, starts[:, 1 + NUM_DENSE:], lens[:, 1 + NUM_DENSE:], origin, first_line)
    return labels, dense, cat


def _raise_bad_line(a, nl, origin, first_line):
    line_start = 0
    for i, end in enumerate(nl.tolist()):
        fields = int((a[line_start:end] == 9).sum()) + 1
        if fields != NUM_FIELDS:
            raise ValueError(f"{origin}: line {first_line + i + 1} has {fields} fields, "
                             f"expected {NUM_FIELDS} (label, {NUM_DENSE} integer, "
                             f"{NUM_CAT} categorical)")
        line_start = end + 1
    raise ValueError(f"{origin}: malformed lines")


def _parse_ints(a, starts, ends, origin, first_line):
    """Integer fields [starts, ends) (equal shapes (n, k)); empty fields give 0."""
    lens = ends - starts
    if (lens > _INT_WIDTH).any():
        bad = np.argwhere(lens > _INT_WIDTH)[0]
        raise ValueError(f"{origin}: line {first_line + bad[0] + 1}: integer field "
                         f"I{bad[1] + 1} is longer than {_INT_WIDTH} characters")
    width = int(lens.max()) if lens.size else 0
    if width == 0:
        return np.zeros(starts.shape, dtype=np.int64)
    # The `width` bytes that end at each field's end (right-aligned digits), through a
    # window view over the buffer padded in front; column j is the character at
    # end - width + j, a digit of the field when j >= width - len.
    padded = np.concatenate([np.zeros(width, np.uint8), a])
    windows = np.lib.stride_tricks.sliding_window_view(padded, width)
    flat_len = lens.reshape(-1)
    chars = windows[ends.reshape(-1)]
    col = np.arange(width)
    first_col = (width - flat_len)[:, None]
    live = col >= first_col
    neg = (flat_len > 0) & (chars[np.arange(len(chars)), np.minimum(width - flat_len,
                                                                   width - 1)] == 45)
    live &= ~((col == first_col) & neg[:, None])
    d = _DIGIT[chars]
    bad = (d == 255) & live
    if bad.any() or (neg & (flat_len == 1)).any():
        where = int(np.flatnonzero(bad.any(1) | (neg & (flat_len == 1)))[0])
        row, field = divmod(where, starts.shape[1])
        raise ValueError(f"{origin}: line {first_line + row + 1}: integer field "
                         f"I{field + 1} is not a decimal integer")
    scale = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    value = (np.where(live, d, 0).astype(np.int64) * scale).sum(1)
    return np.where(neg, -value, value).reshape(starts.shape)


def _parse_hex(a, starts, lens, origin, first_line):
    ok = (lens == 0) | (lens == 8)
    if not ok.all():
        bad = np.argwhere(~ok)[0]
        raise ValueError(f"{origin}: line {first_line + bad[0] + 1}: categorical field "
                         f"C{bad[1] + 1} must be empty or 8 hex digits")
    present = lens == 8
    v = np.zeros(starts.shape, dtype=np.int64)
    if present.any():
        # 8 bytes at each field start, through a window view (no index arithmetic per byte),
        # hex digits to nibbles by table, nibble pairs to bytes, 4 bytes to a big-endian u32.
        windows = np.lib.stride_tricks.sliding_window_view(a, 8)
        flat = present.reshape(-1)
        nib = _HEX[windows[starts.reshape(-1)[flat]]]
        bad = (nib == 255).any(1)
        if bad.any():
            where = np.flatnonzero(flat)[np.flatnonzero(bad)[0]]
            row, col = divmod(int(where), starts.shape[1])
            raise ValueError(f"{origin}: line {first_line + row + 1}: categorical field "
                             f"C{col + 1} is not hex")
        packed = np.ascontiguousarray((nib[:, 0::2] << 4) | nib[:, 1::2])
        v.reshape(-1)[flat] = packed.view(">u4").reshape(-1)
    v = np.where(present, v, MISSING_VALUE)
    field = np.arange(NUM_CAT, dtype=np.int64) << FIELD_SHIFT
    return v | field


# ---- range reading ----


def iter_line_chunks(path, first, end, chunk_bytes=_CHUNK_BYTES):
    """Yields (first_line, bytes) for records [first, end) of ``path``: every chunk holds
    whole lines (each ending in a newline), in order, exactly the requested lines."""
    idx = line_index(path)
    if not 0 <= first <= end:
        raise ValueError(f"{path}: bad record range [{first}, {end})")
    if end > idx.num_lines:
        raise ValueError(f"{path}: record range [{first}, {end}) is past the end of the file "
                         f"({idx.num_lines} records)")
    if first == end:
        return
    block = first // idx.stride
    line = block * idx.stride
    # Read no further than the indexed line at or after `end` (a task of 10k records
    # used to read and scan a whole chunk of 8 MB).
    stop_block = -(-end // idx.stride)
    left = (int(idx.offsets[stop_block]) - int(idx.offsets[block])
            if stop_block < len(idx.offsets) else None)
    with open(path, "rb") as f:
        f.seek(int(idx.offsets[block]))
        carry = b""
        eof = False
        while line < end:
            want = chunk_bytes if left is None else min(chunk_bytes, left)
            data = b"" if eof or want == 0 else f.read(want)
            if left is not None:
                left -= len(data)
            if not data:
                eof = True
                if not carry:
                    raise ValueError(f"{path}: file shrank while reading line {line}")
                data = b"\n"  # a last line without newline
            buf = carry + data
            cut = buf.rfind(b"\n")
            if cut < 0:
                carry = buf
                continue
            whole, carry = buf[:cut + 1], buf[cut + 1:]
            nl = np.flatnonzero(np.frombuffer(whole, dtype=np.uint8) == 10)
            n = len(nl)
            lo = max(first - line, 0)
            hi = min(end - line, n)
            if hi > lo:
                b0 = 0 if lo == 0 else int(nl[lo - 1]) + 1
                b1 = int(nl[hi - 1]) + 1
                yield line + lo, whole[b0:b1]
            line += n


def batch_sizes(n, batch_size, balanced=False, drop_last=False):
    """The minibatch sizes :func:`read_range` uses for ``n`` records: ``batch_size``
    each and a smaller last one (none with ``drop_last``); or, ``balanced``, ``ceil(n /
    batch_size)`` sizes that differ by at most one (no small last batch: a task of 10000
    records with batch 256 is 40 batches of 250, not 39 of 256 and one of 16)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if n <= 0:
        return []
    if balanced:
        k = -(-n // batch_size)
        base, extra = divmod(n, k)
        return [base + 1] * extra + [base] * (k - extra)
    full, rest = divmod(n, batch_size)
    return [batch_size] * full + ([rest] if rest and not drop_last else [])


def read_range(path, first, end, batch_size=1024, drop_last=False, balanced=False):
    """Yields :class:`Batch` es covering records [first, end) of ``path`` exactly once, in
    order, each of ``batch_size`` records (the last one smaller unless ``drop_last``), or
    with ``balanced`` of the nearly equal sizes of :func:`batch_sizes`."""
    sizes = iter(batch_sizes(end - first, batch_size, balanced, drop_last))
    want = next(sizes, None)
    pend = []  # parsed arrays not yet emitted
    pend_n = 0
    pend_first = first
    for line0, buf in iter_line_chunks(path, first, end):
        labels, dense, cat = parse_lines(buf, path, line0)
        pend.append((labels, dense, cat))
        pend_n += len(labels)
        if want is None or pend_n < want:
            continue
        labels, dense, cat = (np.concatenate(x) for x in zip(*pend))
        s = 0
        while want is not None and pend_n - s >= want:
            yield Batch(labels[s:s + want], dense[s:s + want], cat[s:s + want],
                        pend_first + s)
            s += want
            want = next(sizes, None)
        pend = [(labels[s:], dense[s:], cat[s:])]
        pend_first += s
        pend_n -= s
    if pend_n and not drop_last:
        labels, dense, cat = (np.concatenate(x) for x in zip(*pend))
        yield Batch(labels, dense, cat, pend_first)


def read_all(path, first=0, end=None):
    """Records [first, end) of ``path`` (end None: to the end) as one :class:`Batch`."""
    if end is None:
        end = count_records(path)
    parts = [parse_lines(buf, path, l0) for l0, buf in iter_line_chunks(path, first, end)]
    if not parts:
        labels, dense, cat = parse_lines(b"")
    else:
        labels, dense, cat = (np.concatenate(x) for x in zip(*parts))
    return Batch(labels, dense, cat, first)


STATS_SAMPLE = 100_000


def dense_stats(files, sample=STATS_SAMPLE):
    """Per-feature mean and standard deviation of the 13 ``dense`` features (after the
    reader's ``log(1 + max(x, 0))``) over a deterministic sample of the training files
    ``[(path, records)]``: the first ``max(1000, sample // len(files))`` records of each.
    Returns two lists of 13 floats; a standard deviation below 1e-3 is reported as 1.
    Everyone who passes the same files gets the same numbers (the model's input
    standardization, see examples/deepfm.py)."""
    if not files:
        raise ValueError("dense_stats needs at least one file")
    per_file = max(1000, sample // len(files))
    total = np.zeros(NUM_DENSE)
    total_sq = np.zeros(NUM_DENSE)
    n = 0
    for path, records in files:
        d = read_all(path, 0, min(int(records), per_file)).dense.astype(np.float64)
        total += d.sum(0)
        total_sq += (d * d).sum(0)
        n += len(d)
    if n == 0:
        raise ValueError("dense_stats: the files hold no records")
    mean = total / n
    std = np.sqrt(np.maximum(total_sq / n - mean * mean, 0.0))
    std = np.where(std < 1e-3, 1.0, std)
    return [float(x) for x in mean], [float(x) for x in std]
