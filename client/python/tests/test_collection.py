"""PsEmbeddingBagCollection and KeyedJagged: the collection equals separate
PsEmbeddingBags and torch's nn.EmbeddingBag numerically, and pulls and pushes every table
in one call. Against the in-process fake and a real master with two pods."""

import itertools
import os
import sys

import numpy as np
import pytest
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from elastic_ps.torch_modules import (KeyedJagged, PsEmbeddingBag,  # noqa: E402
                                      PsEmbeddingBagCollection, PsEmbeddingBagConfig,
                                      PsOptimizer)
from fake_ps import FakePsClient  # noqa: E402

_names = itertools.count()


class Counting:
    """Wraps a client; counts pull_multi / push_multi calls and the tables in each. It
    hides the client's asynchronous forms, so every call comes through these."""

    def __init__(self, client):
        self.client = client
        self.calls = []  # (method, sorted tables)

    def __getattr__(self, name):
        if name.endswith("_async"):
            raise AttributeError(name)
        return getattr(self.client, name)

    def pull_multi(self, requests, read_only=False):
        self.calls.append(("pull_multi", sorted(requests)))
        return self.client.pull_multi(requests, read_only=read_only)

    def push_multi(self, requests, learning_rate=0.0):
        self.calls.append(("push_multi", sorted(requests)))
        return self.client.push_multi(requests, learning_rate=learning_rate)


@pytest.fixture(params=["fake", pytest.param("cluster", marks=pytest.mark.integration)])
def client(request):
    if request.param == "fake":
        yield FakePsClient()
        return
    from elastic_ps.client import PsClient

    c = PsClient(master=request.getfixturevalue("shared_cluster").master.address,
                 deadline_s=10)
    yield c
    c.close()


def _tables():
    p = f"c{os.getpid()}_{next(_names)}"
    return f"{p}.u", f"{p}.v"


def _input(rng, b=6):
    """Feature "one": one id per bag; "bag": 1-D ids with offsets (an empty bag too);
    "pair": two ids per bag, in table v."""
    lens = np.array([2, 0, 3, 1, 1, 2])[:b]
    offsets = np.concatenate([[0], np.cumsum(lens)[:-1]])
    return KeyedJagged.from_offsets({
        "one": (torch.from_numpy(rng.choice([1, 2, 3, 1 << 40], b)), None),
        "bag": (torch.from_numpy(rng.choice([2, 3, 5, 8], int(lens.sum()))),
                torch.from_numpy(offsets)),
        "pair": (torch.from_numpy(rng.choice([7, 9, -4], 2 * b)), torch.arange(0, 2 * b, 2)),
    })


def _collection(client, u, v, create=True):
    return PsEmbeddingBagCollection(client, [
        PsEmbeddingBagConfig(u, 4, "sum", ["one", "bag"], create=create, optimizer="sgd",
                             learning_rate=1.0),
        PsEmbeddingBagConfig(v, 3, "mean", ["pair"], create=create, optimizer="sgd",
                             learning_rate=1.0)])


def _reference(client, table, ids, dim, mode, offsets):
    """torch.nn.EmbeddingBag holding the PS rows of ``ids``'s distinct values; the input
    mapped to its rows."""
    uniq = np.unique(ids)
    ref = nn.EmbeddingBag(len(uniq), dim, mode=mode)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(client.pull(table, uniq, read_only=True)))
    idx = torch.from_numpy(np.searchsorted(uniq, ids))
    return ref, uniq, (idx.view(-1, 1) if offsets is None else idx)


