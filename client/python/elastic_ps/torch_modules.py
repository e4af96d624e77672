"""PyTorch modules whose parameters live on the parameter server.

Sparse: :class:`PsEmbeddingBag` and :class:`PsEmbedding` take the same inputs and give the
same outputs as ``torch.nn.EmbeddingBag`` / ``torch.nn.Embedding``, but hold no weight;
:class:`PsEmbeddingBagCollection` is the multi-table form (TorchRec's
EmbeddingBagCollection: per-table :class:`PsEmbeddingBagConfig`, a :class:`KeyedJagged`
input, a dict of per-feature outputs) with one pull and one push per step for all its
tables. A forward pass in training mode

1. pulls the rows of the batch's ids from the PS (rows are created on first touch), in
   one of two layouts (``layout=``):

   - ``"ids"``: one row per id as given; the client de-duplicates the ids on the wire
     (each distinct row travels once) and writes every occurrence's row in order. No
     ``torch.unique``, and for bags of one id (one id per field) the rows *are* the
     output: no gather in the forward, no scatter-add in the backward;
   - ``"unique"``: the distinct ids (``np.unique``), then ``F.embedding_bag`` /
     ``F.embedding`` over the inverse index: fewer rows for long bags with repeated ids;
   - ``"auto"`` (default): ``"ids"`` when every bag holds one id, else ``"unique"``;

2. makes the rows a leaf tensor that requires grad and computes the output on it, so the
   output and its autograd are torch's own;
3. remembers ``(table, ids, leaf)`` as *pending*.

``loss.backward()`` leaves the rows' gradients in the leaves; :class:`PsOptimizer`
``.step()`` pushes every pending gradient of every PS module of the model (one
``push_multi``; the client sums duplicate ids) and the servers' optimizers update the
rows. Several forwards before one ``step()`` accumulate. ``push_on_backward=True`` (single
tables) pushes from a tensor hook during backward instead.

Pipelining (docs/training.md, "Pipelining"): ``PsOptimizer(..., staleness=S)`` pushes
asynchronously with at most S steps in flight; ``module.prefetch(next_input)`` (or
:class:`elastic_ps.pipeline.TrainPipeline`, which owns the data iterator) starts the pull
of the next batch's rows while this batch computes (a module no PsOptimizer pushes pulls
at once: the optimizer's StepSync makes the calls asynchronous); :class:`PsDense` pulls its dense
parameters every ``pull_every`` steps ahead of the step that uses them. A pull that a step
``t`` reads is issued only once this worker's pushes of steps ``<= t - 1 - S`` are
acknowledged (elastic_ps.step_sync), so with ``S = 0`` every step reads exactly what the
unpipelined loop reads. An error of an asynchronous push is raised at the next step.

Evaluation: under ``torch.no_grad()`` or after ``module.eval()`` the pull is ``read_only``
(a missing row comes back at its initial value and is not created), prefetched rows are
left alone, and nothing becomes pending.

Dense: :class:`PsDense` keeps local ``nn.Parameter`` copies of dense tensors stored on the
PS; ``PsOptimizer.step()`` pushes their gradients (the server's optimizer applies them).
Dense layers may instead stay local and be trained by any torch optimizer; with several
workers only PS-held parameters are shared, so the example model keeps its MLP on the PS.

Not thread-safe: one training thread per module and optimizer.
"""

import collections
import logging
import math
import threading

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .keyed_jagged import KeyedJagged
from .step_sync import StepSync, accepts

__all__ = ["KeyedJagged", "PsDense", "PsEmbedding", "PsEmbeddingBag",
           "PsEmbeddingBagCollection", "PsEmbeddingBagConfig", "PsOptimizer",
           "default_initializer"]

log = logging.getLogger("elastic_ps")

_LAYOUTS = ("auto", "ids", "unique")
_MODES = ("sum", "mean", "max")


def _ids_numpy(t):
    return t.detach().to("cpu", torch.int64).contiguous().numpy().reshape(-1)


# ---- one forward's rows ----


class _Plan:
    """What a forward pulls from one table: ``ids`` (int64 ndarray) and, for the unique
    layout, ``inverse`` (tensor: the row of each input id), else None (row i is id i)."""

    __slots__ = ("ids", "inverse")

    def __init__(self, ids, inverse=None):
        self.ids, self.inverse = ids, inverse


