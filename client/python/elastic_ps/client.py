"""PsClient: the Python client of the parameter server (pull, push, dense, catalog).

A call de-duplicates its ids (summing the gradients of duplicates), routes them to the
pods that own their vshards (elastic_ps.routing, the same hash as the C++ pods), sends one
RPC per pod carrying every table of the call, in parallel, and scatters rows back in the
caller's order. Ids and values travel as packed little-endian int64 / float32 bytes built
with numpy (no per-element Python work).

Failures (see docs/python.md):
- UNAVAILABLE, ABORTED and DEADLINE_EXCEEDED are retried with exponential backoff and
  jitter, re-sending the same request; a push keeps its PushKey, so a pod applies it once.
- FAILED_PRECONDITION "... which this pod does not own ..." (a stale shard map) refreshes
  the map from the master and re-routes that pod's ids; the pod applied nothing of that
  request, so the re-routed pushes get fresh PushKeys.
- A pod that stays UNAVAILABLE also makes the client refresh the map and retry the same
  pod, at the address the master now gives it, with the same PushKey: that attempt's fate
  is unknown and only that pod can tell (the pods check de-duplication before ownership).
- Anything else raises PsError(code, message) with the pod's message.

Every push to a pod gets its own PushKey (worker_id, incarnation, sequence): two pods, or
one pod at two times, never see the same key with different content.
"""

import logging
import random
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np

from . import routing
from .security import Security, make_channel
from ._stubs import master_pb2, master_pb2_grpc, ps_pb2, ps_pb2_grpc

log = logging.getLogger("elastic_ps")

_RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.DEADLINE_EXCEEDED})
# The pods' refusal of ids of vshards they do not own (ps/ps_core.cc CheckOwned).
_WRONG_SHARD = "which this pod does not own"
_MAX_MESSAGE = 256 << 20
# Consecutive UNAVAILABLE answers from one pod after which the client asks the master
# whether the pod's vshards moved.
_UNAVAILABLE_REFRESH_AFTER = 2

_OPTIMIZERS = {
    "sgd": ps_pb2.OptimizerSpec.SGD,
    "momentum": ps_pb2.OptimizerSpec.MOMENTUM,
    "adagrad": ps_pb2.OptimizerSpec.ADAGRAD,
    "adam": ps_pb2.OptimizerSpec.ADAM,
    "ftrl": ps_pb2.OptimizerSpec.FTRL,
}
_OPTIMIZER_FIELDS = ("momentum", "nesterov", "initial_accumulator", "epsilon", "beta1", "beta2",
                     "ftrl_beta", "ftrl_l1", "ftrl_l2")
_INITIALIZERS = {
    "zeros": ps_pb2.InitializerSpec.ZEROS,
    "constant": ps_pb2.InitializerSpec.CONSTANT,
    "uniform": ps_pb2.InitializerSpec.UNIFORM,
    "normal": ps_pb2.InitializerSpec.NORMAL,
    "truncated_normal": ps_pb2.InitializerSpec.TRUNCATED_NORMAL,
}
_INITIALIZER_FIELDS = ("value", "low", "high", "mean", "stddev", "seed")


class PsError(Exception):
    """A failed parameter-server call: `code` (grpc.StatusCode) and the server's message."""

    def __init__(self, code, message):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class TableConflictError(PsError):
    """create_table / create_dense of a name that exists with a different spec."""


def _pod_epoch(err):
    """The shard-map epoch a pod names in its `ps-epoch` trailing metadata, or None."""
    try:
        for k, v in err.trailing_metadata() or ():
            if k == "ps-epoch":
                return int(v)
    except (AttributeError, ValueError, TypeError):
        pass
    return None


def _error_from_rpc(err, where):
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    cls = TableConflictError if code == grpc.StatusCode.ALREADY_EXISTS else PsError
    return cls(code, f"{where}: {details}")


def make_initializer(initializer="normal", **params):
    """An InitializerSpec from a kind name and its parameters (value, low, high, mean,
    stddev, seed). Unset: normal / truncated_normal stddev 0.01, uniform [-0.01, 0.01)."""
    if isinstance(initializer, ps_pb2.InitializerSpec):
        return initializer
    kind = _INITIALIZERS.get(str(initializer).lower())
    if kind is None:
        raise ValueError(f"unknown initializer {initializer!r}; one of {sorted(_INITIALIZERS)}")
    spec = ps_pb2.InitializerSpec(kind=kind)
    for k, v in params.items():
        setattr(spec, k, v)
    if kind in (ps_pb2.InitializerSpec.NORMAL, ps_pb2.InitializerSpec.TRUNCATED_NORMAL):
        if "stddev" not in params:
            spec.stddev = 0.01
    elif kind == ps_pb2.InitializerSpec.UNIFORM and "low" not in params and "high" not in params:
        spec.low, spec.high = -0.01, 0.01
    return spec


