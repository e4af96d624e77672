"""Bounded staleness for one training loop: the pushes of each step in flight, and when a
pull may be issued (used by elastic_ps.torch_modules; see docs/training.md, "Pipelining").

Steps are numbered 0, 1, ... by :meth:`StepSync.finish_step`, which takes the calls that
push one step's gradients. With staleness ``S``:

- at most ``S`` steps have pushes in flight (issued, not yet acknowledged) at any time:
  a step's pushes start only when fewer than S are (:meth:`StepSync.begin_step_push`).
  ``S = 0`` is synchronous: a step waits for its own pushes before it ends (so one step
  is in flight while it waits, as for S = 1);
- a pull whose values step ``t`` reads is issued only once every push of the steps up to
  ``t - 1 - S`` is acknowledged (:meth:`StepSync.when_visible`): step ``t`` sees all of
  this worker's own updates except at most those of its ``S`` latest steps. With ``S = 0``
  a step reads exactly what the unpipelined loop reads;
- an error of a push is raised by the next :meth:`check` (the next step, its forward, or
  :meth:`flush`), once; never dropped.

Calls go through :meth:`StepSync.call`: the client's ``<method>_async`` when it has one
(its handle is waited on, or given a callback), else the plain method on a small thread
pool of this object. Either way the result is a handle with ``done()``, ``result()`` and
``add_done_callback(fn)`` (``fn(handle)``).

Thread-safety: one training thread calls everything; completion callbacks come from any
thread and only touch state under the lock. Callbacks given to :meth:`when_visible` run
outside the lock, in the thread that completed the last push they waited for (or in the
caller's thread when nothing is outstanding); they must be short and must not block.
"""

import collections
import inspect
import threading
import time
from concurrent.futures import ThreadPoolExecutor

_POOL_THREADS = 3  # a sparse pull, a dense pull and a dense push may overlap


_accepts = {}  # (type, method, argument) -> bool


def accepts(obj, method, name):
    """Whether ``obj.<method>`` takes a keyword argument ``name`` (False when its signature
    cannot be read, e.g. some extension functions). Cached per type."""
    key = (type(obj), method, name)
    hit = _accepts.get(key)
    if hit is None:
        try:
            params = inspect.signature(getattr(obj, method)).parameters
            hit = name in params or any(p.kind == p.VAR_KEYWORD for p in params.values())
        except (TypeError, ValueError):
            hit = False
        _accepts[key] = hit
    return hit