def _plan(ids, layout):
    """The _Plan of 1-D id tensor ``ids`` in ``layout`` ("ids" or "unique")."""
    flat = _ids_numpy(ids)
    if layout == "ids":
        return _Plan(flat)
    uniq, inverse = np.unique(flat, return_inverse=True)
    return _Plan(uniq, torch.from_numpy(inverse.reshape(-1).astype(np.int64, copy=False)))


class _Lookup:
    """The rows of one forward, for every table of a module: pulled now or ahead of time
    (prefetch). ``issue`` may run on any thread (a push's completion); ``wait`` on the
    training thread. Rows land in buffers owned by this object (the client's ``out=``
    when it has one); the leaf tensors are made on them without a copy."""

    def __init__(self, client, dims, plans, read_only, key=None, dtype=None):
        self.client = client
        # The pull's wire dtype (PsClient.pull's dtype; None: float32). The rows still
        # land as float32: the client widens them.
        self.dtype = dtype
        self.dims = dims  # table -> dim
        self.plans = plans  # table -> _Plan
        self.read_only = read_only
        self.key = key  # the module input this is for (prefetch matching)
        self._issued = threading.Event()
        self._handle = None
        self._error = None
        self._rows = None

    def issue(self, sync=None):
        """Starts the pull (through ``sync``'s calls; without one, pulls now)."""
        try:
            requests = {t: p.ids for t, p in self.plans.items()}
            extra = {} if self.dtype is None else {"dtype": self.dtype}
            if sync is None:
                if accepts(self.client, "pull_multi", "out"):
                    outs = _buffers(requests, self.dims)
                    self.client.pull_multi(requests, read_only=self.read_only, out=outs, **extra)
                    self._rows = outs
                else:
                    self._rows = _as_rows(self.client.pull_multi(
                        requests, read_only=self.read_only, **extra), self.dims, requests)
            else:
                self._handle = _start_pull(sync, self.client, requests, self.dims,
                                           self.read_only, extra)
        except BaseException as e:  # noqa: BLE001 (raised by wait, on the training thread)
            self._error = e
        finally:
            self._issued.set()

    def wait(self):
        """{table: float32 (n, dim) ndarray}, or raises the pull's error."""
        self._issued.wait()
        if self._error is not None:
            raise self._error
        if self._rows is None:
            outs, handle = self._handle
            res = handle.result()
            self._rows = outs if outs is not None else _as_rows(
                res, self.dims, {t: p.ids for t, p in self.plans.items()})
        return self._rows


def _buffers(requests, dims):
    return {t: np.empty((len(ids), dims[t]), np.float32) for t, ids in requests.items()}


def _as_rows(res, dims, requests):
    """A pull's result ({table: rows} or one table's rows) as float32 (n, dim) arrays."""
    if not isinstance(res, dict):
        (table,) = requests
        res = {table: res}
    return {t: np.asarray(res[t], dtype=np.float32).reshape(len(requests[t]), dims[t])
            for t in requests}


def _start_pull(sync, client, requests, dims, read_only, extra):
    """Starts one pull of every table in ``requests``; returns (out buffers or None, handle).
    Uses the client's pull_multi_async, else pull_async for one table, else pull_multi on
    ``sync``'s threads; rows go straight into buffers when the call takes ``out=``.
    ``extra``: further keyword arguments of the pull (dtype)."""
    if len(requests) == 1 and not hasattr(client, "pull_multi_async") and hasattr(
            client, "pull_async"):
        (table, ids), = requests.items()
        if accepts(client, "pull_async", "out"):
            out = np.empty((len(ids), dims[table]), np.float32)
            return {table: out}, client.pull_async(table, ids, read_only=read_only, out=out,
                                                   **extra)
        return None, client.pull_async(table, ids, read_only=read_only, **extra)
    method = "pull_multi_async" if hasattr(client, "pull_multi_async") else "pull_multi"
    if accepts(client, method, "out"):
        outs = _buffers(requests, dims)
        return outs, sync.call("pull_multi", requests, read_only=read_only, out=outs, **extra)
    return None, sync.call("pull_multi", requests, read_only=read_only, **extra)


