"""Where the build puts what elastic_ps needs besides its sources: the generated protobuf
modules (build/python/proto) and the C++ extension (build/python/elastic_ps/_core*.so).
Searched after sys.path: $PS_BUILD_DIR/python, then <repo>/build/python next to this
source tree."""

import os
from pathlib import Path


def build_python_dirs():
    """The candidate build/python directories, in order."""
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