def make_optimizer(optimizer="adagrad", learning_rate=None, **params):
    """An OptimizerSpec from a kind name (sgd, momentum, adagrad, adam, ftrl) and its
    hyperparameters; unset ones take the server's defaults (embedding/spec.h)."""
    if isinstance(optimizer, ps_pb2.OptimizerSpec):
        return optimizer
    kind = _OPTIMIZERS.get(str(optimizer).lower())
    if kind is None:
        raise ValueError(f"unknown optimizer {optimizer!r}; one of {sorted(_OPTIMIZERS)}")
    spec = ps_pb2.OptimizerSpec(kind=kind)
    if learning_rate is not None:
        spec.learning_rate = learning_rate
    for k, v in params.items():
        setattr(spec, k, v)
    return spec


def _split_hyper(hyper):
    init, opt = {}, {}
    for k, v in hyper.items():
        if k in _INITIALIZER_FIELDS:
            init[k] = v
        elif k in _OPTIMIZER_FIELDS:
            opt[k] = v
        else:
            raise ValueError(f"unknown hyperparameter {k!r}; initializer: {_INITIALIZER_FIELDS}, "
                             f"optimizer: {_OPTIMIZER_FIELDS}")
    return init, opt


def table_spec(name, dim, *, optimizer="adagrad", learning_rate=None, initializer="normal",
               **hyper):
    """A ps_pb2.TableSpec (see PsClient.create_table)."""
    init, opt = _split_hyper(hyper)
    return ps_pb2.TableSpec(name=name, dim=int(dim), initializer=make_initializer(initializer, **init),
                            optimizer=make_optimizer(optimizer, learning_rate, **opt))


def dense_spec(name, shape, *, optimizer="adagrad", learning_rate=None, initializer="normal",
               **hyper):
    """A ps_pb2.DenseSpec (see PsClient.create_dense)."""
    init, opt = _split_hyper(hyper)
    shape = [int(d) for d in (shape if np.ndim(shape) else [shape])]
    return ps_pb2.DenseSpec(name=name, shape=shape,
                            initializer=make_initializer(initializer, **init),
                            optimizer=make_optimizer(optimizer, learning_rate, **opt))


class ShardMap:
    """Which pod (address) owns each vshard, under an epoch."""

    def __init__(self, epoch, owner, addresses, pod_ids=None):
        self.epoch = int(epoch)
        self.owner = np.asarray(owner, dtype=np.uint32)
        self.num_vshards = routing.check_num_vshards(len(self.owner))
        self.addresses = list(addresses)
        self.pod_ids = list(pod_ids) if pod_ids else [f"pod-{i}" for i in range(len(addresses))]
        if len(self.owner) and int(self.owner.max()) >= len(self.addresses):
            raise ValueError(f"shard map names pod {int(self.owner.max())} of only "
                             f"{len(self.addresses)}")

    @classmethod
    def static(cls, servers, num_vshards):
        return cls(0, routing.static_owners(num_vshards, len(servers)), servers)

    def pods_of(self, table, ids):
        """Pod index of every id of `table`."""
        return self.owner[routing.vshards(table, ids, self.num_vshards)]

    def address_of_pod_at(self, old, address):
        """Where the pod that `old` (an earlier map) had at `address` is now: its address
        in this map, or `address` when it is not in this map."""
        try:
            pod_id = old.pod_ids[old.addresses.index(address)]
            return self.addresses[self.pod_ids.index(pod_id)] or address
        except ValueError:
            return address

    def pod_of_dense(self, name):
        return int(self.owner[routing.dense_vshard(name, self.num_vshards)])


class _Batch:
    """One table's part of a call: its distinct ids, and per op the rows or summed grads."""

    __slots__ = ("table", "dim", "uniq", "inverse", "grads", "rows", "lr")

    def __init__(self, table, dim, uniq, inverse):
        self.table, self.dim, self.uniq, self.inverse = table, dim, uniq, inverse
        self.grads = None
        self.rows = None
        self.lr = 0.0


