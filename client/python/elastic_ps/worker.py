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

A worker's lease is renewed by a daemon thread every lease_ms/3. A lost lease (the process
stalled, or the master expired it) means the master re-queued the worker's tasks: the
worker registers again under the same id (a new incarnation, which also becomes the
PushKey incarnation of its client) and logs it; results of tasks held before are refused
by the master (report raises TaskLostError) and must be discarded.
"""

import contextlib
import logging
import signal
import threading
import time

import grpc

from ._stubs import master_pb2
from .client import PsClient
from .errors import PsError, error_from_status
from .security import Security, make_channel

log = logging.getLogger("elastic_ps.worker")

_RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.DEADLINE_EXCEEDED})


def _error_from_rpc(err, where):
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    return error_from_status(code.value[0], f"{where}: {details}")


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
    """A worker of `job` registered with the master at `master` (host:port)."""

    def __init__(self, master, job, *, heartbeat=True, worker_id=0, poll_interval_s=0.2,
                 deadline_s=10.0, max_attempts=10, client_options=None, security=None):
        self.master = master
        self.job = job
        self._poll = float(poll_interval_s)
        self._lock = threading.Lock()
        self._reregister_lock = threading.Lock()
        self._exit_after_stop = False
        self._stop = threading.Event()  # heartbeat thread
        self._stopping = threading.Event()  # SIGTERM: finish the current task, then leave
        self._left = False
        self._client = None
        self._client_options = dict(client_options or {})
        self._client_options.setdefault("deadline_s", deadline_s)
        self._client_options.setdefault("max_attempts", max_attempts)
        # TLS and token of every call (elastic_ps.security); default: the environment's.
        security = security if security is not None else Security.from_env()
        self._client_options.setdefault("security", security)
        # Master calls of the membership and task loop (the client has its own channel).
        self._rpc = _MasterRpc(master, deadline_s, max_attempts, security)
        self.worker_id = 0
        self.incarnation = 0
        self.lease_ms = 0
        self.reregistrations = 0
        self._register(worker_id)
        self._hb_thread = None
        if heartbeat:
            self._hb_thread = threading.Thread(target=self._heartbeat_loop,
                                               name="elastic_ps-heartbeat", daemon=True)
            self._hb_thread.start()

    # ---- membership ----

    def _register(self, worker_id):
        resp = self._rpc.call("RegisterWorker", master_pb2.RegisterWorkerRequest(worker_id=worker_id))
        with self._lock:
            self.worker_id = int(resp.worker_id)
            self.incarnation = int(resp.incarnation)
            self.lease_ms = int(resp.lease_ms)
            client = self._client
        if client is not None:
            client.set_identity(self.worker_id, self.incarnation)
        log.info("worker %d registered (incarnation %d, lease %d ms)", self.worker_id,
                 self.incarnation, self.lease_ms)

    def _reregister(self, why, seen_incarnation):
        with self._reregister_lock:
            with self._lock:
                old = self.incarnation
            if old != seen_incarnation or self._left:
                return  # another thread re-registered already (or we left)
            self._reregister_locked(why, old)

    def _reregister_locked(self, why, old):
        log.warning("worker %d incarnation %d lost its lease (%s); registering again: tasks "
                    "it held were re-queued", self.worker_id, old, why)
        self._register(self.worker_id)
        self.reregistrations += 1

    def _heartbeat_loop(self):
        while not self._stop.wait(max(0.01, self.lease_ms / 3000.0)):
            with self._lock:
                req = master_pb2.WorkerHeartbeatRequest(worker_id=self.worker_id,
                                                        incarnation=self.incarnation)
            try:
                self._rpc.call("WorkerHeartbeat", req, attempts=1)
            except PsError as e:
                if self._stop.is_set():
                    return
                lost = (e.code == grpc.StatusCode.FAILED_PRECONDITION and
                        "superseded" not in e.message) or e.code == grpc.StatusCode.NOT_FOUND
                if lost:
                    try:
                        self._reregister(e.message, req.incarnation)
                    except PsError as again:
                        log.warning("re-registration failed: %s", again)
                else:
                    log.warning("heartbeat of worker %d failed: %s", self.worker_id, e)

    @property
    def client(self):
        """A PsClient through the same master whose pushes carry this worker's identity."""
        with self._lock:
            if self._client is not None:
                return self._client
            worker_id, incarnation = self.worker_id, self.incarnation
        client = PsClient(master=self.master, worker_id=worker_id, incarnation=incarnation,
                          **self._client_options)  # connecting may take a while: unlocked
        with self._lock:
            if self._client is None:
                self._client = client
                client.set_identity(self.worker_id, self.incarnation)  # if re-registered
                return client
            other = self._client
        client.close()
        return other

    def leave(self):
        """Leaves the job for good: stops heartbeating, tells the master (tasks still held
        go back to the queue) and closes the client. Idempotent."""
        with self._lock:
            if self._left:
                return 0
            self._left = True
        self._stop.set()
        requeued = 0
        try:
            resp = self._rpc.call("LeaveWorker", master_pb2.LeaveWorkerRequest(
                worker_id=self.worker_id, incarnation=self.incarnation))
            requeued = resp.requeued_tasks
        except PsError as e:
            log.warning("LeaveWorker of worker %d: %s", self.worker_id, e)
        if self._hb_thread is not None and self._hb_thread is not threading.current_thread():
            self._hb_thread.join(timeout=5)
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
        self._rpc.close()
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
        req = master_pb2.CreateJobRequest(name=self.job, epochs=int(epochs),
                                          records_per_task=int(records_per_task))
        for path, records in files:
            req.files.add(path=str(path), records=int(records))
        for path, records in eval_files:
            req.eval_files.add(path=str(path), records=int(records))
        return int(self._rpc.call("CreateJob", req).num_tasks)

    def get_task(self):
        """One GetTask: a Task, "wait" or "done"."""
        with self._lock:
            req = master_pb2.GetTaskRequest(worker_id=self.worker_id,
                                            incarnation=self.incarnation, job=self.job)
        try:
            resp = self._rpc.call("GetTask", req)
        except PsError as e:
            if e.code == grpc.StatusCode.FAILED_PRECONDITION and "superseded" not in e.message:
                self._reregister(e.message, req.incarnation)
                return "wait"
            raise
        if resp.result == master_pb2.GetTaskResponse.TASK:
            return Task(resp.task, req.incarnation)
        return "done" if resp.result == master_pb2.GetTaskResponse.DONE else "wait"

    def tasks(self):
        """Yields this job's tasks until the job is done (or SIGTERM was received, once the
        current task is reported: see install_sigterm_handler); waits while the master says
        WAIT. Each task must be reported (report / task_scope) before the next is asked."""
        while not self._stopping.is_set():
            t = self.get_task()
            if t == "done":
                return
            if t == "wait":
                self._stopping.wait(self._poll)
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
        records = task.records if records is None else int(records)
        req = master_pb2.ReportTaskRequest(
            worker_id=self.worker_id, incarnation=task.incarnation, job=task.job,
            task_id=task.task_id, ok=bool(ok), records=records if ok else 0,
            error="" if ok else str(error)[:4000])
        for table, n in (table_pushes or {}).items():
            req.table_pushes[table] = int(n)
        try:
            resp, attempts = self._rpc.call("ReportTask", req, with_attempts=True)
        except PsError as e:
            if e.code == grpc.StatusCode.FAILED_PRECONDITION:
                if not ok and getattr(e, "attempts", 1) > 1:
                    return False  # an earlier attempt was applied (the task was re-queued)
                raise TaskLostError(e.code, e.message) from None
            raise
        return bool(resp.job_done)

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
            self._stopping.set()
        signal.signal(signal.SIGTERM, handler)
        self._exit_after_stop = exit_after

    @property
    def stopping(self):
        """True once SIGTERM was received (or stop() called)."""
        return self._stopping.is_set()

    def stop(self):
        """Asks tasks() to end after the current task (what SIGTERM does)."""
        self._stopping.set()

    def status(self):
        """The master's StatusResponse (pods, workers, jobs, progress)."""
        return self._rpc.call("Status", master_pb2.StatusRequest())

    def job_info(self):
        """This job's JobInfo from the master's status, or None."""
        for j in self.status().jobs:
            if j.name == self.job:
                return j
        return None


class _MasterRpc:
    """Master calls with deadlines and retries on UNAVAILABLE / ABORTED / DEADLINE_EXCEEDED
    (every master call a worker makes is idempotent or de-duplicated by the master)."""

    def __init__(self, address, deadline_s, max_attempts, security=None):
        from ._stubs import master_pb2_grpc

        self.address = address
        self._deadline = deadline_s
        self._attempts = max_attempts
        self._channel = make_channel(address, [
            ("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", 2000), ("grpc.enable_retries", 0)], security)
        self._stub = master_pb2_grpc.MasterStub(self._channel)

    def call(self, method, request, attempts=None, with_attempts=False):
        limit = attempts or self._attempts
        attempt = 0
        backoff = 0.05
        while True:
            attempt += 1
            try:
                resp = getattr(self._stub, method)(request, timeout=self._deadline)
                return (resp, attempt) if with_attempts else resp
            except grpc.RpcError as e:
                if e.code() in _RETRYABLE and attempt < limit:
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
                err = _error_from_rpc(e, f"master {self.address} {method}")
                err.attempts = attempt
                raise err from None

    def close(self):
        self._channel.close()