class StepSync:
    """See the module docstring. ``client``: a PsClient (or anything with its methods);
    ``staleness`` S >= 0."""

    def __init__(self, client, staleness=0):
        if int(staleness) != staleness or staleness < 0:
            raise ValueError(f"staleness must be an integer >= 0, got {staleness!r}")
        self.client = client
        self.staleness = int(staleness)
        self._pool = None  # made on first use, under _pool_lock
        self._pool_lock = threading.Lock()
        self._cond = threading.Condition()
        # Guarded by _cond:
        self._steps = 0  # steps finished (finish_step calls)
        self._open = {}  # step -> its calls not yet done (only steps with some)
        self._waiters = []  # (step that must be visible, fn)
        self._errors = []  # (step, exception) of failed pushes, not yet raised
        self.max_in_flight = 0  # most steps with pushes in flight seen (instrumentation)
        # Seconds the training thread was blocked, by what it waited for ("push bound",
        # "own push" (S = 0), "visible", "flush", and the modules' "rows", "dense"): the
        # pods' and the network's time that the pipeline did not hide.
        self.waited = collections.Counter()

    # ---- calls ----

    def call(self, method, *args, **kwargs):
        """Starts ``client.<method>(*args, **kwargs)`` asynchronously; returns its handle."""
        fn = getattr(self.client, method + "_async", None)
        if fn is not None:
            return fn(*args, **kwargs)
        with self._pool_lock:  # calls also start from completions
            if self._pool is None:
                self._pool = ThreadPoolExecutor(_POOL_THREADS, thread_name_prefix="ps-steps")
            pool = self._pool
        return pool.submit(getattr(self.client, method), *args, **kwargs)

    def close(self):
        """Waits for the calls this object started on its own threads and stops them."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    # ---- steps ----

    @property
    def steps(self):
        """Steps finished so far (the number of the step being computed)."""
        with self._cond:
            return self._steps

    @property
    def in_flight(self):
        """Steps whose pushes are not all acknowledged yet."""
        with self._cond:
            return len(self._open)

    def begin_step_push(self):
        """Call before starting the current step's pushes: raises the first error of an
        earlier push, then waits until fewer than max(S, 1) steps are in flight, so that
        with this step's pushes at most max(S, 1) are."""
        self.check()
        with self._cond:
            self._wait_locked("push bound", lambda: len(self._open) < max(self.staleness, 1))
        self.check()

    def finish_step(self, calls):
        """Ends the current step, whose gradients ``calls`` (handles, started after
        :meth:`begin_step_push`) push. With S = 0, waits until they are acknowledged."""
        calls = list(calls)
        with self._cond:
            step = self._steps
            self._steps += 1
            if calls:
                self._open[step] = len(calls)
                self.max_in_flight = max(self.max_in_flight, len(self._open))
            ready = self._take_ready_locked()
        self._run(ready)
        for c in calls:
            on_done = getattr(c, "add_done_callback", None)
            if on_done is None:  # a handle without callbacks: wait for it here
                _exception(c)
                self._done(step, c)
            else:
                on_done(lambda h, step=step: self._done(step, h))
        if self.staleness == 0:
            with self._cond:
                self._wait_locked("own push", lambda: not self._open)

    def _done(self, step, handle):
        exc = _exception(handle)
        with self._cond:
            if exc is not None:
                self._errors.append((step, exc))
            self._open[step] -= 1
            if not self._open[step]:
                del self._open[step]
            ready = self._take_ready_locked()
            self._cond.notify_all()
        self._run(ready)

    def _wait_locked(self, what, predicate):
        if not predicate():
            t0 = time.perf_counter()
            self._cond.wait_for(predicate)
            self.waited[what] += time.perf_counter() - t0

    def timed(self, what, fn):
        """``fn()``, its duration added to ``waited[what]`` (a wait of the training
        thread)."""
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self.waited[what] += time.perf_counter() - t0

    def _visible_locked(self, step):
        """Whether every push of the steps <= ``step`` is acknowledged."""
        return step < (min(self._open) if self._open else self._steps)

    def _take_ready_locked(self):
        ready = [fn for s, fn in self._waiters if self._visible_locked(s)]
        if ready:
            self._waiters = [(s, fn) for s, fn in self._waiters if not self._visible_locked(s)]
        return ready

    @staticmethod
    def _run(fns):
        for fn in fns:
            fn()

    def when_visible(self, step, fn):
        """Runs ``fn()`` once every push of the steps <= ``step`` is acknowledged: now, in
        this thread, if that is already so (or ``step`` < 0), else from a completion."""
        with self._cond:
            if not self._visible_locked(step):
                self._waiters.append((step, fn))
                return
        fn()

    def gate(self, step):
        """The step whose pushes must be visible to reads of step ``step``: step - 1 - S."""
        return step - 1 - self.staleness

    def wait_visible(self, step):
        """Blocks until every push of the steps <= ``step`` is acknowledged."""
        with self._cond:
            self._wait_locked("visible", lambda: self._visible_locked(step))

    # ---- errors ----

    def check(self):
        """Raises the first not yet raised error of a finished push (each error once)."""
        with self._cond:
            if not self._errors:
                return
            _, exc = self._errors.pop(0)
        raise exc

    def flush(self):
        """Waits for every push in flight, then raises the first error not yet raised."""
        with self._cond:
            self._wait_locked("flush", lambda: not self._open)
        self.check()

    def discard(self):
        """Waits for every push in flight and drops errors not yet raised (after a failed
        task that is reported and retried). Returns the dropped exceptions."""
        with self._cond:
            self._cond.wait_for(lambda: not self._open)
            errors, self._errors = [e for _, e in self._errors], []
        return errors


def _exception(handle):
    """The exception a finished handle ended with, or None."""
    exc = getattr(handle, "exception", None)
    if callable(exc):
        try:
            return exc()
        except BaseException as e:  # noqa: BLE001 (a cancelled future, or a handle error)
            return e
    try:
        handle.result()
    except BaseException as e:  # noqa: BLE001
        return e
    return None
