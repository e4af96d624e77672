"""PsClient: the Python client of the parameter server (pull, push, dense, catalog).

Every call runs in the C++ client library (client/ps_client.h), bound as elastic_ps._core:
it de-duplicates ids (summing duplicate ids' gradients), routes them to the pods that own
their vshards, sends one RPC per pod in parallel, retries with backoff, follows the
master's shard map, keys pushes so that each is applied once, and refuses non-finite
gradients before sending anything (docs/architecture.md, "Routing"). This module only
turns Python arguments into arrays and protobuf messages, and results back into them:

- ids: any integer array-like, as one int64 array (no per-element Python work);
- rows land in place: `pull(..., out=buf)` writes into `buf` (a C-contiguous float32
  numpy array, or a torch CPU tensor, of shape (n, dim));
- the GIL is released for every call that may block and for every wait, so other Python
  threads run meanwhile;
- errors are PsError(code, message) with code a grpc.StatusCode (elastic_ps.errors), or
  ValueError for bad arguments.
"""

import concurrent.futures
import logging
import threading
import weakref

import numpy as np

from . import routing
from ._native import core
from ._stubs import ps_pb2
from .errors import PsError, TableConflictError  # noqa: F401 (part of this module's API)
from .security import Security

log = logging.getLogger("elastic_ps")

# What the asynchronous calls return (client/python/_core/handle.h).
Handle = core.Handle

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


_EVICTION_POLICIES = {
    "lfu": ps_pb2.EvictionSpec.LFU,
    "lru": ps_pb2.EvictionSpec.LRU,
}


def _count(value, what):
    """`value` as a count >= 0 (None: 0, unset), or ValueError."""
    if value is None:
        return 0
    if isinstance(value, bool) or int(value) != value or value < 0:
        raise ValueError(f"{what} must be a whole number >= 0, got {value!r}")
    return int(value)


def table_spec(name, dim, *, optimizer="adagrad", learning_rate=None, initializer="normal",
               admit_after=None, ttl_s=None, max_rows=None, eviction=None, clip_value=None,
               clip_norm=None, **hyper):
    """A ps_pb2.TableSpec (see PsClient.create_table)."""
    init, opt = _split_hyper(hyper)
    spec = ps_pb2.TableSpec(name=name, dim=int(dim),
                            initializer=make_initializer(initializer, **init),
                            optimizer=make_optimizer(optimizer, learning_rate, **opt))
    if clip_value is not None:
        spec.clip_value = float(clip_value)
    if clip_norm is not None:
        spec.clip_norm = float(clip_norm)
    admit_after = _count(admit_after, "admit_after")
    if admit_after > 1:  # 0 or 1: every id admitted at its first push (the spec unset)
        spec.admission.min_count = admit_after
    ttl_s, max_rows = _count(ttl_s, "ttl_s"), _count(max_rows, "max_rows")
    if eviction is not None:
        policy = _EVICTION_POLICIES.get(str(eviction).lower())
        if policy is None:
            raise ValueError(f"unknown eviction {eviction!r}; one of {sorted(_EVICTION_POLICIES)}")
        if not (ttl_s or max_rows):
            raise ValueError(f"eviction={eviction!r} needs ttl_s or max_rows: without a limit "
                             "nothing is ever evicted")
        spec.eviction.policy = policy
    if ttl_s:
        spec.eviction.ttl_seconds = ttl_s
    if max_rows:
        spec.eviction.max_rows = max_rows
    return spec


def dense_spec(name, shape, *, optimizer="adagrad", learning_rate=None, initializer="normal",
               **hyper):
    """A ps_pb2.DenseSpec (see PsClient.create_dense)."""
    init, opt = _split_hyper(hyper)
    shape = [int(d) for d in (shape if np.ndim(shape) else [shape])]
    return ps_pb2.DenseSpec(name=name, shape=shape,
                            initializer=make_initializer(initializer, **init),
                            optimizer=make_optimizer(optimizer, learning_rate, **opt))