def test_collection_equals_torch_and_pushes_each_table_once_per_step(client):
    u, v = _tables()
    counting = Counting(client)
    ebc = _collection(counting, u, v)
    opt = PsOptimizer(ebc)
    rng = np.random.default_rng(5)
    kj = _input(rng)
    refs = {}
    for f, table, dim, mode in [("one", u, 4, "sum"), ("bag", u, 4, "sum"),
                                ("pair", v, 3, "mean")]:
        ids, offsets = kj[f]
        refs[f] = (table,) + _reference(client, table, ids.numpy(), dim, mode, offsets) + (
            offsets,)
    before = {t: client.pull(t, np.array([1, 2, 3, 5, 8, 1 << 40, 7, 9, -4]), read_only=True)
              for t in (u, v)}
    counting.calls.clear()
    out = ebc(kj)
    assert sorted(out) == ["bag", "one", "pair"]
    loss = 0
    ref_loss = 0
    w = {f: torch.from_numpy(rng.standard_normal(o.shape).astype(np.float32))
         for f, o in out.items()}
    for f, (table, ref, uniq, idx, offsets) in refs.items():
        expect = ref(idx, offsets)
        torch.testing.assert_close(out[f], expect)
        loss = loss + (out[f] * w[f]).sum()
        ref_loss = ref_loss + (expect * w[f]).sum()
    loss.backward()
    ref_loss.backward()
    opt.step()
    assert counting.calls == [("pull_multi", sorted([u, v])), ("push_multi", sorted([u, v]))]
    # SGD, learning rate 1: each row moved by -(its gradient summed over the features).
    moved = {t: {} for t in (u, v)}
    for f, (table, ref, uniq, idx, offsets) in refs.items():
        for i, g in zip(uniq.tolist(), ref.weight.grad.numpy()):
            moved[table][i] = moved[table].get(i, 0) - g
    for t, rows in moved.items():
        ids = np.array(sorted(rows))
        after = client.pull(t, ids, read_only=True)
        base = before[t][[list(np.array([1, 2, 3, 5, 8, 1 << 40, 7, 9, -4])).index(i)
                          for i in ids]]
        np.testing.assert_allclose(after - base, np.stack([rows[i] for i in ids.tolist()]),
                                   rtol=1e-5, atol=1e-6)


def test_collection_equals_separate_bags():
    """The same data through one collection and through one PsEmbeddingBag per feature,
    on two identical fakes: the same outputs at every step and the same rows after."""
    c1, c2 = FakePsClient(), FakePsClient()
    u, v = _tables()
    ebc = _collection(c1, u, v)
    bags = {"one": PsEmbeddingBag(c2, u, 4, "sum", optimizer="sgd", learning_rate=1.0),
            "bag": PsEmbeddingBag(c2, u, 4, "sum", create=False),
            "pair": PsEmbeddingBag(c2, v, 3, "mean", optimizer="sgd", learning_rate=1.0)}
    opt1 = PsOptimizer(ebc)
    holder = nn.ModuleDict(bags)
    opt2 = PsOptimizer(holder)
    rng = np.random.default_rng(9)
    for _ in range(5):
        kj = _input(rng)
        out1 = ebc(kj)
        out2 = {f: bags[f](*kj[f]) if kj[f][1] is not None
                else bags[f](kj[f][0].view(-1, 1)) for f in bags}
        for f in bags:
            torch.testing.assert_close(out1[f], out2[f], rtol=1e-6, atol=1e-7)
        w = {f: torch.from_numpy(rng.standard_normal(o.shape).astype(np.float32))
             for f, o in out1.items()}
        sum((out1[f] * w[f]).sum() for f in out1).backward()
        sum((out2[f] * w[f]).sum() for f in out2).backward()
        opt1.step()
        opt2.step()
    ids = np.array([1, 2, 3, 5, 8, 1 << 40])
    np.testing.assert_allclose(c1.pull(u, ids), c2.pull(u, ids), rtol=1e-5, atol=1e-6)
    ids = np.array([7, 9, -4])
    np.testing.assert_allclose(c1.pull(v, ids), c2.pull(v, ids), rtol=1e-5, atol=1e-6)


def test_layouts_agree():
    """"ids" (a row per id, no torch de-duplication) and "unique" give the same outputs
    and the same updates."""
    results = []
    for layout in ("ids", "unique"):
        c = FakePsClient()
        ebc = PsEmbeddingBagCollection(c, [PsEmbeddingBagConfig(
            "t", 3, "sum", ["x", "y"], layout=layout, optimizer="sgd", learning_rate=0.5)])
        opt = PsOptimizer(ebc)
        kj = KeyedJagged.from_dense({"x": torch.tensor([[4], [4], [6]]),
                                     "y": torch.tensor([[6, 4], [1, 1], [9, 4]])})
        out = ebc(kj)
        (out["x"].pow(2).sum() + out["y"].sum() * 3).backward()
        opt.step()
        results.append(({f: o.detach().numpy() for f, o in out.items()},
                        c.pull("t", [1, 4, 6, 9])))
    for f in results[0][0]:
        np.testing.assert_array_equal(results[0][0][f], results[1][0][f])
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-6)


