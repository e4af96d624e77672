"""elastic_ps: the Python worker SDK of the elastic parameter server.

    from elastic_ps import PsClient, PsError, Worker

PsClient pulls and pushes embedding rows and dense tensors (elastic_ps.client); Worker
registers with the master, heartbeats and iterates the job's tasks (elastic_ps.worker).
Both are the C++ client library (client/ps_client.h) bound as the extension
elastic_ps._core; it and the gRPC modules are built into build/python (docs/python.md).
"""

import pkgutil as _pkgutil

from ._paths import build_python_dirs as _build_python_dirs

# The extension is built into <build>/python/elastic_ps: a directory of this package too.
__path__ = _pkgutil.extend_path(__path__, __name__)
for _d in _build_python_dirs():
    if (_d / __name__).is_dir() and str(_d / __name__) not in __path__:
        __path__.append(str(_d / __name__))

from .errors import PsError, TableConflictError  # noqa: E402,F401
from .client import PsClient  # noqa: E402,F401
from .worker import Task, TaskLostError, Worker  # noqa: E402,F401

__all__ = ["PsClient", "PsError", "TableConflictError", "Task", "TaskLostError", "Worker"]
