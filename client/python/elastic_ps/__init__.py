"""elastic_ps: the Python worker SDK of the elastic parameter server.

    from elastic_ps import PsClient, PsError, Worker

PsClient pulls and pushes embedding rows and dense tensors (elastic_ps.client); Worker
registers with the master, heartbeats and iterates the job's tasks (elastic_ps.worker).
The gRPC modules are generated at build time into build/python (see docs/python.md).
"""

from .client import PsClient, PsError, TableConflictError  # noqa: F401
from .worker import Task, Worker  # noqa: F401

__all__ = ["PsClient", "PsError", "TableConflictError", "Task", "Worker"]