def test_eval_pulls_read_only_and_ignores_prefetched_rows():
    c = FakePsClient()
    ebc = PsEmbeddingBagCollection(c, [PsEmbeddingBagConfig("t", 2, optimizer="sgd")])
    opt = PsOptimizer(ebc, staleness=1)
    kj = KeyedJagged.from_dense({"t": torch.tensor([[11], [12]])})
    ebc.prefetch(kj)
    with torch.no_grad():
        out = ebc(KeyedJagged.from_dense({"t": torch.tensor([[13]])}))
    assert not out["t"].requires_grad
    assert c.pulls[-1][2] is True  # read_only
    ebc(kj)["t"].sum().backward()  # training: the prefetched rows
    assert opt.step() == {"t": 2}
    assert sorted(c.tables["t"]["rows"]) == [11, 12]


def test_keyed_jagged_forms_agree_and_check_their_input():
    values = torch.tensor([1, 2, 3, 4, 5, 6, 7])
    lengths = torch.tensor([2, 0, 1, 1, 3])  # key a: bags 2, 0, 1; key b: bags 1, 3 (B=...)
    with pytest.raises(ValueError, match="lengths for 2 keys"):
        KeyedJagged(["a", "b"], values, lengths)
    kj = KeyedJagged(["a", "b"], values, torch.tensor([2, 0, 1, 1, 0, 3]))
    ids, offsets = kj["a"]
    assert ids.tolist() == [1, 2, 3] and offsets.tolist() == [0, 2, 2]
    ids, offsets = kj["b"]
    assert ids.tolist() == [4, 5, 6, 7] and offsets.tolist() == [0, 1, 1]
    same = KeyedJagged.from_offsets({"a": ([1, 2, 3], [0, 2, 2]), "b": ([4, 5, 6, 7],
                                                                        [0, 1, 1])})
    assert kj.same_ids(same) and not kj.same_ids(KeyedJagged.from_offsets(
        {"a": ([1, 2, 3], [0, 1, 2]), "b": ([4, 5, 6, 7], [0, 1, 1])}))
    dense = KeyedJagged.from_dense({"a": torch.tensor([[1, 2], [3, 4]])})
    assert dense["a"][1].tolist() == [0, 2] and dense.num_bags("a") == 2
    assert KeyedJagged.from_dense({"a": torch.tensor([[1], [3]])})["a"][1] is None
    with pytest.raises(ValueError, match="sum to"):
        KeyedJagged(["a"], values, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="integers"):
        KeyedJagged.from_offsets({"a": (torch.tensor([1.5]), None)})
    with pytest.raises(ValueError, match="offsets"):
        KeyedJagged.from_offsets({"a": ([1, 2], [1, 2])})
    with pytest.raises(ValueError, match="shape"):
        KeyedJagged.from_dense({"a": torch.tensor([1, 2])})


def test_bad_configs_and_inputs():
    c = FakePsClient()
    with pytest.raises(ValueError):
        PsEmbeddingBagConfig("t", 0)
    with pytest.raises(ValueError):
        PsEmbeddingBagConfig("t", 2, mode="median")
    with pytest.raises(ValueError):
        PsEmbeddingBagConfig("t", 2, layout="sorted")
    with pytest.raises(ValueError, match="unique"):
        PsEmbeddingBagCollection(c, [PsEmbeddingBagConfig("t", 2, feature_names=["f"]),
                                     PsEmbeddingBagConfig("u", 2, feature_names=["f"])])
    ebc = PsEmbeddingBagCollection(c, [PsEmbeddingBagConfig("t", 2, "mean",
                                                            optimizer="sgd")])
    with pytest.raises(ValueError, match="no feature 't'"):
        ebc(KeyedJagged.from_dense({"x": torch.tensor([[1]])}))
    weighted = KeyedJagged.from_offsets({"t": (torch.tensor([1, 2]), None)},
                                        weights={"t": torch.tensor([1.0, 2.0])})
    with pytest.raises(ValueError, match="weights need 'sum'"):
        ebc(weighted)
