#!/usr/bin/env python3
"""Writes the seed corpus of the libFuzzer harnesses (tests/fuzz/corpus/<name>/seed-*).

Usage, from the repository root:  python3 tests/fuzz/make_corpus.py
Each seed is a small, valid (or deliberately odd) input of the harness's format, built here
from the formats' documentation (proto/ps.proto, ps/storage/log_record.h,
proto/export_file.h, HTTP/1.1). Regression inputs (corpus/<name>/regression-*: inputs that
once crashed a harness) are kept as they are. The master's corpus (corpus/create_job) is
tests/fuzz/master.cmake's. Standard library only.
"""
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


# --- protobuf wire format, by hand ---------------------------------------------------------
def varint(v):
    out = bytearray()
    v &= (1 << 64) - 1
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def field(num, wire_type, payload):
    tag = varint((num << 3) | wire_type)
    if wire_type == 0:
        return tag + varint(payload)
    if wire_type == 2:
        return tag + varint(len(payload)) + payload
    return tag + payload  # fixed32 / fixed64: payload already packed


def ids(*v):
    return struct.pack("<%dq" % len(v), *v)


def floats(*v):
    return struct.pack("<%df" % len(v), *v)


def pull_request(epoch, tables, read_only=False):
    m = field(1, 0, epoch) if epoch else b""
    for name, id_bytes in tables:
        m += field(2, 2, (field(1, 2, name) if name else b"") + (field(2, 2, id_bytes) if id_bytes else b""))
    return m + (field(3, 0, 1) if read_only else b"")


def push_request(epoch, key, tables):
    m = field(1, 0, epoch) if epoch else b""
    if key is not None:
        m += field(2, 2, b"".join(field(i + 1, 0, k) for i, k in enumerate(key) if k))
    for name, id_bytes, grads, lr in tables:
        e = field(1, 2, name) + field(2, 2, id_bytes) + field(3, 2, grads)
        if lr:
            e += field(4, 5, struct.pack("<f", lr))
        m += field(3, 2, e)
    return m


def pull_response(epoch, tables, extra=b""):
    m = field(1, 0, epoch) if epoch else b""
    for name, values, entry_extra in tables:
        m += field(2, 2, (field(1, 2, name) if name else b"") + (field(2, 2, values) if values else b"") + entry_extra)
    return m + extra


def wire():
    unknown = field(9, 0, 12345) + field(10, 1, struct.pack("<d", 1.5)) + field(11, 5, b"abcd")
    return {
        # u8 message (0 PullRequest, 1 PushRequest, 2 PullResponse), u8 cut, message
        "pull_request": b"\x00\x00" + pull_request(7, [(b"t", ids(1, 2, -3)), (b"u", b"")], True),
        "pull_request_cut": b"\x00\x05" + pull_request(1 << 40, [(b"emb", ids(*range(40)))]),
        "pull_request_odd_ids": b"\x00\x01" + pull_request(1, [(b"t", b"\x01\x02\x03")]),
        "push_request": b"\x01\x00" + push_request(3, (1, 2, 3), [(b"t", ids(5, -1), floats(0.5, -0.5, 1, 2), 0.1)]),
        "push_request_cut": b"\x01\x07" + push_request(0, (0, 0, 0), [(b"a", ids(1), floats(1), 0), (b"b", ids(2, 3), floats(1, 2, 3), -0.0)]),
        "push_request_odd_grads": b"\x01\x02" + push_request(9, (7, 1, 1 << 63), [(b"t", ids(1), b"\x00" * 7, 0)]),
        "pull_response": b"\x02\x00" + pull_response(300, [(b"small", floats(1, 2, 3), b""), (b"", floats(4), b"")]),
        "pull_response_cut": b"\x02\x03" + pull_response(1, [(b"big", floats(*range(300)), b"")]),
        "pull_response_unknown": b"\x02\x04" + pull_response(5, [(b"t", floats(1, 2), unknown)], unknown),
        "pull_response_repeated": b"\x02\x00" + field(2, 2, field(2, 2, floats(1)) + field(2, 2, floats(2, 3)) + field(1, 2, b"x")),
    }


# --- push log records (ps/storage/log_record.h) ----------------------------------------------
def record(key, entries, version=1):
    return struct.pack("<BQQQ", version, *key) + b"".join(entries)


def name(n):
    return struct.pack("<H", len(n)) + n


def table_entry(n, lr, id_list, steps, dim, grads):
    return b"\x01" + name(n) + struct.pack("<fII", lr, len(id_list), dim) + ids(*id_list) + \
        struct.pack("<%dQ" % len(steps), *steps) + floats(*grads)


