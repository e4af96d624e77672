"""Worker: a training process's membership in a job (master registration, lease
heartbeats, the task loop, reports, graceful leave on SIGTERM).

    w = Worker("127.0.0.1:50050", "my-job")
    w.create_job(files=[("data/part-0", 10000)], epochs=2, records_per_task=1000)
    w.install_sigterm_handler()
    for task in w.tasks():
        with w.task_scope(task) as t:
            n = train_on(task.file, task.first_record, task.end_record, w.client)
            t.records = n
    w.leave()

The protocol is the C++ WorkerSession's (client/worker_session.h, bound as
elastic_ps._core.WorkerSession): a C++ thread renews the lease every lease_ms/3; a lost
lease (the process stalled, or the master expired it) means the master re-queued the
worker's tasks: the session registers again under the same id (a new incarnation, which
also becomes the PushKey incarnation of its client) and logs it; results of tasks held
before are refused by the master (report raises TaskLostError) and must be discarded.
Master calls retry under the C++ client's one retry policy (common/rpc/retry_policy.h).
This module turns the session's answers into Task objects, master_pb2 messages and
exceptions, and runs the task loop (in Python, so that a SIGTERM handler runs between two
polls).
"""

import contextlib
import logging
import signal
import threading

import grpc

from ._native import core
from ._stubs import master_pb2
from .client import PsClient, core_options
from .errors import PsError
from .security import Security

log = logging.getLogger("elastic_ps.worker")


class TaskLostError(PsError):
    """The master no longer counts this worker as the task's holder (its lease was lost and
    the task re-queued, or the worker re-registered): discard the task's result."""


class Task:
    """A range of records [first_record, end_record) of `file` to train on or evaluate."""

    __slots__ = ("job", "task_id", "file", "first_record", "end_record", "kind", "epoch",
                 "attempt", "incarnation", "proto")

    def __init__(self, proto, incarnation):
        self.proto = proto
        self.job = proto.job
        self.task_id = int(proto.task_id)
        self.file = proto.file
        self.first_record = int(proto.first_record)
        self.end_record = int(proto.end_record)
        self.kind = "eval" if proto.kind == master_pb2.Task.EVAL else "train"
        self.epoch = int(proto.epoch)
        self.attempt = int(proto.attempt)
        self.incarnation = incarnation  # of the worker that received it

    @staticmethod
    def _of(t):
        """A Task from the session's answer (a dict of WorkerTask's fields)."""
        proto = master_pb2.Task(job=t["job"], task_id=t["task_id"], file=t["file"],
                                first_record=t["first_record"], end_record=t["end_record"],
                                kind=master_pb2.Task.EVAL if t["eval"] else master_pb2.Task.TRAIN,
                                epoch=t["epoch"], attempt=t["attempt"])
        return Task(proto, int(t["incarnation"]))

    @property
    def records(self):
        return self.end_record - self.first_record

    def __repr__(self):
        return (f"Task(job={self.job!r}, task_id={self.task_id}, file={self.file!r}, "
                f"records=[{self.first_record}, {self.end_record}), kind={self.kind!r}, "
                f"epoch={self.epoch}, attempt={self.attempt})")


class _Scope:
    """What task_scope reports when the body ends without an exception."""

    def __init__(self, task):
        self.task = task
        self.records = task.records
        self.table_pushes = {}
        self.ok = True
        self.error = ""