class ShardMap:
    """A snapshot of the routing the client's calls are made with (PsClient.shard_map):
    pod `owner[v]` owns vshard v; pods by `addresses` / `pod_ids`, `up` as the master
    last reported them (always True with a static map). Read-only."""

    def __init__(self, epoch, owner, addresses, pod_ids, up=None):
        self.epoch = int(epoch)
        self.owner = np.asarray(owner, dtype=np.uint32)
        self.num_vshards = routing.check_num_vshards(len(self.owner))
        self.addresses = list(addresses)
        self.pod_ids = list(pod_ids)
        self.up = list(up) if up is not None else [True] * len(self.addresses)

    def pods_of(self, table, ids):
        """Pod index of every id of `table`."""
        return self.owner[routing.vshards(table, ids, self.num_vshards)]

    def pod_of_dense(self, name):
        return int(self.owner[routing.dense_vshard(name, self.num_vshards)])

    def __repr__(self):
        return (f"ShardMap(epoch={self.epoch}, num_vshards={self.num_vshards}, "
                f"pods={list(zip(self.pod_ids, self.addresses))})")


def _to_dict(message):
    """A flat message (StatsResponse) as {field: Python value}, every field included."""
    return {f.name: getattr(message, f.name) for f in message.DESCRIPTOR.fields}


def _out_array(out, what):
    """`out` as a numpy array over the same memory (a torch CPU tensor: its numpy view);
    None stays None (the client allocates)."""
    if out is None or isinstance(out, np.ndarray):
        return out
    a = np.asarray(out)
    if a.base is None:  # a copy (a list...): rows written there would be lost
        raise ValueError(f"{what}: out must be a numpy array or a CPU tensor / buffer whose "
                         f"memory numpy can share, got {type(out).__name__}")
    return a


class _PullType:
    """What `dtype` of a pull asks for (PsClient.pull): the wire's ps.ValueType and the
    torch dtype of the rows to return (None: numpy; numpy has no bfloat16, so numpy
    bfloat16 rows come widened to float32)."""

    def __init__(self, dtype):
        self.value_type, self.torch_dtype, self.widen = ps_pb2.FLOAT32, None, False
        if dtype is None:
            return
        name = str(dtype)
        if name.startswith("torch."):
            name, self.torch_dtype = name[len("torch."):], dtype
        elif name != "bfloat16":
            try:
                name = np.dtype(dtype).name
            except TypeError:
                name = None
        if name == "float32":
            self.torch_dtype = None
        elif name == "bfloat16":
            self.value_type = ps_pb2.BFLOAT16
            self.widen = self.torch_dtype is None  # new numpy rows: float32, widened
        elif name == "float16":
            self.value_type = ps_pb2.FLOAT16
        else:
            raise ValueError(f"pull dtype {dtype!r}: one of float32, bfloat16 (torch.bfloat16 or "
                             f"'bfloat16'), float16 (np.float16, 'float16' or torch.float16)")

    def out(self, out, what):
        """The caller's out as the array _core fills (a 16-bit torch tensor: its int16
        view); None stays None."""
        if out is not None and self.torch_dtype is not None and hasattr(out, "view") and \
                str(getattr(out, "dtype", "")) in ("torch.bfloat16", "torch.float16"):
            import torch
            return out.view(torch.int16).numpy()
        return _out_array(out, what)

    def rows(self, rows):
        """_core's rows (float32, or int16 raw bits) as the caller asked for them."""
        if rows is None or rows.dtype != np.int16:
            return rows
        if self.torch_dtype is not None:
            import torch
            return torch.from_numpy(rows).view(self.torch_dtype)
        return rows.view(np.float16)


def _grads_array(grads):
    return np.ascontiguousarray(np.asarray(grads, dtype=np.float32))


def _check_lr(lr):
    lr = float(lr)
    if not np.isfinite(lr) or lr < 0:
        raise ValueError(f"learning_rate {lr} must be finite and >= 0")
    return lr


