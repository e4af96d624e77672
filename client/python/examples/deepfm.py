"""DeepFM (Guo et al. 2017) for Criteo-format data, with its embeddings on the PS or local.

Inputs come from elastic_ps.criteo batches: ``dense`` (B, 13) float32 and ``cat`` (B, 26)
int64 ids whose field is encoded in the id (``id = field << 33 | value``). Because fields
never collide, **one** table holds every field's rows; each row has ``1 + k`` floats:
column 0 is the feature's first-order (linear) weight, columns 1..k its factor vector.
One table means one pull and one push per step for all 26 fields.

    x     = (dense - mean) / std                        (fixed input standardization)
    logit = sum_f w_f                                   (first order)
          + 1/2 (|sum_f v_f|^2 - sum_f |v_f|^2)          (FM, pairwise interactions)
          + MLP([v_1 .. v_26, x])                        (deep part)
          + <a, x>                                       (linear in the dense features)

The standardization (``mean``, ``std``: :func:`input_stats`, per feature over a fixed
sample of the training files, identical for every worker and the baseline) is part of
the model, not trained. Without it the 13 log-count inputs average about 3.5, so the
linear term and the first MLP layer move the logit of every example together by a large
step per update; with gradients computed on parameters a few updates old (asynchronous
workers) those steps overshoot and the AUC after one epoch dropped by 0.03-0.06 at a
staleness of 2-3 updates (examples/async_sim.py; docs/training.md).

The embedding is either a ``PsEmbeddingBagCollection`` with one table serving one
feature, ``"cat"``: the B x 26 ids as B·26 bags of one id (:func:`features`), rows on the
PS; or any module mapping a (N, 1) id tensor to (N, 1 + k), e.g. ``torch.nn.EmbeddingBag``
(the single-process baseline, over compact indices) or ``PsEmbeddingBag``. The dense part
(``model.dense_net``: MLP and linear term) is a plain torch module; a PS worker binds it
to PS dense tensors with ``elastic_ps.torch_modules.PsDense``.

Why one table and one feature rather than a table per field (or per field group): the
field is part of the id, so the 26 fields never collide in one table; one feature makes
one pull, one push and one output tensor per step, and its bags of one id use the "ids"
layout, where the pulled rows are the embedding output itself (no de-duplication in
torch, no gather, no scatter-add in backward; measured 1.6 ms of a ~9 ms step on this
model). 26 features would cost 26 pooling calls and a stack per step, for nothing the
servers could use: they route every id by its hash whatever its table.

Optimizer, on both sides: Adagrad with the same learning rates and initial accumulator
(server-side for PS parameters, ``torch.optim.Adagrad`` in the baseline).
"""

import torch
from torch import nn

from elastic_ps import criteo
from elastic_ps.keyed_jagged import KeyedJagged

# Hyperparameters shared by the PS workers and the baseline (so their AUCs compare).
K = 8
HIDDEN = (64, 32)
BATCH = 256
SPARSE_LR = 0.4
DENSE_LR = 0.1
INITIAL_ACCUMULATOR = 0.1
EMB_STDDEV = 0.01
TABLE = "deepfm.emb"
FEATURE = "cat"
DENSE_PREFIX = "deepfm.dense/"


def input_stats(manifest):
    """(mean, std) of the dense features for a manifest dict of elastic_ps.synth (or any
    dict with ``files``): its ``dense_mean`` / ``dense_std`` when present, else
    ``criteo.dense_stats`` of its training files (the same numbers)."""
    if manifest.get("dense_mean") and manifest.get("dense_std"):
        return list(manifest["dense_mean"]), list(manifest["dense_std"])
    return criteo.dense_stats([(e["path"], e["records"]) for e in manifest["files"]])


