"""The C++ extension elastic_ps._core (client/python/_core), with a clear error when it has
not been built."""

try:
    from . import _core  # noqa: F401
except ImportError as error:  # pragma: no cover - a build problem, not a code path
    raise ImportError(
        "elastic_ps needs its C++ extension elastic_ps._core: build the project "
        "(scripts/build.sh builds it into build/python/elastic_ps) and set "
        "PYTHONPATH=client/python:build/python, or PS_BUILD_DIR=<build dir> "
        f"(error: {error})") from error

core = _core