def _wire_dtype(pull_dtype):
    """A module's ``pull_dtype`` (None, torch.float32, torch.bfloat16, torch.float16) as
    the client's pull dtype: None for float32, else "bfloat16" / "float16" (the rows come
    widened to float32 into the module's buffers)."""
    if pull_dtype is None or pull_dtype == torch.float32:
        return None
    if pull_dtype == torch.bfloat16:
        return "bfloat16"
    if pull_dtype == torch.float16:
        return "float16"
    raise ValueError(f"pull_dtype must be torch.float32, torch.bfloat16 or torch.float16, "
                     f"got {pull_dtype!r}")


# ---- the sparse modules ----


class _PsRows(nn.Module):
    """What every sparse PS module shares: its tables, the pull (now or prefetched), the
    pending gradients. Subclasses turn their input into {table: _Plan} and call
    ``_prefetch`` / ``_rows`` with it. ``client``: a PsClient (or anything with its
    methods).

    ``pull_dtype``: torch.bfloat16 or torch.float16 pulls rows at 2 bytes a value (half
    the bytes on the wire; each stored float32 rounded to nearest even by the pod). The
    forward still computes in float32 (the client widens the rows exactly on arrival), so
    the model downstream is unchanged, and gradients are pushed in float32."""

    def __init__(self, client, dims, pull_dtype=None):
        super().__init__()
        self.client = client
        self.pull_dtype = pull_dtype
        self._wire_dtype = _wire_dtype(pull_dtype)
        self._dims = dict(dims)  # table -> dim
        self._pending = []  # (table, ids ndarray, leaf tensor)
        self._queue = collections.deque()  # prefetched _Lookups, oldest first
        self._sync = None  # the StepSync of the PsOptimizer that pushes this module
        self._consumed_step = -1  # the step whose forward took the last prefetched rows
        self.pulled_rows = 0  # rows pulled so far (diagnostics)

    def _attach(self, sync):
        self._sync = sync

    def _training(self):
        return self.training and torch.is_grad_enabled()

    def _prefetch(self, key, plans):
        lookup = _Lookup(self.client, self._dims, plans, read_only=False, key=key,
                         dtype=self._wire_dtype)
        sync = self._sync
        if sync is None:
            lookup.issue()
        else:
            step = sync.steps
            target = (step + 1 if self._consumed_step == step else step) + len(self._queue)
            sync.when_visible(sync.gate(target), lambda: lookup.issue(sync))
        self._queue.append(lookup)

    def _rows(self, key, same, plans_fn):
        """{table: (rows tensor, inverse or None)} for the input ``key``: the oldest
        prefetched rows when they are for an equal input (``same(key, lookup.key)``), else
        pulled now (``plans_fn()`` says what). In training the rows are leaves that
        require grad, and pending."""
        training = self._training()
        lookup = None
        if training and self._queue:
            head = self._queue.popleft()
            if same(key, head.key):
                lookup = head
            else:
                log.warning("%s: the input differs from the prefetched one; dropping %d "
                            "prefetched batches and pulling", type(self).__name__,
                            1 + len(self._queue))
                self._queue.clear()
        if lookup is None:
            lookup = _Lookup(self.client, self._dims, plans_fn(), read_only=not training,
                             dtype=self._wire_dtype)
            if training and self._sync is not None:  # the pushes it must see, first
                self._sync.wait_visible(self._sync.gate(self._sync.steps))
            lookup.issue()  # pulls now, in this thread
        if training and self._sync is not None:
            self._sync.check()  # an asynchronous push's error surfaces here at the latest
            self._consumed_step = self._sync.steps
        rows = lookup.wait() if self._sync is None else self._sync.timed("rows", lookup.wait)
        leaves = {}
        for table, plan in lookup.plans.items():
            leaf = torch.from_numpy(rows[table])
            self.pulled_rows += leaf.shape[0]
            if training:
                leaf.requires_grad_(True)
                self._on_leaf(table, plan.ids, leaf)
            leaves[table] = (leaf, plan.inverse)
        return leaves

    def _on_leaf(self, table, ids, leaf):
        self._pending.append((table, ids, leaf))

    def _take_pending(self):
        """Returns and clears [(table, ids, grad ndarray)] of pending pulls whose grad is
        set."""
        out = [(t, ids, leaf.grad.detach().numpy().astype(np.float32, copy=False))
               for t, ids, leaf in self._pending if leaf.grad is not None]
        self._pending = []
        return out

    def clear_pending(self):
        """Drops pending gradients without pushing them."""
        self._pending = []

    def clear_prefetched(self):
        """Forgets prefetched rows (pulls in flight complete unused)."""
        self._queue.clear()


