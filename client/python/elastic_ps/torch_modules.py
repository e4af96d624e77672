"""PyTorch modules whose parameters live on the parameter server.

Sparse: :class:`PsEmbeddingBag` and :class:`PsEmbedding` take the same inputs and give the
same outputs as ``torch.nn.EmbeddingBag`` / ``torch.nn.Embedding``, but hold no weight.
A forward pass in training mode

1. de-duplicates the batch's ids (``torch.unique(..., return_inverse=True)``),
2. pulls those rows from the PS (``client.pull``; rows are created on first touch),
3. makes them a leaf tensor that requires grad, and computes the lookup / bag with
   ``torch.nn.functional.embedding`` / ``embedding_bag`` on it (indices = the inverse),
4. remembers ``(ids, leaf)`` as *pending*.

``loss.backward()`` then leaves in ``leaf.grad`` the gradient of every unique row, already
summed over its occurrences in the batch. The pending gradients are pushed by
:class:`PsOptimizer` ``.step()`` (one ``push_multi`` for every PS module of the model), and
the server's optimizer updates the rows. Calling forward more than once before ``step()``
accumulates: every pending pull's gradient is pushed, duplicates summed by the client.

Alternatively ``push_on_backward=True`` pushes each leaf's gradient from a tensor hook as
soon as backward computes it (no ``step()`` needed for that module, one push per forward).

Evaluation: under ``torch.no_grad()`` or after ``module.eval()`` the pull is ``read_only``
(a missing row comes back at its initial value and is not created) and nothing becomes
pending, so nothing is pushed.

Dense: :class:`PsDense` keeps local ``nn.Parameter`` copies of dense tensors stored on the
PS. It pulls them on creation and every ``pull_every`` steps; ``PsOptimizer.step()`` pushes
their gradients (the server's optimizer and learning rate apply). Dense layers may instead
stay local and be trained by any torch optimizer; with several workers only PS-held
parameters are shared, so the example model keeps its MLP on the PS.
"""

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def _ids_numpy(t):
    return t.detach().to("cpu", torch.int64).contiguous().numpy()


class _PsSparse(nn.Module):
    """Shared part of PsEmbedding and PsEmbeddingBag: pull of unique ids, pending grads.

    ``client``: a PsClient (or anything with its pull / push / create_table methods).
    ``create``: create table ``table`` (dim ``dim``) on construction; idempotent for the
    same spec, and ``**spec`` (optimizer, learning_rate, initializer and their parameters,
    e.g. ``initial_accumulator=0.01, stddev=0.01``) goes to ``client.create_table``.
    ``push_on_backward``: push from a tensor hook during backward instead of step().
    Not thread-safe: one module per training thread.
    """

    def __init__(self, client, table, dim, create=True, push_on_backward=False, **spec):
        super().__init__()
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.client = client
        self.table = table
        self.dim = int(dim)
        self.push_on_backward = push_on_backward
        self._pending = []  # (ids int64 ndarray, leaf tensor)
        self.pulled_rows = 0  # unique rows pulled so far (diagnostics)
        if create:
            client.create_table(table, self.dim, **spec)

    def _rows(self, ids):
        """Unique rows of ``ids`` as a tensor (a grad-requiring leaf when training), and the
        inverse index (same shape as ids) into them."""
        uniq, inverse = torch.unique(ids.reshape(-1), sorted=True, return_inverse=True)
        uniq_np = _ids_numpy(uniq)
        training = self.training and torch.is_grad_enabled()
        rows = self.client.pull(self.table, uniq_np, read_only=not training)
        rows = np.asarray(rows, dtype=np.float32).reshape(len(uniq_np), self.dim)
        self.pulled_rows += len(uniq_np)
        leaf = torch.from_numpy(np.array(rows, copy=True))
        if training:
            leaf.requires_grad_(True)
            if self.push_on_backward:
                leaf.register_hook(self._make_hook(uniq_np))
            else:
                self._pending.append((uniq_np, leaf))
        return leaf, inverse.reshape(ids.shape)

    def _make_hook(self, ids):
        def hook(grad):
            self.client.push(self.table, ids, grad.detach().numpy().astype(np.float32))
            return grad

        return hook

    def take_pending(self):
        """Returns and clears [(ids, grad ndarray)] of pending pulls whose grad is set."""
        out = []
        for ids, leaf in self._pending:
            if leaf.grad is not None:
                out.append((ids, leaf.grad.detach().numpy().astype(np.float32, copy=False)))
        self._pending = []
        return out

    def clear_pending(self):
        """Drops pending gradients without pushing them."""
        self._pending = []

    def extra_repr(self):
        return f"table={self.table!r}, dim={self.dim}"