def _run_callbacks(callbacks):
    """The client's callback thread: runs add_done_callback functions as calls finish (and
    releases the arrays of handles dropped before their call was done)."""
    while True:
        todo = callbacks.next()
        if todo is None:
            return
        todo.reverse()  # popped in the order they were added
        while todo:
            fn, handle = todo.pop()
            try:
                fn(handle)
            except Exception:  # noqa: BLE001 - as concurrent.futures: logged, not raised
                log.exception("a done-callback of an elastic_ps call raised")
            # Nothing of a finished call may stay referenced here while the next wait
            # blocks: the handle keeps the call's arrays.
            del fn, handle


def _shutdown(client, thread, pool_box):
    client.close()  # waits for the calls in flight; then the callback thread's loop ends
    if thread is not threading.current_thread():
        thread.join()
    if pool_box:
        pool_box[0].shutdown(wait=True)


def core_options(master=None, *, servers=None, num_vshards=None, worker_id=0, incarnation=1,
                 deadline_s=10.0, max_attempts=10, connect_timeout_s=30.0,
                 initial_backoff_s=0.02, max_backoff_s=4.0, security=None,
                 completion_threads=1, channels_per_server=2):
    """The C++ ClientOptions (client/ps_client.h) of PsClient's arguments (see PsClient);
    ValueError for bad ones. Worker uses it for its session's master calls too."""
    if not master and not servers:
        raise ValueError("PsClient needs master='host:port' or servers=[...]")
    if deadline_s <= 0 or max_attempts < 1 or not 0 < initial_backoff_s <= max_backoff_s:
        raise ValueError("need deadline_s > 0, max_attempts >= 1, "
                         "0 < initial_backoff_s <= max_backoff_s")
    if num_vshards is not None:
        num_vshards = routing.check_num_vshards(num_vshards)
    o = core.ClientOptions()
    o.master = master or ""
    o.servers = [] if master else list(servers)
    o.num_vshards = num_vshards or 0  # 0: the pods'
    o.worker_id = int(worker_id)
    o.incarnation = int(incarnation)
    o.deadline_ms = max(1, int(deadline_s * 1000))
    o.max_attempts = int(max_attempts)
    o.connect_timeout_ms = max(1, int(connect_timeout_s * 1000))
    o.initial_backoff_ms = max(1, int(initial_backoff_s * 1000))
    o.max_backoff_ms = max(o.initial_backoff_ms, int(max_backoff_s * 1000))
    o.completion_threads = int(completion_threads)
    o.channels_per_server = int(channels_per_server)
    # TLS and token (elastic_ps.security); default: from the PS_TLS_* environment.
    o.security = (security if security is not None else Security.from_env()).to_core()
    return o


class _DenseFuture(concurrent.futures.Future):
    """The handle of an asynchronous dense call: a concurrent.futures.Future with wait()."""

    def wait(self, timeout=None):
        concurrent.futures.wait([self], timeout)
        return self.done()