def _pool(leaf, inverse, start, count, offsets, mode, weights, shape=None):
    """The bags of ``count`` ids whose rows are ``leaf[start:start + count]`` (inverse None)
    or ``leaf[inverse[start:start + count]]``. ``offsets`` None: one id per bag (the rows
    themselves, times ``weights``). ``shape``: a 2-D input's (bags, ids per bag)."""
    if offsets is None and shape is None:
        rows = leaf[start:start + count] if inverse is None else F.embedding(
            inverse[start:start + count], leaf)
        return rows if weights is None else rows * weights.reshape(-1, 1).to(rows.dtype)
    index = (torch.arange(start, start + count) if inverse is None
             else inverse[start:start + count])
    if shape is not None:
        index = index.view(shape)
    return F.embedding_bag(index, leaf, offsets, mode=mode, per_sample_weights=weights)


def _check_layout(layout):
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {_LAYOUTS}, got {layout!r}")
    return layout


class _PsSparse(_PsRows):
    """Shared part of PsEmbedding and PsEmbeddingBag: one table.

    ``create``: create table ``table`` (dim ``dim``) on construction; idempotent for the
    same spec, and ``**spec`` (optimizer, learning_rate, initializer and their parameters,
    e.g. ``initial_accumulator=0.01, stddev=0.01``) goes to ``client.create_table``.
    ``push_on_backward``: push from a tensor hook during backward instead of step().
    ``layout``: "auto", "ids" or "unique" (module docstring).
    ``pull_dtype``: rows on the wire in torch.bfloat16 / torch.float16 (see _PsRows).
    """

    def __init__(self, client, table, dim, create=True, push_on_backward=False, layout="auto",
                 pull_dtype=None, **spec):
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        super().__init__(client, {table: int(dim)}, pull_dtype)
        self.table = table
        self.dim = int(dim)
        self.layout = _check_layout(layout)
        self.push_on_backward = push_on_backward
        if create:
            client.create_table(table, self.dim, **spec)

    def _on_leaf(self, table, ids, leaf):
        if self.push_on_backward:
            leaf.register_hook(self._make_hook(ids))
        else:
            super()._on_leaf(table, ids, leaf)

    def _make_hook(self, ids):
        def hook(grad):
            self.client.push(self.table, ids, grad.detach().numpy().astype(np.float32))
            return grad

        return hook

    def take_pending(self):
        """Returns and clears [(ids, grad ndarray)] of pending pulls whose grad is set."""
        return [(ids, g) for _, ids, g in self._take_pending()]

    def _leaf(self, key, same, ids, layout):
        (leaf, inverse), = self._rows(key, same,
                                      lambda: {self.table: _plan(ids, layout)}).values()
        return leaf, inverse

    def extra_repr(self):
        return f"table={self.table!r}, dim={self.dim}, layout={self.layout!r}"


def _same_tensors(a, b):
    return all(x is y or (x is not None and y is not None and x.shape == y.shape
                          and torch.equal(x, y)) for x, y in zip(a, b))


class PsEmbedding(_PsSparse):
    """Like ``torch.nn.Embedding(num_embeddings=any int64, dim)``: ``forward(ids)`` with ids
    of any shape returns ``ids.shape + (dim,)``; rows live in PS table ``table``.
    ``prefetch(ids)`` starts the pull of a later forward's ids (module docstring)."""

    def _layout(self):
        return "ids" if self.layout == "auto" else self.layout

    def prefetch(self, ids):
        self._prefetch((ids,), {self.table: _plan(ids.reshape(-1), self._layout())})

    def forward(self, ids):
        leaf, inverse = self._leaf((ids,), _same_tensors, ids.reshape(-1), self._layout())
        out = leaf if inverse is None else F.embedding(inverse, leaf)
        return out.view(*ids.shape, self.dim)