class DeepFM(nn.Module):
    """``stats``: (mean, std) of the 13 dense features (:func:`input_stats`); kept as
    buffers, not parameters, so they are neither trained nor bound to the PS."""

    def __init__(self, embedding, stats, k=K, hidden=HIDDEN):
        super().__init__()
        self.k = k
        self.embedding = embedding
        self._keyed = hasattr(embedding, "feature_names")  # a collection: KeyedJagged in
        mean, std = stats
        self.register_buffer("dense_mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("dense_std", torch.tensor(std, dtype=torch.float32))
        if self.dense_mean.shape != (criteo.NUM_DENSE,) or self.dense_std.shape != (
                criteo.NUM_DENSE,) or not bool((self.dense_std > 0).all()):
            raise ValueError(f"stats must be {criteo.NUM_DENSE} means and {criteo.NUM_DENSE} "
                             f"positive standard deviations, got {stats}")
        layers = []
        width = criteo.NUM_CAT * k + criteo.NUM_DENSE
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.dense_net = nn.ModuleDict({
            "mlp": nn.Sequential(*layers),
            "linear": nn.Linear(criteo.NUM_DENSE, 1),
        })

    def prefetch(self, cat):
        """Starts the pull of the rows of a later forward's ``cat`` (PS embeddings)."""
        self.embedding.prefetch(features(cat) if self._keyed else cat.reshape(-1, 1))

    def forward(self, dense, cat):
        """Logits (B,) for dense (B, 13) float32 and cat (B, 26) int64."""
        b, f = cat.shape
        dense = (dense - self.dense_mean) / self.dense_std
        if self._keyed:
            e = self.embedding(features(cat))[FEATURE]
        else:
            e = self.embedding(cat.reshape(-1, 1))
        e = e.view(b, f, 1 + self.k)
        w, v = e[..., 0], e[..., 1:]
        first = w.sum(1)
        s = v.sum(1)
        fm = 0.5 * ((s * s).sum(1) - (v * v).sum((1, 2)))
        deep = self.dense_net["mlp"](torch.cat([v.reshape(b, -1), dense], 1)).squeeze(1)
        return first + fm + deep + self.dense_net["linear"](dense).squeeze(1)


def features(cat):
    """The KeyedJagged of a (B, 26) id tensor: feature "cat", B·26 bags of one id."""
    return KeyedJagged.from_dense({FEATURE: cat.reshape(-1, 1)})


def ps_model(client, stats, pull_every=1, create=True, init_seed=0, staleness=0,
             admit_after=0):
    """A DeepFM whose embedding rows and dense parameters live on the PS; ``stats`` as
    for :class:`DeepFM`. Returns (model, PsOptimizer). Creating the table and tensors is
    idempotent (for the same ``init_seed``: the seed of the PS initializers, the PS's
    counterpart of the baseline's torch seed; every worker of a job must pass the same).
    ``pull_every``: refresh the dense parameters every this many steps; ``staleness``:
    the optimizer's S (elastic_ps.torch_modules); ``admit_after``: the table's admission
    count (a row is created at its id's N-th push; 0 or 1: at once)."""
    from elastic_ps.torch_modules import (PsDense, PsEmbeddingBagCollection,
                                          PsEmbeddingBagConfig, PsOptimizer)

    seed = {"seed": int(init_seed)} if init_seed else {}
    lifecycle = {"admit_after": int(admit_after)} if admit_after > 1 else {}
    emb = PsEmbeddingBagCollection(client, [PsEmbeddingBagConfig(
        TABLE, 1 + K, mode="sum", feature_names=[FEATURE], create=create,
        optimizer="adagrad", learning_rate=SPARSE_LR, initial_accumulator=INITIAL_ACCUMULATOR,
        initializer="normal", stddev=EMB_STDDEV, **seed, **lifecycle)])
    model = DeepFM(emb, stats)
    dense = PsDense(client, model.dense_net, DENSE_PREFIX, pull_every=pull_every,
                    create=create, optimizer="adagrad", learning_rate=DENSE_LR,
                    initial_accumulator=INITIAL_ACCUMULATOR, **seed)
    return model, PsOptimizer(model, dense=[dense], staleness=staleness)


def local_model(num_rows, stats, seed=0):
    """The baseline: the same DeepFM over ``torch.nn.EmbeddingBag(num_rows, 1 + K)`` (ids
    must be compact indices), with its torch Adagrad optimizers (sparse rows, dense)."""
    torch.manual_seed(seed)
    emb = nn.EmbeddingBag(num_rows, 1 + K, mode="sum", sparse=True)
    nn.init.normal_(emb.weight, std=EMB_STDDEV)
    model = DeepFM(emb, stats)
    opts = [
        torch.optim.Adagrad(emb.parameters(), lr=SPARSE_LR,
                            initial_accumulator_value=INITIAL_ACCUMULATOR, eps=1e-10),
        torch.optim.Adagrad(model.dense_net.parameters(), lr=DENSE_LR,
                            initial_accumulator_value=INITIAL_ACCUMULATOR, eps=1e-10),
    ]
    return model, opts


def loss_fn(logits, labels):
    return nn.functional.binary_cross_entropy_with_logits(logits, labels)


def to_tensors(batch):
    return (torch.from_numpy(batch.dense), torch.from_numpy(batch.cat),
            torch.from_numpy(batch.labels))