def _dedup(ids, pods=None):
    """(uniq, order, starts, inverse): the distinct ids, ids[order] has equal ids adjacent
    (in their original order) with runs starting at `starts`, ids[i] == uniq[inverse[i]].
    Ordered by id; with `pods` (the pod of every id), by pod first, so that each pod's ids
    are a contiguous range of uniq (its request is a slice, not a gather)."""
    n = ids.shape[0]
    order = np.argsort(ids, kind="stable")
    if pods is not None and n and int(pods.max()) > 0:
        p = pods[order]
        if int(p.max()) < 65536:
            p = p.astype(np.uint16)  # a radix sort
        order = order[np.argsort(p, kind="stable")]
    s = ids[order]
    first = np.empty(n, dtype=bool)
    if n:
        first[0] = True
        np.not_equal(s[1:], s[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    return s[starts], order, starts, inverse


def _segment_sum(sorted_rows, starts):
    """Sums of the runs of `sorted_rows` (2-D float32) that begin at `starts`, each run
    summed in order. Fast for the usual mix: many single rows, some short runs, few long
    ones (np.add.reduceat alone costs microseconds per run)."""
    n = sorted_rows.shape[0]
    counts = np.diff(np.append(starts, n))
    if counts.shape[0] == n:
        return sorted_rows
    out = sorted_rows[starts]  # a copy: the first row of every run
    short_limit = 16
    multi = np.flatnonzero((counts > 1) & (counts <= short_limit))
    k = 1
    while multi.shape[0]:
        out[multi] += sorted_rows[starts[multi] + k]
        k += 1
        multi = multi[counts[multi] > k]
    long_runs = np.flatnonzero(counts > short_limit)
    if long_runs.shape[0]:
        rows = np.concatenate([np.arange(starts[r], starts[r] + counts[r]) for r in long_runs])
        local = np.concatenate([[0], np.cumsum(counts[long_runs])[:-1]])
        out[long_runs] = np.add.reduceat(sorted_rows[rows], local, axis=0)
    return out


class _Part:
    """One RPC to one pod: `items` are (batch, positions into batch.uniq) for sparse calls,
    names (dense pull) or (name, grads, lr) (dense push)."""

    __slots__ = ("address", "items", "key", "attempt", "unavailable", "request")

    def __init__(self, address, items, key, attempt=0):
        self.address, self.items, self.key, self.attempt = address, items, key, attempt
        self.unavailable = 0
        self.request = None


class PsClient:
    """A client of the parameter server; thread-safe.

    PsClient(master="host:port") takes the pods and the shard map from the master (waiting
    up to connect_timeout_s until every pod that owns vshards is live) and follows map
    changes. PsClient(servers=[...]) uses the static map of pods started --shard=i/N.
    """

    def __init__(self, master=None, *, servers=None, num_vshards=None, worker_id=0,
                 incarnation=1, deadline_s=10.0, max_attempts=10, connect_timeout_s=30.0,
                 initial_backoff_s=0.02, max_backoff_s=4.0, max_workers=16, security=None):
        if not master and not servers:
            raise ValueError("PsClient needs master='host:port' or servers=[...]")
        if deadline_s <= 0 or max_attempts < 1 or not 0 < initial_backoff_s <= max_backoff_s:
            raise ValueError("need deadline_s > 0, max_attempts >= 1, "
                             "0 < initial_backoff_s <= max_backoff_s")
        self._master_address = master
        # TLS and token (elastic_ps.security); default: from the PS_TLS_* environment.
        self._security = security if security is not None else Security.from_env()
        self._deadline = float(deadline_s)
        self._max_attempts = int(max_attempts)
        self._initial_backoff = float(initial_backoff_s)
        self._max_backoff = float(max_backoff_s)
        self._connect_timeout = float(connect_timeout_s)
        self._lock = threading.Lock()  # guards the fields below
        self._map_lock = threading.Lock()  # serializes map refreshes
        self._channels = {}  # address -> (channel, ParameterServerStub)
        self._tables = {}
        self._dense = {}
        # PushKey sequences start at the clock in microseconds: a process restarted with
        # the same (worker_id, incarnation) continues above every sequence it used before,
        # instead of re-using keys the pods would take for duplicates.
        self._sequence = time.time_ns() // 1000
        self._closed = False
        self.set_identity(worker_id, incarnation)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="elastic_ps")
        self._master_channel = None
        self._master = None
        try:
            if master:
                self._master_channel = make_channel(master, self._channel_options(),
                                                    self._security)
                self._master = master_pb2_grpc.MasterStub(self._master_channel)
                self._map = self._connect_through_master()
                self._load_catalog_from_master()
            else:
                self._map = self._connect_static(list(servers), num_vshards)
        except BaseException:
            self.close()
            raise

    # ---- identity, lifecycle ----

    def set_identity(self, worker_id, incarnation):
        """The PushKey identity of later pushes (worker_id 0: a random 63-bit id)."""
        worker_id = int(worker_id)
        while worker_id == 0:
            worker_id = secrets.randbits(63)
        with self._lock:
            self.worker_id = worker_id
            self.incarnation = int(incarnation)

    def close(self):
        """Closes every channel; later calls raise. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            channels = [c for c, _ in self._channels.values()]
            self._channels.clear()
        if getattr(self, "_pool", None) is not None:
            self._pool.shutdown(wait=True)
        for c in channels:
            c.close()
        if self._master_channel is not None:
            self._master_channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def shard_map(self):
        return self._map

    @property
    def num_vshards(self):
        return self._map.num_vshards

    # ---- connection and map ----

    def _channel_options(self):
        return [("grpc.max_send_message_length", _MAX_MESSAGE),
                ("grpc.max_receive_message_length", _MAX_MESSAGE),
                ("grpc.enable_retries", 0),
                ("grpc.initial_reconnect_backoff_ms", max(1, int(self._initial_backoff * 1000))),
                ("grpc.min_reconnect_backoff_ms", max(1, int(self._initial_backoff * 1000))),
                ("grpc.max_reconnect_backoff_ms", max(1, int(self._max_backoff * 1000)))]

    def _stub(self, address):
        with self._lock:
            if self._closed:
                raise PsError(grpc.StatusCode.CANCELLED, "the client is closed")
            entry = self._channels.get(address)
            if entry is None:
                channel = make_channel(address, self._channel_options(), self._security)
                entry = (channel, ps_pb2_grpc.ParameterServerStub(channel))
                self._channels[address] = entry
            return entry[1]

    def _master_call(self, method, request, timeout=None, attempts=None):
        """A master RPC, retried like pod RPCs (master calls are idempotent)."""
        if self._master is None:
            raise PsError(grpc.StatusCode.FAILED_PRECONDITION,
                          "this client has no master (it was given servers=[...])")
        fn = getattr(self._master, method)
        attempt = 0
        while True:
            try:
                return fn(request, timeout=timeout or self._deadline)
            except grpc.RpcError as e:
                attempt += 1
                if e.code() not in _RETRYABLE or attempt >= (attempts or self._max_attempts):
                    raise _error_from_rpc(e, f"master {self._master_address} {method}") from None
                time.sleep(self._backoff(attempt))

    def _map_from_master(self, require_live, attempts=None):
        resp = self._master_call("GetShardMap", master_pb2.GetShardMapRequest(),
                                 attempts=attempts)
        addresses = [p.address for p in resp.pods]
        if require_live:
            for v, o in enumerate(resp.owner):
                pod = resp.pods[o]
                if pod.state != master_pb2.PodInfo.LIVE:
                    raise PsError(grpc.StatusCode.UNAVAILABLE,
                                  f"pod {pod.pod_id} (owner of vshard {v}) is "
                                  f"{master_pb2.PodInfo.State.Name(pod.state)}")
        return ShardMap(resp.epoch, list(resp.owner), addresses, [p.pod_id for p in resp.pods])

    def _connect_through_master(self):
        deadline = time.monotonic() + self._connect_timeout
        attempt = 0
        while True:
            try:
                m = self._map_from_master(require_live=True)
                self._check_pods(m)
                return m
            except PsError as e:
                attempt += 1
                retry = e.code in _RETRYABLE or e.code == grpc.StatusCode.FAILED_PRECONDITION
                wait = self._backoff(attempt)
                if not retry or time.monotonic() + wait > deadline:
                    raise PsError(e.code, f"connecting through master {self._master_address}: "
                                  f"{e.message}") from None
                time.sleep(wait)

    def _connect_static(self, servers, num_vshards):
        if not servers:
            raise ValueError("servers=[] names no pod")
        first = self._describe(servers[0])
        v = int(num_vshards or first.num_vshards)
        if first.num_vshards != v:
            raise PsError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"pod 0 ({servers[0]}) has {first.num_vshards} vshards; the client "
                          f"is configured with {v}")
        m = ShardMap.static(servers, v)
        self._check_pods(m, first)
        return m

    def _describe(self, address):
        return self._call_pod(address, "Describe", ps_pb2.DescribeRequest())

    def _check_pods(self, m, first=None):
        """Checks every pod serves the vshards `m` gives it; loads the catalog they hold."""
        for i, address in enumerate(m.addresses):
            if not np.any(m.owner == i):
                continue  # owns nothing: need not be up
            d = first if (first is not None and i == 0) else self._describe(address)
            if d.num_vshards != m.num_vshards:
                raise PsError(grpc.StatusCode.FAILED_PRECONDITION,
                              f"pod {m.pod_ids[i]} ({address}) has {d.num_vshards} vshards; "
                              f"the map has {m.num_vshards}")
            bits = np.unpackbits(np.frombuffer(d.owned_vshards, dtype=np.uint8),
                                 bitorder="little")[:m.num_vshards].astype(bool)
            mismatch = np.flatnonzero(bits != (m.owner == i))
            if mismatch.size:
                v = int(mismatch[0])
                hint = "" if m.epoch else (f". Static map: start pod i with --shard=i/"
                                           f"{len(m.addresses)} and list the servers in that order")
                raise PsError(grpc.StatusCode.FAILED_PRECONDITION,
                              f"pod {m.pod_ids[i]} ({address}) {'owns' if bits[v] else 'does not own'}"
                              f" vshard {v}, unlike the shard map (epoch {m.epoch}){hint}")
            with self._lock:
                for t in d.tables:
                    self._tables.setdefault(t.spec.name, t.spec)
                for t in d.dense:
                    self._dense.setdefault(t.spec.name, t.spec)

    def refresh_map(self, seen_epoch=None, attempts=None):
        """Reloads the shard map from the master (no-op without one). With `seen_epoch`,
        only if the current map is still that epoch (another thread may have refreshed)."""
        if self._master is None:
            return self._map
        with self._map_lock:
            if seen_epoch is not None and self._map.epoch > seen_epoch:
                return self._map
            m = self._map_from_master(require_live=False, attempts=attempts)
            if m.epoch != self._map.epoch:
                log.info("shard map epoch %d -> %d", self._map.epoch, m.epoch)
            self._map = m
            return m

    def _backoff(self, attempt):
        cap = min(self._max_backoff, self._initial_backoff * (2 ** min(attempt - 1, 20)))
        return random.uniform(cap / 2, cap)

    def _call_pod(self, address, method, request):
        """One unary RPC to a pod with retries (not re-routed)."""
        attempt = 0
        while True:
            try:
                return getattr(self._stub(address), method)(request, timeout=self._deadline)
            except grpc.RpcError as e:
                attempt += 1
                if e.code() not in _RETRYABLE or attempt >= self._max_attempts:
                    raise _error_from_rpc(e, f"pod {address} {method}") from None
                time.sleep(self._backoff(attempt))

    # ---- catalog ----

    def _load_catalog_from_master(self):
        resp = self._master_call("ListTables", master_pb2.ListTablesRequest())
        with self._lock:
            for t in resp.tables:
                self._tables[t.name] = t
            for d in resp.dense:
                self._dense[d.name] = d

    def refresh_catalog(self):
        """Reloads the table catalog (from the master, else from every pod)."""
        if self._master is not None:
            self._load_catalog_from_master()
            return
        m = self._map
        for address in m.addresses:
            d = self._describe(address)
            with self._lock:
                for t in d.tables:
                    self._tables[t.spec.name] = t.spec
                for t in d.dense:
                    self._dense[t.spec.name] = t.spec

    def table(self, name):
        """The normalized TableSpec of `name`; PsError(NOT_FOUND) if there is none."""
        return self._lookup(self._tables, name, "table")

    def dense(self, name):
        """The normalized DenseSpec of `name`; PsError(NOT_FOUND) if there is none."""
        return self._lookup(self._dense, name, "dense tensor")

    def _lookup(self, catalog, name, what):
        with self._lock:
            spec = catalog.get(name)
        if spec is None:
            self.refresh_catalog()
            with self._lock:
                spec = catalog.get(name)
        if spec is None:
            raise PsError(grpc.StatusCode.NOT_FOUND, f"{what} '{name}' does not exist")
        return spec

    def tables(self):
        """{name: TableSpec} of every table (the catalog, refreshed)."""
        self.refresh_catalog()
        with self._lock:
            return dict(self._tables)

    def dense_tensors(self):
        """{name: DenseSpec} of every dense tensor (the catalog, refreshed)."""
        self.refresh_catalog()
        with self._lock:
            return dict(self._dense)

    def describe(self):
        """Per pod address: its DescribeResponse (tables with rows, vshards owned)."""
        return {a: self._describe(a) for a in self._map.addresses if a}

    def create_table(self, name, dim=None, *, optimizer="adagrad", learning_rate=None,
                     initializer="normal", **hyper):
        """Creates an embedding table (or takes a ready ps_pb2.TableSpec as `name`).

        Idempotent for an identical spec; TableConflictError (ALREADY_EXISTS) for a
        different one. Returns the normalized spec. Through the master when connected to
        one (it persists the catalog and gives it to pods that start later); the pods
        are then told directly too, so the table is usable at once."""
        if isinstance(name, ps_pb2.TableSpec):
            spec = name
        else:
            if dim is None:
                raise ValueError("create_table needs dim")
            spec = table_spec(name, dim, optimizer=optimizer, learning_rate=learning_rate,
                              initializer=initializer, **hyper)
        self._create("CreateTable", ps_pb2.CreateTableRequest(spec=spec), spec.name)
        return self.table(spec.name)

    def create_dense(self, name, shape=None, *, optimizer="adagrad", learning_rate=None,
                     initializer="normal", **hyper):
        """Creates a dense tensor (or takes a ready ps_pb2.DenseSpec); as create_table."""
        if isinstance(name, ps_pb2.DenseSpec):
            spec = name
        else:
            if shape is None:
                raise ValueError("create_dense needs shape")
            spec = dense_spec(name, shape, optimizer=optimizer, learning_rate=learning_rate,
                              initializer=initializer, **hyper)
        self._create("CreateDense", ps_pb2.CreateDenseRequest(spec=spec), spec.name)
        return self.dense(spec.name)

    def _create(self, method, request, name):
        if self._master is not None:
            self._master_call(method, request)
            self._load_catalog_from_master()
            catalog = self._tables if method == "CreateTable" else self._dense
            with self._lock:
                normalized = catalog.get(name)
            if normalized is not None:  # pods get exactly the master's spec
                request = type(request)(spec=normalized)
        m = self._map
        owners = sorted(set(int(o) for o in m.owner))
        futures = [(m.addresses[o], self._pool.submit(self._call_pod, m.addresses[o], method,
                                                      request)) for o in owners]
        for address, f in futures:
            try:
                f.result()
            except PsError as e:
                if self._master is not None and e.code in _RETRYABLE:
                    # The master has it; the pod syncs its catalog when it is back.
                    log.warning("%s of '%s' on pod %s: %s (the pod will take it from the "
                                "master)", method, name, address, e)
                    continue
                raise
        if self._master is None:
            self.refresh_catalog()

    # ---- the call engine ----

    def _next_key(self):
        with self._lock:
            self._sequence += 1
            return ps_pb2.PushKey(worker_id=self.worker_id, incarnation=self.incarnation,
                                  sequence=self._sequence)

    def _run(self, op, items):
        """Routes `items` with the current map and runs op's RPCs until all succeeded."""
        m = self._map
        parts = [_Part(m.addresses[p], its, self._next_key() if op.keyed else None)
                 for p, its in op.route(items, m)]
        errors = []
        while parts:
            sent = []
            for part in parts:
                if part.request is None:
                    part.request = op.build(part, m.epoch)
                stub = self._stub(part.address)
                sent.append((part, getattr(stub, op.method).future(part.request,
                                                                   timeout=self._deadline)))
            retry = []
            for part, future in sent:
                try:
                    resp = future.result()
                except grpc.RpcError as e:
                    try:
                        retry.extend(self._on_failure(op, part, e))
                    except PsError as failure:
                        errors.append(failure)
                    continue
                try:
                    op.on_ok(part, resp)
                except PsError as failure:
                    errors.append(failure)
            if errors and not (op.keyed and retry):
                raise errors[0]
            # A push that failed on one pod still finishes its retries on the others, so
            # that when it raises, every pod's part is settled (applied once, or refused).
            if retry:
                time.sleep(self._backoff(max(p.attempt for p in retry)))
                m = self._map
            parts = retry
        if errors:
            raise errors[0]

    def _on_failure(self, op, part, err):
        """The parts to send next for a failed part, or raises PsError."""
        code, details = err.code(), err.details() or ""
        part.attempt += 1
        where = f"pod {part.address} {op.method}"
        if part.attempt >= self._max_attempts:
            raise PsError(code, f"{where}: {details} [after {part.attempt} attempts]")
        if code == grpc.StatusCode.FAILED_PRECONDITION and _WRONG_SHARD in details:
            if self._master is None:
                raise PsError(code, f"{where}: {details} (static map: the servers must be "
                              "listed in --shard order)")
            seen = self._map.epoch
            log.info("%s: %s (pod at epoch %s); refreshing the shard map (epoch %d)", where,
                     details, _pod_epoch(err), seen)
            m = self.refresh_map(seen_epoch=seen)
            # Nothing of the request was applied: re-routed pushes get fresh keys.
            return self._reroute(op, part, m)
        if code in _RETRYABLE:
            if code == grpc.StatusCode.UNAVAILABLE:
                part.unavailable += 1
                if self._master is not None and part.unavailable >= _UNAVAILABLE_REFRESH_AFTER:
                    # The same pod, at the address the master now has for it (a restarted
                    # pod may listen elsewhere), with the same key: whether it applied the
                    # attempt is unknown, and only it can tell (it answers a known key as a
                    # duplicate, and refuses an unknown one for vshards it gave away, after
                    # which the ids are re-routed under a new key).
                    old = self._map
                    try:  # one try: a master that is down too must not end the call
                        m = self.refresh_map(attempts=1)
                    except PsError as e:
                        log.info("%s unavailable; shard map refresh failed: %s", where, e)
                        return [part]
                    address = m.address_of_pod_at(old, part.address)
                    if address != part.address:
                        log.warning("%s unavailable; the pod is now at %s", where, address)
                        part.address, part.unavailable = address, 0
            return [part]
        if code == grpc.StatusCode.NOT_FOUND and op.retry_not_found and self._known(op, part):
            # A pod that has not yet taken a new table from the master's catalog.
            return [part]
        raise _error_from_rpc(err, where)

    def _known(self, op, part):
        return all(name in (self._tables if op.sparse else self._dense) for name in op.names(part))

    def _reroute(self, op, part, m):
        """The parts of a refused part under map `m`; pushes get new keys (the refusing pod
        applied nothing of it)."""
        out = []
        for p, its in op.route(part.items, m):
            key = self._next_key() if op.keyed else None
            np_ = _Part(m.addresses[p], its, key, part.attempt)
            np_.unavailable = part.unavailable if m.addresses[p] == part.address else 0
            out.append(np_)
        return out

    # ---- sparse pull / push ----

    def _batch(self, table, ids):
        spec = self.table(table)
        ids = routing.as_ids(ids)
        m = self._map
        pods = m.pods_of(table, ids) if len(m.addresses) > 1 and ids.shape[0] > 64 else None
        uniq, order, starts, inverse = _dedup(ids, pods)
        b = _Batch(table, spec.dim, uniq, inverse)
        return b, order, starts

    def pull(self, table, ids, read_only=False):
        """Rows of `ids` (any int array-like; duplicates allowed) -> float32 (n, dim).

        read_only: evaluation pull, a missing row comes back at its initial value and is
        not created."""
        return self.pull_multi({table: ids}, read_only=read_only)[table]

    def pull_multi(self, requests, read_only=False):
        """{table: ids} -> {table: float32 (len(ids), dim)}, one RPC per pod."""
        batches = []
        for table, ids in requests.items():
            b, _, _ = self._batch(table, ids)
            b.rows = np.empty((b.uniq.shape[0], b.dim), dtype=np.float32)
            batches.append(b)
        items = [(b, slice(0, b.uniq.shape[0])) for b in batches if b.uniq.shape[0]]
        if items:
            self._run(_SparseOp("Pull", read_only=read_only), items)
        return {b.table: b.rows[b.inverse] for b in batches}

    def push(self, table, ids, grads, learning_rate=0.0):
        """Applies gradients: grads[i] (float32 (n, dim)) to ids[i]; duplicate ids' grads
        are summed. learning_rate > 0 overrides the table's. Exactly once per pod."""
        self.push_multi({table: (ids, grads)}, learning_rate=learning_rate)

    def push_multi(self, requests, learning_rate=0.0):
        """{table: (ids, grads)} in one RPC per pod (see push)."""
        lr = self._check_lr(learning_rate)
        batches = []
        for table, pair in requests.items():
            try:
                ids, grads = pair
            except (TypeError, ValueError):
                raise ValueError(f"push_multi wants {{table: (ids, grads)}}; got {type(pair)} "
                                 f"for '{table}'") from None
            b, order, starts = self._batch(table, ids)
            g = np.asarray(grads, dtype=np.float32)
            n = b.inverse.shape[0]
            if g.size != n * b.dim or (g.ndim == 2 and g.shape != (n, b.dim)) or g.ndim > 2:
                raise ValueError(f"push to '{table}': grads of shape {np.shape(grads)} for {n} "
                                 f"ids of dim {b.dim} (expected ({n}, {b.dim}))")
            g = g.reshape(n, b.dim)
            if not np.isfinite(g).all():
                bad = np.argwhere(~np.isfinite(g))[0]
                raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                              f"push to '{table}' has a non-finite gradient ({g[tuple(bad)]}) "
                              f"for id {int(routing.as_ids(ids)[bad[0]])} element {int(bad[1])}; "
                              "nothing was sent")
            if n == 0:
                continue
            b.grads = _segment_sum(g[order], starts)
            b.lr = lr
            batches.append(b)
        items = [(b, slice(0, b.uniq.shape[0])) for b in batches]
        if items:
            self._run(_SparseOp("Push"), items)

    @staticmethod
    def _check_lr(lr):
        lr = float(lr)
        if not np.isfinite(lr) or lr < 0:
            raise ValueError(f"learning_rate {lr} must be finite and >= 0")
        return lr

    # ---- asynchronous forms ----

    def pull_async(self, table, ids, read_only=False):
        """pull on the client's thread pool -> concurrent.futures.Future of the rows (e.g.
        to prefetch the next batch). `ids` must not change until the future is done."""
        return self._pool.submit(self.pull, table, ids, read_only)

    def push_async(self, table, ids, grads, learning_rate=0.0):
        """push on the client's thread pool -> Future (its result() raises what push would).
        `ids` and `grads` must not change until the future is done."""
        return self._pool.submit(self.push, table, ids, grads, learning_rate)

    def push_multi_async(self, requests, learning_rate=0.0):
        """push_multi on the client's thread pool -> Future."""
        return self._pool.submit(self.push_multi, requests, learning_rate)

    # ---- dense ----

    def pull_dense(self, names):
        """{name: float32 array of the tensor's shape} for a name or a list of names."""
        names = [names] if isinstance(names, str) else list(names)
        specs = {n: self.dense(n) for n in names}
        out = {}
        if names:
            self._run(_DensePullOp(specs, out), names)
        return out

    def push_dense(self, grads, learning_rate=0.0):
        """Applies {name: grads (the tensor's shape or numel floats)}; exactly once."""
        lr = self._check_lr(learning_rate)
        items = []
        for name, g in grads.items():
            spec = self.dense(name)
            numel = int(np.prod(spec.shape, dtype=np.int64))
            a = np.asarray(g, dtype=np.float32)
            if a.size != numel:
                raise ValueError(f"dense push to '{name}': grads of shape {a.shape}, expected "
                                 f"{tuple(spec.shape)} ({numel} floats)")
            if not np.isfinite(a).all():
                raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                              f"dense push to '{name}' has a non-finite gradient at element "
                              f"{int(np.flatnonzero(~np.isfinite(a.reshape(-1)))[0])}; "
                              "nothing was sent")
            items.append((name, np.ascontiguousarray(a.reshape(-1), dtype="<f4"), lr))
        if items:
            self._run(_DensePushOp(), items)

    # ---- stats, low level ----

    def stats(self, as_dict=True):
        """Per pod address: its StatsResponse (as a dict unless as_dict=False)."""
        m = self._map
        futures = {a: self._pool.submit(self._call_pod, a, "Stats", ps_pb2.StatsRequest())
                   for a in dict.fromkeys(m.addresses) if a}
        out = {}
        for a, f in futures.items():
            s = f.result()
            out[a] = _to_dict(s) if as_dict else s
        return out

    def raw_call(self, address, method, request):
        """Sends one request to one pod as is (no routing, retries, keys); returns the
        response or raises PsError. For tools and tests (e.g. resending a PushKey)."""
        try:
            return getattr(self._stub(address), method)(request, timeout=self._deadline)
        except grpc.RpcError as e:
            raise _error_from_rpc(e, f"pod {address} {method}") from None

    def next_push_key(self):
        """A fresh PushKey of this client's identity."""
        return self._next_key()