class PsEmbeddingBag(_PsSparse):
    """Like ``torch.nn.EmbeddingBag(..., mode)``: ``forward(input, offsets=None,
    per_sample_weights=None)`` with a 2D input (B, N) (bags of fixed size) or a 1D input
    with ``offsets`` returns (B, dim); ``mode`` is "sum", "mean" or "max".
    ``prefetch(input, offsets=None)`` starts the pull of a later forward's input."""

    def __init__(self, client, table, dim, mode="sum", **kwargs):
        if mode not in _MODES:
            raise ValueError(f"mode must be sum, mean or max, got {mode!r}")
        super().__init__(client, table, dim, **kwargs)
        self.mode = mode

    @staticmethod
    def _bags_of_one(input, offsets):
        return (input.dim() == 2 and input.shape[1] == 1) or (
            input.dim() == 1 and offsets is not None and offsets.numel() == input.numel()
            and torch.equal(offsets, torch.arange(input.numel(), dtype=offsets.dtype)))

    def _layout(self, ones):
        return self.layout if self.layout != "auto" else "ids" if ones else "unique"

    def prefetch(self, input, offsets=None):
        layout = self._layout(self._bags_of_one(input, offsets))
        self._prefetch((input, offsets), {self.table: _plan(input.reshape(-1), layout)})

    def forward(self, input, offsets=None, per_sample_weights=None):
        if per_sample_weights is not None and self.mode != "sum":
            raise ValueError(f"per_sample_weights needs mode='sum', not {self.mode!r} "
                             "(as torch.nn.EmbeddingBag)")
        ones = self._bags_of_one(input, offsets)
        leaf, inverse = self._leaf((input, offsets), _same_tensors, input.reshape(-1),
                                   self._layout(ones))
        n = input.numel()
        if ones:  # the rows are the bags, in any mode
            return _pool(leaf, inverse, 0, n, None, self.mode, per_sample_weights)
        shape = tuple(input.shape) if input.dim() == 2 else None
        return _pool(leaf, inverse, 0, n, offsets, self.mode, per_sample_weights, shape)

    def extra_repr(self):
        return f"{super().extra_repr()}, mode={self.mode!r}"


class PsEmbeddingBagConfig:
    """One table of a :class:`PsEmbeddingBagCollection` (TorchRec's EmbeddingBagConfig):
    PS table ``name`` of ``dim`` floats per row, pooled with ``mode`` ("sum", "mean",
    "max") over each bag of the features ``feature_names`` (default: ``[name]``) it serves;
    ``layout`` as for the single-table modules; ``create``: create the table (idempotent);
    ``**spec``: its server-side optimizer and initializer, as ``client.create_table``
    takes them (``optimizer="adagrad", learning_rate=0.4, initial_accumulator=0.1``)."""

    def __init__(self, name, dim, mode="sum", feature_names=None, layout="auto", create=True,
                 **spec):
        if dim < 1:
            raise ValueError(f"table '{name}': dim must be >= 1, got {dim}")
        if mode not in _MODES:
            raise ValueError(f"table '{name}': mode must be one of {_MODES}, got {mode!r}")
        self.name = name
        self.dim = int(dim)
        self.mode = mode
        self.feature_names = list(feature_names) if feature_names else [name]
        self.layout = _check_layout(layout)
        self.create = create
        self.spec = spec

    def __repr__(self):
        return (f"PsEmbeddingBagConfig({self.name!r}, dim={self.dim}, mode={self.mode!r}, "
                f"features={self.feature_names}, layout={self.layout!r})")