class PsEmbedding(_PsSparse):
    """Like ``torch.nn.Embedding(num_embeddings=any int64, dim)``: ``forward(ids)`` with ids
    of any shape returns ``ids.shape + (dim,)``; rows live in PS table ``table``."""

    def forward(self, ids):
        leaf, inverse = self._rows(ids)
        return F.embedding(inverse, leaf)


class PsEmbeddingBag(_PsSparse):
    """Like ``torch.nn.EmbeddingBag(..., mode)``: ``forward(input, offsets=None,
    per_sample_weights=None)`` with a 2D input (B, N) (bags of fixed size) or a 1D input
    with ``offsets`` returns (B, dim); ``mode`` is "sum", "mean" or "max"."""

    def __init__(self, client, table, dim, mode="sum", **kwargs):
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"mode must be sum, mean or max, got {mode!r}")
        super().__init__(client, table, dim, **kwargs)
        self.mode = mode

    def forward(self, input, offsets=None, per_sample_weights=None):
        leaf, inverse = self._rows(input)
        return F.embedding_bag(inverse, leaf, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights)

    def extra_repr(self):
        return f"table={self.table!r}, dim={self.dim}, mode={self.mode!r}"


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


class PsDense:
    """Binds the parameters of ``module`` to PS dense tensors ``prefix + name``.

    Creates each tensor on the PS (idempotent; initializer from ``initializers[name]`` or
    :func:`default_initializer`), then pulls the PS values into the local parameters.
    ``step()`` (called by :class:`PsOptimizer`) pushes the local gradients in one
    ``push_dense``; every ``pull_every`` steps the parameters are marked stale, and the
    next forward of ``module`` (or of any of its submodules) pulls fresh values first: the
    pull happens as late as possible, so the gradients pushed are computed on the freshest
    values other workers' pushes allow. ``**spec``
    (optimizer, learning_rate, optimizer parameters) goes to ``client.create_dense``.
    Not thread-safe.
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

    def _before_forward(self, module, inputs):
        if self.stale:
            self.pull()

    def parameters(self):
        return list(self.params.values())

    def pull(self):
        """Copies the PS values into the local parameters now."""
        self.stale = False
        values = self.client.pull_dense(list(self.params))
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(torch.from_numpy(np.asarray(values[name], np.float32).reshape(p.shape)))

    def step(self, learning_rate=0.0):
        """Pushes the gradients of the parameters that have one, clears them, and marks the
        parameters stale every ``pull_every`` steps (the next forward pulls)."""
        grads = {}
        for name, p in self.params.items():
            if p.grad is not None:
                grads[name] = p.grad.detach().numpy().astype(np.float32).reshape(-1)
        if grads:
            self.client.push_dense(grads, learning_rate=learning_rate)
        self.zero_grad()
        self.steps += 1
        if self.steps % self.pull_every == 0:
            self.stale = True

    def zero_grad(self):
        for p in self.params.values():
            p.grad = None


class PsOptimizer:
    """The PS side of a training step: ``step()`` pushes every pending sparse gradient of
    the PS embedding modules inside ``model`` (one ``push_multi``) and steps the
    :class:`PsDense` binders in ``dense``. ``learning_rate`` > 0 overrides the servers'
    rate for these pushes. Use beside a torch optimizer for local parameters, if any::

        loss.backward()
        ps_opt.step()          # pushes; the rows are updated on the servers
        ps_opt.zero_grad()

    ``step()`` returns the number of rows pushed per table.
    """

    def __init__(self, model, client=None, dense=(), learning_rate=0.0):
        self.modules = [m for m in model.modules() if isinstance(m, _PsSparse)]
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
        self.pushes = {}  # table -> pushes made (for ReportTask.table_pushes)

    def step(self):
        by_table = {}
        for m in self.modules:
            for ids, grad in m.take_pending():
                by_table.setdefault(m.table, []).append((ids, grad))
        batch = {}
        for table, parts in by_table.items():
            if len(parts) == 1:
                batch[table] = parts[0]
            else:
                batch[table] = (np.concatenate([p[0] for p in parts]),
                                np.concatenate([p[1] for p in parts]))
        if batch:
            self.client.push_multi(batch, learning_rate=self.learning_rate)
            for table in batch:
                self.pushes[table] = self.pushes.get(table, 0) + 1
        for d in self.dense:
            d.step(self.learning_rate)
        return {t: len(ids) for t, (ids, _) in batch.items()}

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