def _to_dict(message):
    """A flat message (StatsResponse) as {field: Python value}, every field included."""
    return {f.name: getattr(message, f.name) for f in message.DESCRIPTOR.fields}


# ---- the ops the engine runs ----


class _SparseOp:
    """Pull or Push of several tables' rows."""

    keyed = False
    sparse = True
    retry_not_found = True

    def __init__(self, method, read_only=False):
        self.method = method
        self.keyed = method == "Push"
        self.read_only = read_only

    @staticmethod
    def route(items, m):
        """Splits (batch, pos) items by owning pod; pos is a slice or an index array of
        batch.uniq. Ids already grouped by pod (see _dedup) stay slices."""
        per_pod = {}
        for b, pos in items:
            if len(m.addresses) == 1:
                per_pod.setdefault(0, []).append((b, pos))
                continue
            pods = m.pods_of(b.table, b.uniq[pos])
            if pods.shape[0] == 0:
                continue
            if np.all(pods[1:] >= pods[:-1]):  # grouped: contiguous ranges
                cuts = (np.flatnonzero(pods[1:] != pods[:-1]) + 1).tolist()
                bounds = [0, *cuts, pods.shape[0]]
                for a, z in zip(bounds[:-1], bounds[1:]):
                    sub = (slice(pos.start + a, pos.start + z) if isinstance(pos, slice)
                           else pos[a:z])
                    per_pod.setdefault(int(pods[a]), []).append((b, sub))
                continue
            if isinstance(pos, slice):
                pos = np.arange(pos.start, pos.stop)
            order = np.argsort(pods, kind="stable")
            sp = pods[order]
            cuts = np.flatnonzero(sp[1:] != sp[:-1]) + 1
            for chunk in np.split(order, cuts):
                if chunk.size:
                    per_pod.setdefault(int(pods[chunk[0]]), []).append((b, pos[chunk]))
        return sorted(per_pod.items())

    @staticmethod
    def names(part):
        return [b.table for b, _ in part.items]

    def build(self, part, epoch):
        if self.method == "Pull":
            req = ps_pb2.PullRequest(epoch=epoch, read_only=self.read_only)
            for b, pos in part.items:
                req.tables.add(table=b.table, ids=b.uniq[pos].astype("<i8", copy=False).tobytes())
            return req
        req = ps_pb2.PushRequest(epoch=epoch, key=part.key)
        for b, pos in part.items:
            req.tables.add(table=b.table, ids=b.uniq[pos].astype("<i8", copy=False).tobytes(),
                           grads=np.ascontiguousarray(b.grads[pos], dtype="<f4").tobytes(),
                           learning_rate=b.lr)
        return req

    def on_ok(self, part, resp):
        if self.method != "Pull":
            return
        if len(resp.tables) != len(part.items):
            raise PsError(grpc.StatusCode.INTERNAL,
                          f"pod {part.address} answered {len(resp.tables)} tables for "
                          f"{len(part.items)}")
        for (b, pos), t in zip(part.items, resp.tables):
            vals = np.frombuffer(t.values, dtype="<f4")
            n = _count(pos)
            if vals.shape[0] != n * b.dim:
                raise PsError(grpc.StatusCode.INTERNAL,
                              f"pod {part.address} answered {vals.shape[0]} floats of '{b.table}' "
                              f"for {n} rows of dim {b.dim}")
            b.rows[pos] = vals.reshape(n, b.dim)