class PsEmbeddingBagCollection(_PsRows):
    """Several PS tables behind one module, in TorchRec's spirit: ``forward(kj)`` takes a
    :class:`KeyedJagged` holding the bags of every feature the tables serve and returns
    ``{feature: (bags, dim) tensor}``. A forward pulls the rows of every table in one
    ``pull_multi`` (one RPC per pod); :class:`PsOptimizer` pushes them in one
    ``push_multi``. Features sharing a table are pulled together (one de-duplication).
    ``prefetch(kj)`` starts the pull of a later forward's input. ``pull_dtype``: rows on
    the wire in torch.bfloat16 / torch.float16 for every table (see _PsRows)."""

    def __init__(self, client, tables, pull_dtype=None):
        tables = list(tables)
        if not tables:
            raise ValueError("PsEmbeddingBagCollection needs at least one table config")
        names = [c.name for c in tables]
        features = [f for c in tables for f in c.feature_names]
        if len(set(names)) != len(names) or len(set(features)) != len(features):
            raise ValueError(f"PsEmbeddingBagCollection: table names {names} and feature "
                             f"names {features} must each be unique")
        super().__init__(client, {c.name: c.dim for c in tables}, pull_dtype)
        self.configs = tables
        for c in tables:
            if c.create:
                client.create_table(c.name, c.dim, **c.spec)

    def feature_names(self):
        return [f for c in self.configs for f in c.feature_names]

    def _layout(self, cfg, kj):
        if cfg.layout != "auto":
            return cfg.layout
        return "ids" if all(kj[f][1] is None for f in cfg.feature_names) else "unique"

    def _plans(self, kj):
        plans = {}
        for cfg in self.configs:
            for f in cfg.feature_names:
                if f not in kj:
                    raise ValueError(f"PsEmbeddingBagCollection: input has no feature '{f}' "
                                     f"(table '{cfg.name}'); it has {kj.keys()}")
            parts = [kj[f][0] for f in cfg.feature_names]
            ids = parts[0] if len(parts) == 1 else torch.cat(parts)
            plans[cfg.name] = _plan(ids, self._layout(cfg, kj))
        return plans

    def prefetch(self, kj):
        self._prefetch(kj, self._plans(kj))

    def forward(self, kj):
        leaves = self._rows(kj, lambda a, b: a.same_ids(b), lambda: self._plans(kj))
        out = {}
        for cfg in self.configs:
            leaf, inverse = leaves[cfg.name]
            start = 0
            for f in cfg.feature_names:
                ids, offsets = kj[f]
                if kj.weights(f) is not None and cfg.mode != "sum":
                    raise ValueError(f"feature '{f}' has weights but table '{cfg.name}' "
                                     f"pools with mode {cfg.mode!r} (weights need 'sum')")
                out[f] = _pool(leaf, inverse, start, ids.numel(), offsets, cfg.mode,
                               kj.weights(f))
                start += ids.numel()
        return out

    def extra_repr(self):
        return ", ".join(repr(c) for c in self.configs)


# ---- dense ----


def default_initializer(name, shape, fan_in_by_module=None):
    """The PS initializer matching torch's default for a parameter of ``shape``: uniform
    +-1/sqrt(fan_in) (nn.Linear / nn.Conv weights and biases), ones for other 1D weights.
    ``fan_in_by_module`` gives the fan-in for a bias (its module's weight)."""
    if len(shape) >= 2:
        bound = 1.0 / math.sqrt(max(1, int(np.prod(shape[1:]))))
        return {"kind": "uniform", "low": -bound, "high": bound}
    if name.endswith("bias") and fan_in_by_module:
        bound = 1.0 / math.sqrt(fan_in_by_module)
        return {"kind": "uniform", "low": -bound, "high": bound}
    if name.endswith("weight"):
        return {"kind": "constant", "value": 1.0}
    return {"kind": "zeros"}


class _DensePull:
    """One pull of a PsDense's tensors for a later step; ``issue`` on any thread."""

    def __init__(self, client, names):
        self.client, self.names = client, names
        self._issued = threading.Event()
        self._handle = None
        self._error = None

    def issue(self, sync):
        try:
            self._handle = sync.call("pull_dense", self.names)
        except BaseException as e:  # noqa: BLE001 (raised by wait)
            self._error = e
        finally:
            self._issued.set()

    def wait(self):
        self._issued.wait()
        if self._error is not None:
            raise self._error
        return self._handle.result()