def dense_entry(n, lr, step, grads):
    return b"\x02" + name(n) + struct.pack("<fQI", lr, step, len(grads)) + floats(*grads)


def install_entry(n, id_list, steps, row_floats, values):
    return b"\x03" + name(n) + struct.pack("<II", len(id_list), row_floats) + ids(*id_list) + \
        struct.pack("<%dQ" % len(steps), *steps) + floats(*values)


def dense_install(n, step, values):
    return b"\x04" + name(n) + struct.pack("<QI", step, len(values)) + floats(*values)


def log_record():
    t = table_entry(b"emb", 0.01, [1, -2], [1, 5], 2, [0.5, -0.5, 1, 2])
    return {
        "key_only": record((1, 1, 1), []),
        "table": record((7, 2, 99), [t]),
        "exact_key": record((7, 2, 98), [t], version=3),  # a key recorded exactly
        "two_tables": record((7, 2, 100), [t, table_entry(b"u", 0, [3], [2], 3, [1, 2, 3])]),
        "dense": record((1, 1, 2), [dense_entry(b"mlp/w", 0.1, 3, [1, 2, 3, 4])]),
        "install": record((0, 0, 0), [install_entry(b"emb", [5, 6], [9, 9], 3, [1, 2, 3, 4, 5, 6])]),
        "dense_install": record((0, 0, 0), [dense_install(b"bias", 4, [0.25, 0.5])]),
        "mixed": record((3, 1, 7), [t, dense_entry(b"d", 0, 1, [1]), install_entry(b"e", [1], [1], 1, [1]),
                                    dense_install(b"d", 2, [2, 3])]),
        "truncated": record((1, 1, 1), [t])[:-3],
        "zero_rows": record((1, 1, 1), [table_entry(b"t", 0, [], [], 0xFFFFFFFF, [])]),
    }


# --- export files (proto/export_file.h) -----------------------------------------------------
def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def export(kind, spec, dim, slots, blocks):
    header = b"PSEXPORT" + struct.pack("<III", 1, kind, len(spec)) + spec + struct.pack("<II", dim, slots)
    out = header + struct.pack("<I", crc32c(header))
    for recs in blocks + [[]]:
        payload = b"".join(struct.pack("<qQ", i, s) + floats(*v) for i, s, v in recs)
        out += struct.pack("<IQ", len(recs), len(payload)) + payload + struct.pack("<I", crc32c(payload) if payload else 0)
    return out


def export_file():
    spec = field(1, 2, b"emb") + field(2, 0, 2)  # TableSpec name, dim
    rows = [(i, i + 3, [i, -i, 0.5, 0.25]) for i in range(-2, 3)]
    table = export(1, spec, 2, 2, [rows[:3], rows[3:]])
    return {
        # u8 flags (bit 0: keep the checksums as they are), then the file
        "table": b"\x01" + table,
        "table_fix_checksums": b"\x00" + table,
        "dense": b"\x01" + export(2, field(1, 2, b"bias"), 3, 0, [[(0, 7, [1, 2, 3])]]),
        "empty": b"\x01" + export(1, b"", 4, 8, []),
        # a delta's deleted ids: kind 3, no floats per record
        "deleted_ids": b"\x01" + export(3, spec, 0, 0, [[(-7, 0, []), (1 << 40, 0, [])], [(3, 0, [])]]),
        "deleted_ids_with_floats": b"\x01" + export(3, spec, 1, 0, [[(-7, 0, [1])]]),
        "truncated": b"\x01" + table[:-5],
        "newer_version": b"\x00" + b"PSEXPORT" + struct.pack("<I", 2) + table[12:],
    }


def metrics_http():
    return {
        "get_metrics": b"GET /metrics HTTP/1.1\r\nHost: pod:9100\r\nAccept: text/plain\r\n\r\n",
        "pipelined": b"GET /healthz HTTP/1.1\r\n\r\nHEAD /metrics?x=1 HTTP/1.0\r\nConnection: close\r\n\r\n",
        "post": b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        "bad_line": b"GET /metrics\r\n\r\n GET  /healthz  HTTP/1.1 \r\n\r\n",
        "partial": b"GET /metrics HTTP/1.1\r\nHost: x\r\n",
    }


def main():
    for harness, seeds in (("wire", wire()), ("log_record", log_record()),
                           ("export_file", export_file()), ("metrics_http", metrics_http())):
        d = os.path.join(ROOT, harness)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            if f.startswith("seed-"):
                os.remove(os.path.join(d, f))
        for seed_name, data in seeds.items():
            with open(os.path.join(d, "seed-" + seed_name), "wb") as f:
                f.write(data)
        print("%s: %d seeds" % (d, len(seeds)))


if __name__ == "__main__":
    main()