class PsClient:
    """A client of the parameter server; thread-safe.

    PsClient(master="host:port") takes the pods and the shard map from the master (waiting
    up to connect_timeout_s until every pod that owns vshards is live) and follows map
    changes. PsClient(servers=[...]) uses the static map of pods started --shard=i/N.
    """

    def __init__(self, master=None, *, servers=None, num_vshards=None, worker_id=0,
                 incarnation=1, deadline_s=10.0, max_attempts=10, connect_timeout_s=30.0,
                 initial_backoff_s=0.02, max_backoff_s=4.0, max_workers=16, security=None,
                 completion_threads=1, channels_per_server=2):
        o = core_options(master, servers=servers, num_vshards=num_vshards, worker_id=worker_id,
                         incarnation=incarnation, deadline_s=deadline_s,
                         max_attempts=max_attempts, connect_timeout_s=connect_timeout_s,
                         initial_backoff_s=initial_backoff_s, max_backoff_s=max_backoff_s,
                         security=security, completion_threads=completion_threads,
                         channels_per_server=channels_per_server)
        self._master_address = master
        self._max_workers = max(1, int(max_workers))
        self._core = core.Client(o)  # connects; raises PsError
        self._pool_box = []  # the dense calls' thread pool, made on first use
        self._pool_lock = threading.Lock()
        thread = threading.Thread(target=_run_callbacks, args=(self._core.callbacks,),
                                  name="elastic_ps-callbacks", daemon=True)
        thread.start()
        # close() and garbage collection and interpreter exit all end here, once.
        self._finalizer = weakref.finalize(self, _shutdown, self._core, thread, self._pool_box)

    # ---- identity, lifecycle ----

    @property
    def worker_id(self):
        """The worker id in this client's PushKeys."""
        return self._core.worker_id

    @property
    def incarnation(self):
        """The incarnation in this client's PushKeys (a Worker's changes when it registers
        again after a lost lease)."""
        return self._core.incarnation

    def set_identity(self, worker_id, incarnation):
        """Pushes from now on carry (worker_id, incarnation) (PsClient::SetIdentity); the
        key sequence goes on. Pushes already started keep their keys. ValueError for 0."""
        self._core.set_identity(int(worker_id), int(incarnation))

    def client_stats(self):
        """This client's counters since it connected (PsClient::client_stats): pulls,
        pushes, push_rpcs, duplicate_pushes (pods answered `duplicate`: applied before),
        reused_keys (of those, a first attempt: another process used the key; its
        gradients were dropped; should stay 0), retries, map_refreshes, reroutes,
        read_fallbacks (read-only pull RPCs sent to followers of an unreachable pod)."""
        return self._core.client_stats()

    def close(self):
        """Waits for the calls in flight, then closes the channels; later calls raise
        PsError(CANCELLED). Idempotent."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def shard_map(self):
        """The routing calls are made with now (a ShardMap snapshot)."""
        epoch, owner, pods = self._core.shard_map()
        return ShardMap(epoch, owner, [p[1] for p in pods], [p[0] for p in pods],
                        [p[2] for p in pods])

    @property
    def num_vshards(self):
        return self.shard_map.num_vshards

    # ---- catalog ----

    def create_table(self, name, dim=None, *, optimizer="adagrad", learning_rate=None,
                     initializer="normal", admit_after=None, ttl_s=None, max_rows=None,
                     eviction=None, clip_value=None, clip_norm=None, **hyper):
        """Creates an embedding table (or takes a ready ps_pb2.TableSpec as `name`).

        Idempotent for an identical spec; TableConflictError (ALREADY_EXISTS) for a
        different one. Returns the normalized spec. Through the master when connected to
        one (it persists the catalog and gives it to pods that start later); the pods
        are then told directly too, so the table is usable at once.

        The feature lifecycle (TableSpec.admission / eviction, docs/python.md):
          admit_after=N: a row is created only at its id's N-th push (0 or 1: at the
            first); until then pulls return the initial value and gradients are dropped;
          ttl_s=T: rows not updated for T seconds are evicted;
          max_rows=M: the whole table (across the cluster) is kept at M rows or fewer;
          eviction="lfu" (default) or "lru": which rows max_rows evicts first.
        clip_value / clip_norm: gradient clipping per element / per row L2 norm (0 or
        None: off)."""
        if isinstance(name, ps_pb2.TableSpec):
            spec = name
        else:
            if dim is None:
                raise ValueError("create_table needs dim")
            spec = table_spec(name, dim, optimizer=optimizer, learning_rate=learning_rate,
                              initializer=initializer, admit_after=admit_after, ttl_s=ttl_s,
                              max_rows=max_rows, eviction=eviction, clip_value=clip_value,
                              clip_norm=clip_norm, **hyper)
        self._core.create_table(spec.SerializeToString())
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
        self._core.create_dense(spec.SerializeToString())
        return self.dense(spec.name)

    def table(self, name):
        """The normalized TableSpec of `name`; PsError(NOT_FOUND) if there is none."""
        return ps_pb2.TableSpec.FromString(self._core.get_table(name))

    def dense(self, name):
        """The normalized DenseSpec of `name`; PsError(NOT_FOUND) if there is none."""
        return ps_pb2.DenseSpec.FromString(self._core.get_dense(name))

    def tables(self):
        """{name: TableSpec} of every table the pods hold (asked now)."""
        return {t.spec.name: t.spec for d in self.describe().values() for t in d.tables}

    def dense_tensors(self):
        """{name: DenseSpec} of every dense tensor the pods hold (asked now)."""
        return {t.spec.name: t.spec for d in self.describe().values() for t in d.dense}

    def describe(self):
        """Per pod address (the pods that are up, in map order): its DescribeResponse
        (tables with their rows, vshards owned)."""
        return {address: ps_pb2.DescribeResponse.FromString(b)
                for _, address, b in self._core.describe()}

    # ---- sparse pull / push ----

    def pull(self, table, ids, read_only=False, out=None, dtype=None):
        """Rows of `ids` (any int array-like; duplicates allowed) -> float32 (n, dim).

        out: a C-contiguous float32 (n, dim) array (or torch CPU tensor) to fill instead of
        a new array; it is returned. read_only: evaluation pull, a missing row comes back at
        its initial value and is not created.

        dtype: compact rows on the wire (half the bytes). The pod rounds each stored
        float32 to nearest even; what comes back:
          - torch.bfloat16 / torch.float16: a tensor of that dtype (or `out`, such a tensor,
            or a float32 one to get the values widened);
          - np.float16 / "float16": a float16 ndarray;
          - "bfloat16": numpy has no bfloat16, so a float32 ndarray holding the bfloat16
            values exactly (widened on arrival; the wire still carries 2 bytes a value).
        fp16 overflows to +-inf beyond 65504; bfloat16 has float32's range. Pushes stay
        float32."""
        kind = _PullType(dtype)
        rows = self._core.pull([table], [routing.as_ids(ids)], [kind.out(out, "pull")],
                               bool(read_only), kind.value_type, kind.widen)[0]
        return out if out is not None else kind.rows(rows)

    def pull_multi(self, requests, read_only=False, out=None, dtype=None):
        """{table: ids} -> {table: float32 (len(ids), dim)}, one RPC per pod for all tables.
        out: {table: array} to fill (tables not in it get new arrays). dtype: as pull's."""
        kind = _PullType(dtype)
        tables, ids, outs = self._pull_args(requests, out, kind)
        rows = self._core.pull(tables, ids, outs, bool(read_only), kind.value_type, kind.widen)
        return self._pulled(tables, rows, out, kind)

    def push(self, table, ids, grads, learning_rate=0.0):
        """Applies gradients: grads[i] (float32 (n, dim), or n*dim floats) to ids[i];
        duplicate ids' grads are summed. learning_rate > 0 overrides the table's. Each
        pod's part is applied exactly once."""
        self._core.push([table], [routing.as_ids(ids)], [_grads_array(grads)],
                        _check_lr(learning_rate))

    def push_multi(self, requests, learning_rate=0.0):
        """{table: (ids, grads)} in one RPC per pod (see push)."""
        lr = _check_lr(learning_rate)
        self._core.push(*self._push_args(requests), lr)

    @staticmethod
    def _pull_args(requests, out, kind):
        out = out or {}
        tables = list(requests)
        return (tables, [routing.as_ids(requests[t]) for t in tables],
                [kind.out(out.get(t), f"pull of '{t}'") for t in tables])

    @staticmethod
    def _pulled(tables, rows, out, kind):
        """{table: rows} of a pull_multi: the caller's out where given."""
        out = out or {}
        return {t: out[t] if out.get(t) is not None else kind.rows(r)
                for t, r in zip(tables, rows)}

    @staticmethod
    def _push_args(requests):
        tables, ids, grads = [], [], []
        for table, pair in requests.items():
            try:
                i, g = pair
            except (TypeError, ValueError):
                raise ValueError(f"push_multi wants {{table: (ids, grads)}}; got {type(pair)} "
                                 f"for '{table}'") from None
            tables.append(table)
            ids.append(routing.as_ids(i))
            grads.append(_grads_array(g))
        return tables, ids, grads

    # ---- asynchronous forms: elastic_ps._core.Handle ----

    def pull_async(self, table, ids, read_only=False, out=None, dtype=None):
        """pull, asynchronous: a Handle whose result() is the rows (e.g. to prefetch the
        next batch while this one trains). The handle keeps `ids` and `out` alive until the
        call is done; they must not change meanwhile. dtype: as pull's."""
        kind = _PullType(dtype)
        h = self._core.pull_async([table], [routing.as_ids(ids)], [kind.out(out, "pull")],
                                  bool(read_only), kind.value_type, kind.widen)
        if h.value is not None:
            h.value = out if out is not None else kind.rows(h.value[0])
        return h

    def pull_multi_async(self, requests, read_only=False, out=None, dtype=None):
        """pull_multi, asynchronous: a Handle whose result() is {table: rows}."""
        kind = _PullType(dtype)
        tables, ids, outs = self._pull_args(requests, out, kind)
        h = self._core.pull_async(tables, ids, outs, bool(read_only), kind.value_type, kind.widen)
        if h.value is not None:
            h.value = self._pulled(tables, h.value, out, kind)
        return h

    def push_async(self, table, ids, grads, learning_rate=0.0):
        """push, asynchronous: a Handle (result() is None or raises what push would). The
        arrays are read before this returns."""
        return self._core.push_async([table], [routing.as_ids(ids)], [_grads_array(grads)],
                                     _check_lr(learning_rate))

    def push_multi_async(self, requests, learning_rate=0.0):
        """push_multi, asynchronous: a Handle."""
        lr = _check_lr(learning_rate)
        return self._core.push_async(*self._push_args(requests), lr)

    # ---- dense ----

    def pull_dense(self, names):
        """{name: float32 array of the tensor's shape} for a name or a list of names."""
        names = [names] if isinstance(names, str) else list(dict.fromkeys(names))
        if not names:
            return {}
        return dict(zip(names, self._core.pull_dense(names)))

    def push_dense(self, grads, learning_rate=0.0):
        """Applies {name: grads (the tensor's shape or numel floats)}; exactly once."""
        lr = _check_lr(learning_rate)
        if grads:
            self._core.push_dense(list(grads), [_grads_array(g) for g in grads.values()], lr)

    def pull_dense_async(self, names):
        """pull_dense on the client's dense thread pool: a Future (with wait())."""
        return self._submit(self.pull_dense, names)

    def push_dense_async(self, grads, learning_rate=0.0):
        """push_dense on the client's dense thread pool: a Future (with wait()). The arrays
        must not change until it is done."""
        return self._submit(self.push_dense, dict(grads), learning_rate)

    def _submit(self, fn, *args):
        with self._pool_lock:
            if not self._pool_box:
                self._pool_box.append(concurrent.futures.ThreadPoolExecutor(
                    self._max_workers, thread_name_prefix="elastic_ps-dense"))
            pool = self._pool_box[0]
        future = _DenseFuture()

        def run():
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to the future
                future.set_exception(e)

        pool.submit(run)
        return future

    # ---- stats, low level ----

    def stats(self, as_dict=True):
        """Per pod address: its StatsResponse (as a dict unless as_dict=False)."""
        out = {}
        for _, address, b in self._core.stats():
            s = ps_pb2.StatsResponse.FromString(b)
            out[address] = _to_dict(s) if as_dict else s
        return out

    def raw_call(self, address, method, request):
        """Sends one request (a ps_pb2 message) to one pod as is (no routing, retries,
        keys); returns the response message or raises PsError. For tools and tests (e.g.
        resending a PushKey)."""
        m = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"].methods_by_name.get(method)
        if m is None:
            raise ValueError(f"ParameterServer has no method {method!r}")
        answer = self._core.raw_call(address, method, request.SerializeToString())
        return getattr(ps_pb2, m.output_type.name).FromString(answer)

    def next_push_key(self):
        """A fresh PushKey of this client's identity (from the C++ client's sequence)."""
        worker_id, incarnation, sequence = self._core.next_push_key()
        return ps_pb2.PushKey(worker_id=worker_id, incarnation=incarnation, sequence=sequence)