class PsDense:
    """Binds the parameters of ``module`` to PS dense tensors ``prefix + name``.

    Creates each tensor on the PS (idempotent; initializer from ``initializers[name]`` or
    :func:`default_initializer`), then pulls the PS values into the local parameters.
    :class:`PsOptimizer` pushes the local gradients (one ``push_dense`` per step). Every
    ``pull_every`` steps the parameters are refreshed from the PS before the step's first
    forward of ``module`` (or of any of its submodules): under a PsOptimizer, the pull for
    refresh step ``t`` is issued one step ahead, as soon as the pushes of steps
    ``<= t - 1 - S`` are acknowledged, and its values are copied in when step ``t``
    starts (the steps in between do not wait for it); with S = 0 that is after the
    previous step's pushes, as late as possible, so the gradients pushed are computed on
    the freshest values other workers' pushes allow. ``**spec`` (optimizer,
    learning_rate, optimizer parameters) goes to ``client.create_dense``. Not thread-safe.
    """

    def __init__(self, client, module, prefix, pull_every=1, initializers=None, create=True,
                 **spec):
        if pull_every < 1:
            raise ValueError(f"pull_every must be >= 1, got {pull_every}")
        self.client = client
        self.module = module
        self.pull_every = pull_every
        self.steps = 0
        self.params = {}  # PS name -> local nn.Parameter
        self._sync = None
        self._ahead = {}  # refresh step -> _DensePull
        initializers = initializers or {}
        fan_in = {}
        for name, p in module.named_parameters():
            owner = name.rsplit(".", 1)[0] if "." in name else ""
            if p.dim() >= 2:
                fan_in[owner] = int(np.prod(p.shape[1:]))
        for name, p in module.named_parameters():
            ps_name = prefix + name
            self.params[ps_name] = p
            if create:
                owner = name.rsplit(".", 1)[0] if "." in name else ""
                init = initializers.get(name) or default_initializer(
                    name, tuple(p.shape), fan_in.get(owner))
                init = dict(init)
                client.create_dense(ps_name, list(p.shape), initializer=init.pop("kind"),
                                    **init, **spec)
        self.stale = False
        self.pull()
        self._hooks = [m.register_forward_pre_hook(self._before_forward)
                       for m in module.modules()]

    def _attach(self, sync):
        self._sync = sync

    def _before_forward(self, module, inputs):
        if self.stale:
            self._refresh()

    def parameters(self):
        return list(self.params.values())

    def pull(self):
        """Copies the PS values into the local parameters now."""
        self.stale = False
        self._copy_in(self.client.pull_dense(list(self.params)))

    def _copy_in(self, values):
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(torch.from_numpy(np.asarray(values[name], np.float32).reshape(p.shape)))

    def _refresh(self):
        """The refresh of the step about to run: the pull issued ahead for it, else one now
        (once the pushes it must see are acknowledged)."""
        self.stale = False
        sync = self._sync
        if sync is None:
            return self.pull()
        step = sync.steps
        due = [t for t in self._ahead if t <= step]
        if due:
            pull = self._ahead[max(due)]
            for t in due:
                del self._ahead[t]
            self._copy_in(sync.timed("dense", pull.wait))
        else:
            sync.wait_visible(sync.gate(step))
            self.pull()

    def _grads(self):
        grads = {}
        for name, p in self.params.items():
            if p.grad is not None:
                # A copy: the push may still read it when a torch optimizer's zero_grad
                # (set_to_none=False) or the next backward changes .grad in place.
                grads[name] = p.grad.detach().numpy().astype(np.float32).reshape(-1)
        return grads

    def _push(self, learning_rate):
        """Starts the push of the gradients of the parameters that have one (the handle, or
        None when there is none), clears them and counts the step."""
        grads = self._grads()
        handle = self._sync.call("push_dense", grads, learning_rate=learning_rate) \
            if grads else None
        self._end_step()
        return handle

    def _end_step(self):
        self.zero_grad()
        self.steps += 1
        if self.steps % self.pull_every == 0:
            self.stale = True

    def _schedule(self):
        """After a step: issues the pulls of the next refresh steps (this one and the one
        after it) when their pushes are visible."""
        sync = self._sync
        step = sync.steps
        for t in (step, step + 1):
            if t >= 1 and t % self.pull_every == 0 and t not in self._ahead:
                pull = _DensePull(self.client, list(self.params))
                self._ahead[t] = pull
                sync.when_visible(sync.gate(t), lambda p=pull: p.issue(sync))

    def _forget(self):
        """Drops pulls issued ahead and refreshes before the next forward."""
        self._ahead.clear()
        self.stale = True

    def step(self, learning_rate=0.0):
        """Pushes the gradients of the parameters that have one now, clears them, and marks
        the parameters stale every ``pull_every`` steps (the next forward pulls). A
        :class:`PsOptimizer` does this itself; call it only for a PsDense without one."""
        grads = self._grads()
        if grads:
            self.client.push_dense(grads, learning_rate=learning_rate)
        self._end_step()

    def zero_grad(self):
        for p in self.params.values():
            p.grad = None


