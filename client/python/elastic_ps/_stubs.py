"""Locates the generated gRPC modules (the package `proto`, built into build/python).

They are generated at build time (CMake target ps_python_stubs) and never committed.
Found, in order: on sys.path as is (PYTHONPATH=client/python:build/python), in
$PS_BUILD_DIR/python, in <repo>/build/python next to this source tree.
"""

import sys

from ._paths import build_python_dirs


def _load():
    try:
        from proto import master_pb2, master_pb2_grpc, ps_pb2, ps_pb2_grpc  # noqa: F401

        return ps_pb2, ps_pb2_grpc, master_pb2, master_pb2_grpc
    except ImportError as first:
        error = first
    for path in build_python_dirs():
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