class Worker:
    """A worker of `job` registered with the master at `master` (host:port).

    worker_id 0: the master assigns a new id; another: a new incarnation of that id (a
    restarted worker). deadline_s / max_attempts: per master call (and the client's unless
    client_options says otherwise). client_options: PsClient's keyword arguments for
    `client`. security: TLS and token (default: Security.from_env()). Thread-safe."""

    def __init__(self, master, job, *, heartbeat=True, worker_id=0, poll_interval_s=0.2,
                 deadline_s=10.0, max_attempts=10, client_options=None, security=None):
        self.master = master
        self.job = job
        self._poll = float(poll_interval_s)
        if not self._poll > 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s}")
        self._lock = threading.Lock()
        self._exit_after_stop = False
        self._wake = threading.Event()  # stop(): end a poll wait at once
        self._left = False
        self._client = None
        self._client_options = dict(client_options or {})
        self._client_options.setdefault("deadline_s", deadline_s)
        self._client_options.setdefault("max_attempts", max_attempts)
        # TLS and token of every call (elastic_ps.security); default: the environment's.
        security = security if security is not None else Security.from_env()
        self._client_options.setdefault("security", security)
        o = core.WorkerOptions()
        o.master = master
        o.job = job
        o.worker_id = int(worker_id)
        o.heartbeat = bool(heartbeat)
        o.poll_interval_ms = max(1, int(self._poll * 1000))
        session_args = {k: v for k, v in self._client_options.items() if k != "max_workers"}
        o.client = core_options(master, **session_args)
        self._session = core.WorkerSession(o)  # registers; raises PsError
        log.info("worker %d registered (incarnation %d, lease %d ms)", self.worker_id,
                 self.incarnation, self.lease_ms)

    # ---- membership (the session's) ----

    @property
    def worker_id(self):
        return self._session.worker_id

    @property
    def incarnation(self):
        """Changes when the session registers again after a lost lease."""
        return self._session.incarnation

    @property
    def lease_ms(self):
        return self._session.lease_ms

    @property
    def reregistrations(self):
        """Registrations after the first (lost leases)."""
        return self._session.reregistrations

    @property
    def client(self):
        """A PsClient through the same master whose pushes carry this worker's identity
        (kept current by the session when it registers again)."""
        with self._lock:
            if self._client is not None:
                return self._client
        client = PsClient(master=self.master, worker_id=self.worker_id,
                          incarnation=self.incarnation,
                          **self._client_options)  # connecting may take a while: unlocked
        with self._lock:
            if self._client is None and not self._left:
                try:
                    self._session.attach_client(client._core)  # the identity, from now on
                except PsError:
                    client.close()
                    raise
                self._client = client
                return client
            other = self._client
        client.close()
        if other is None:
            raise PsError(grpc.StatusCode.FAILED_PRECONDITION, "the worker left the job")
        return other

    def leave(self):
        """Leaves the job for good: stops heartbeating, tells the master (tasks still held
        go back to the queue) and closes the client. Idempotent: later calls return 0."""
        with self._lock:
            if self._left:
                return 0
            self._left = True
            client, self._client = self._client, None
        requeued = 0
        try:
            requeued = self._session.leave()
        except PsError as e:
            log.warning("LeaveWorker of worker %d: %s", self.worker_id, e)
        if client is not None:
            client.close()
        log.info("worker %d left (%d tasks re-queued)", self.worker_id, requeued)
        return requeued

    def close(self):
        self.leave()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.leave()

    # ---- jobs and tasks ----

    def create_job(self, files, epochs=1, records_per_task=1000, eval_files=()):
        """Creates this worker's job (idempotent for an identical definition; ALREADY_EXISTS
        for another). files / eval_files: [(path, records), ...]. Returns the task count."""
        return int(self._session.create_job([(str(p), int(r)) for p, r in files], int(epochs),
                                            int(records_per_task),
                                            [(str(p), int(r)) for p, r in eval_files]))

    def get_task(self):
        """One GetTask: a Task, "wait" or "done". After a lost lease the session registers
        again and this answers "wait"."""
        state, task = self._session.get_task()
        return Task._of(task) if state == "task" else state

    def tasks(self):
        """Yields this job's tasks until the job is done (or SIGTERM was received, once the
        current task is reported: see install_sigterm_handler); waits while the master says
        WAIT. Each task must be reported (report / task_scope) before the next is asked."""
        while not self.stopping:
            t = self.get_task()
            if t == "done":
                return
            if t == "wait":
                self._wake.wait(self._poll)
                continue
            yield t
        log.info("worker %d stops taking tasks (SIGTERM); leaving", self.worker_id)
        self.leave()
        if self._exit_after_stop:
            raise SystemExit(0)

    def report(self, task, ok=True, records=None, error="", table_pushes=None):
        """Reports a task finished (ok) or failed (error text). Retried with the same
        arguments; a retry of an accepted report is fine. Returns True when the job is done.
        Raises TaskLostError when the master gave the task to someone else meanwhile."""
        job_done, _, lost, reason = self._session.report_task(
            task.job, task.task_id, task.first_record, task.end_record, task.incarnation,
            bool(ok), -1 if records is None else int(records), "" if ok else str(error),
            {str(t): int(n) for t, n in (table_pushes or {}).items()})
        if lost:
            raise TaskLostError(grpc.StatusCode.FAILED_PRECONDITION, reason)
        return bool(job_done)

    @contextlib.contextmanager
    def task_scope(self, task):
        """Reports `task` when the block ends: ok with scope.records / scope.table_pushes
        (settable in the block), or failed with the exception's text if it raises (the
        exception propagates; the master hands the task out again)."""
        scope = _Scope(task)
        try:
            yield scope
        except BaseException as e:
            try:
                self.report(task, ok=False, error=f"{type(e).__name__}: {e}")
            except PsError as report_error:
                log.warning("reporting failure of %s: %s", task, report_error)
            raise
        self.report(task, ok=scope.ok, records=scope.records, error=scope.error,
                    table_pushes=scope.table_pushes)

    def install_sigterm_handler(self, exit_after=False):
        """On SIGTERM (Kubernetes preemption): tasks() stops after the current task (which
        the loop body still reports), then the worker leaves (LeaveWorker) and the loop
        ends, so the program runs to its end. With exit_after, tasks() raises
        SystemExit(0) right after leaving. Call from the main thread."""
        def handler(signum, frame):
            log.warning("worker %d: signal %d, finishing the current task then leaving",
                        self.worker_id, signum)
            self.stop()
        signal.signal(signal.SIGTERM, handler)
        self._exit_after_stop = exit_after

    @property
    def stopping(self):
        """True once SIGTERM was received (or stop() called)."""
        return self._session.stopping

    def stop(self):
        """Asks tasks() to end after the current task (what SIGTERM does)."""
        self._session.request_stop()
        self._wake.set()

    def status(self):
        """The master's StatusResponse (pods, workers, jobs, progress)."""
        return master_pb2.StatusResponse.FromString(self._session.status())

    def job_info(self):
        """This job's JobInfo from the master's status, or None."""
        for j in self.status().jobs:
            if j.name == self.job:
                return j
        return None

    def _pause_heartbeats_for_test(self, seconds):
        """Tests: no heartbeat for `seconds` from now (a stalled process)."""
        self._session.pause_heartbeats_for_test(max(1, int(seconds * 1000)))