class PsOptimizer:
    """The PS side of a training step: ``step()`` pushes every pending sparse gradient of
    the PS embedding modules inside ``model`` (one ``push_multi``) and the gradients of
    the :class:`PsDense` binders in ``dense``. ``learning_rate`` > 0 overrides the servers'
    rate for these pushes. Use beside a torch optimizer for local parameters, if any::

        loss.backward()
        ps_opt.step()          # pushes; the rows are updated on the servers
        ps_opt.zero_grad()

    ``staleness`` S: at most S steps' pushes are in flight: ``step()`` starts this step's
    pushes once fewer are, and with S = 0 returns once they are acknowledged (the
    unpipelined loop); later pulls wait for the pushes they must see (module docstring). An error of an asynchronous push is raised
    by the next ``step()``, forward of a PS module, or :meth:`flush`. Call
    :meth:`flush` before relying on the updates (e.g. before reporting a task).

    ``step()`` returns the number of gradient rows pushed per table (one per distinct id
    in the "unique" layout, one per id in the "ids" layout; the client sums duplicates).
    """

    def __init__(self, model, client=None, dense=(), learning_rate=0.0, staleness=0):
        self.modules = [m for m in model.modules() if isinstance(m, _PsRows)]
        if not self.modules and not dense:
            raise ValueError("PsOptimizer: the model has no PS modules and no dense binders")
        clients = {id(m.client) for m in self.modules}
        if client is None:
            if len(clients) > 1:
                raise ValueError("PsOptimizer: modules use different clients; pass client=")
            client = self.modules[0].client if self.modules else dense[0].client
        self.client = client
        self.dense = list(dense)
        self.learning_rate = learning_rate
        self.sync = StepSync(client, staleness)
        for m in self.modules:
            m._attach(self.sync)
        for d in self.dense:
            d._attach(self.sync)
        self.pushes = {}  # table -> pushes made (for ReportTask.table_pushes)

    @property
    def staleness(self):
        return self.sync.staleness

    def step(self):
        self.sync.begin_step_push()
        by_table = {}
        for m in self.modules:
            for table, ids, grad in m._take_pending():
                by_table.setdefault(table, []).append((ids, grad))
        batch = {}
        for table, parts in by_table.items():
            if len(parts) == 1:
                batch[table] = parts[0]
            else:
                batch[table] = (np.concatenate([p[0] for p in parts]),
                                np.concatenate([p[1] for p in parts]))
        calls = []
        if batch:
            calls.append(self.sync.call("push_multi", batch, learning_rate=self.learning_rate))
            for table in batch:
                self.pushes[table] = self.pushes.get(table, 0) + 1
        for d in self.dense:
            handle = d._push(self.learning_rate)
            if handle is not None:
                calls.append(handle)
        self.sync.finish_step(calls)
        for d in self.dense:
            d._schedule()
        return {t: len(ids) for t, (ids, _) in batch.items()}

    def flush(self):
        """Waits until every push is acknowledged; raises the first error not raised yet."""
        self.sync.flush()

    def discard(self):
        """After a failed step or task: waits for the pushes in flight, drops their errors,
        prefetched rows and pending gradients; the next forward pulls everything afresh.
        Returns the dropped errors."""
        errors = self.sync.discard()
        for m in self.modules:
            m.clear_pending()
            m.clear_prefetched()
        for d in self.dense:
            d.zero_grad()
            d._forget()
        return errors

    def zero_grad(self):
        """Drops pending sparse gradients not pushed yet and clears dense gradients."""
        for m in self.modules:
            m.clear_pending()
        for d in self.dense:
            d.zero_grad()

    def take_pushes(self):
        """Returns and resets the per-table push counts since the last call."""
        out, self.pushes = self.pushes, {}
        return out

    def close(self):
        """Waits for the calls in flight and stops this optimizer's call threads."""
        self.sync.discard()
        self.sync.close()
