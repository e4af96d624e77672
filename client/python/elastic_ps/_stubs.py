"""Locates the generated gRPC modules (the package `proto`, built into build/python).

They are generated at build time (CMake target ps_python_stubs) and never committed.
Found, in order: on sys.path as is (PYTHONPATH=client/python:build/python), in
$PS_BUILD_DIR/python, in <repo>/build/python next to this source tree.
"""

import os
import sys
from pathlib import Path


def _candidates():
    build = os.environ.get("PS_BUILD_DIR")
    repo = Path(__file__).resolve().parents[3]
    out = []
    if build:
        b = Path(build)
        if not b.is_absolute():
            b = repo / b
        out.append(b / "python")
    out.append(repo / "build" / "python")
    return out


def _load():
    try:
        from proto import master_pb2, master_pb2_grpc, ps_pb2, ps_pb2_grpc  # noqa: F401

        return ps_pb2, ps_pb2_grpc, master_pb2, master_pb2_grpc
    except ImportError as first:
        error = first
    for path in _candidates():
        if not (path / "proto" / "ps_pb2.py").is_file():
            continue
        # A namespace package `proto` (the source tree's proto/ dir) may be cached.
        for name in [m for m in sys.modules if m == "proto" or m.startswith("proto.")]:
            del sys.modules[name]
        sys.path.insert(0, str(path))
        from proto import master_pb2, master_pb2_grpc, ps_pb2, ps_pb2_grpc  # noqa: F401

        return ps_pb2, ps_pb2_grpc, master_pb2, master_pb2_grpc
    raise ImportError(
        "elastic_ps needs the generated modules proto.ps_pb2 / proto.master_pb2: build the "
        "project (scripts/build.sh generates them into build/python) and set "
        "PYTHONPATH=client/python:build/python, or PS_BUILD_DIR=<build dir> "
        f"(first error: {error})")


ps_pb2, ps_pb2_grpc, master_pb2, master_pb2_grpc = _load()