def _count(pos):
    return pos.stop - pos.start if isinstance(pos, slice) else pos.shape[0]


class _DensePullOp:
    method = "PullDense"
    keyed = False
    sparse = False
    retry_not_found = True

    def __init__(self, specs, out):
        self.specs, self.out = specs, out

    @staticmethod
    def route(names, m):
        per_pod = {}
        for n in names:
            per_pod.setdefault(m.pod_of_dense(n), []).append(n)
        return sorted(per_pod.items())

    @staticmethod
    def names(part):
        return list(part.items)

    def build(self, part, epoch):
        return ps_pb2.DensePullRequest(epoch=epoch, names=list(dict.fromkeys(part.items)))

    def on_ok(self, part, resp):
        got = {t.name: t.values for t in resp.tensors}
        for n in part.items:
            spec = self.specs[n]
            vals = np.frombuffer(got.get(n, b""), dtype="<f4")
            shape = tuple(int(d) for d in spec.shape)
            if vals.shape[0] != int(np.prod(shape, dtype=np.int64)):
                raise PsError(grpc.StatusCode.INTERNAL,
                              f"dense pull of '{n}' from pod {part.address} came back malformed")
            self.out[n] = vals.reshape(shape).copy()


class _DensePushOp:
    method = "PushDense"
    keyed = True
    sparse = False
    retry_not_found = True

    @staticmethod
    def route(items, m):
        per_pod = {}
        for it in items:
            per_pod.setdefault(m.pod_of_dense(it[0]), []).append(it)
        return sorted(per_pod.items())

    @staticmethod
    def names(part):
        return [it[0] for it in part.items]

    @staticmethod
    def build(part, epoch):
        req = ps_pb2.DensePushRequest(epoch=epoch, key=part.key)
        for name, g, lr in part.items:
            req.tensors.add(name=name, grads=g.tobytes(), learning_rate=lr)
        return req

    @staticmethod
    def on_ok(part, resp):
        pass
