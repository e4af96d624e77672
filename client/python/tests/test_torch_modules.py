"""PsEmbeddingBag / PsEmbedding / PsDense / PsOptimizer against torch's own modules.

Each test runs against the in-process fake (tests/fake_ps.py) and against a real master
with two pods (marked integration)."""

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

from elastic_ps.torch_modules import (PsDense, PsEmbedding, PsEmbeddingBag,  # noqa: E402
                                      PsOptimizer)
from fake_ps import FakePsClient  # noqa: E402

_names = itertools.count()


@pytest.fixture(params=["fake", pytest.param("cluster", marks=pytest.mark.integration)])
def client(request):
    if request.param == "fake":
        yield FakePsClient()
        return
    from elastic_ps.client import PsClient

    c = PsClient(master=request.getfixturevalue("shared_cluster").master.address,
                 worker_id=7, incarnation=1, deadline_s=10)
    yield c
    c.close()


def _table():
    return f"t{os.getpid()}_{next(_names)}"


def _reference(client, table, ids, dim, mode):
    """A torch.nn.EmbeddingBag whose rows [0, n) hold the PS rows of the unique ids."""
    uniq = np.unique(ids)
    rows = client.pull(table, uniq, read_only=True)
    ref = nn.EmbeddingBag(len(uniq), dim, mode=mode)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(rows))
    compact = torch.from_numpy(np.searchsorted(uniq, ids))
    return ref, uniq, compact


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_matches_torch_and_pushes_its_gradient(client, mode):
    """Forward equals nn.EmbeddingBag's; with server-side SGD lr 1 every row moves by
    exactly -grad (torch's gradient of the reference model), summed over duplicates."""
    dim, table = 4, _table()
    bag = PsEmbeddingBag(client, table, dim, mode=mode, optimizer="sgd", learning_rate=1.0)
    opt = PsOptimizer(bag)
    rng = np.random.default_rng(1)
    ids = rng.choice([3, 5, 1 << 40, -9, 77, 12345678901], size=(6, 5))  # duplicates
    uniq = np.unique(ids)
    before = client.pull(table, uniq)
    ref, _, compact = _reference(client, table, ids, dim, mode)
    weights = torch.from_numpy(rng.standard_normal((6, dim)).astype(np.float32))

    out = bag(torch.from_numpy(ids))
    expect = ref(compact)
    torch.testing.assert_close(out, expect)
    (out * weights).sum().backward()
    (expect * weights).sum().backward()
    pushed = opt.step()
    assert pushed == {table: len(uniq)}
    after = client.pull(table, uniq)
    np.testing.assert_allclose(after - before, -ref.weight.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_offsets_and_per_sample_weights(client):
    dim, table = 3, _table()
    bag = PsEmbeddingBag(client, table, dim, mode="sum", optimizer="sgd", learning_rate=1.0)
    opt = PsOptimizer(bag)
    flat = np.array([10, 11, 10, 12, 13, 11, 10], dtype=np.int64)
    offsets = torch.tensor([0, 2, 2, 5])  # an empty bag too
    psw = torch.tensor([1.0, 2.0, 0.5, -1.0, 3.0, 1.0, 1.0])
    before = client.pull(table, np.unique(flat))
    ref, uniq, compact = _reference(client, table, flat, dim, "sum")
    out = bag(torch.from_numpy(flat), offsets, per_sample_weights=psw)
    expect = ref(compact, offsets, per_sample_weights=psw)
    torch.testing.assert_close(out, expect)
    out.pow(2).sum().backward()
    expect.pow(2).sum().backward()
    opt.step()
    after = client.pull(table, uniq)
    np.testing.assert_allclose(after - before, -ref.weight.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_embedding_and_accumulated_forwards(client):
    """PsEmbedding equals nn.Embedding; two forwards before step() push both gradients."""
    dim, table = 5, _table()
    emb = PsEmbedding(client, table, dim, optimizer="sgd", learning_rate=1.0)
    opt = PsOptimizer(emb)
    a = np.array([[1, 2, 2], [3, 1, 4]])
    b = np.array([2, 9])
    uniq = np.unique(np.concatenate([a.ravel(), b]))
    before = client.pull(table, uniq)
    ref = nn.Embedding(len(uniq), dim)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(before))
    ca, cb = (torch.from_numpy(np.searchsorted(uniq, x)) for x in (a, b))
    out_a, out_b = emb(torch.from_numpy(a)), emb(torch.from_numpy(b))
    torch.testing.assert_close(out_a, ref(ca))
    assert out_a.shape == (2, 3, dim)
    loss = out_a.sum() * 2 + (out_b ** 2).sum()
    loss.backward()
    (ref(ca).sum() * 2 + (ref(cb) ** 2).sum()).backward()
    opt.step()
    after = client.pull(table, uniq)
    np.testing.assert_allclose(after - before, -ref.weight.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_push_on_backward_hook(client):
    dim, table = 2, _table()
    emb = PsEmbeddingBag(client, table, dim, optimizer="sgd", learning_rate=1.0,
                         push_on_backward=True)
    ids = np.array([[4, 4, 6]])
    before = client.pull(table, [4, 6])
    emb(torch.from_numpy(ids)).sum().backward()  # pushed during backward, no step()
    after = client.pull(table, [4, 6])
    np.testing.assert_allclose(after - before, [[-2, -2], [-1, -1]], rtol=1e-6)


def test_no_grad_and_eval_pull_read_only_and_push_nothing(client):
    dim, table = 4, _table()
    bag = PsEmbeddingBag(client, table, dim, optimizer="sgd", learning_rate=1.0)
    opt = PsOptimizer(bag)
    fresh = np.array([[1001, 1002], [1003, 1001]])
    with torch.no_grad():
        out = bag(torch.from_numpy(fresh))
    assert not out.requires_grad
    assert opt.step() == {}
    bag.eval()
    out = bag(torch.from_numpy(fresh))
    assert not out.requires_grad
    assert opt.step() == {}
    # No row was created: the read-only rows are the initial values, never stored.
    rows_now = _stored_rows(client, table)
    assert rows_now == 0
    bag.train()
    bag(torch.from_numpy(fresh)).sum().backward()
    assert opt.step() == {table: 3}
    assert _stored_rows(client, table) == 3


def _stored_rows(client, table):
    if isinstance(client, FakePsClient):
        return len(client.tables[table]["rows"])
    total = 0
    for d in client.describe().values():
        for t in d.tables:
            if t.spec.name == table:
                total += t.rows
    return total


def test_ps_dense_pulls_pushes_and_matches_torch(client):
    """PsDense: local parameters start at the PS values; after step() with server-side
    SGD lr 1 the PS values moved by exactly -grad, and are pulled back."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    prefix = _table() + "/"
    dense = PsDense(client, net, prefix, pull_every=1, optimizer="sgd", learning_rate=1.0)
    names = [prefix + n for n, _ in net.named_parameters()]
    ps = client.pull_dense(names)
    for n, p in zip(names, net.parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), ps[n])
    # Torch-style initial values: uniform +-1/sqrt(fan_in), not all equal.
    w0 = ps[prefix + "0.weight"]
    assert np.abs(w0).max() <= 1 / np.sqrt(3) + 1e-6 and w0.std() > 0.05
    x = torch.randn(8, 3)
    net(x).pow(2).sum().backward()
    grads = {n: p.grad.numpy().copy() for n, p in zip(names, net.parameters())}
    opt = PsOptimizer(nn.Module(), client=client, dense=[dense])
    opt.step()
    after = client.pull_dense(names)
    for n, p in zip(names, net.parameters()):
        np.testing.assert_allclose(after[n], ps[n] - grads[n], rtol=1e-5, atol=1e-6)
        assert p.grad is None
    assert dense.stale
    net(x)  # the next forward pulls first
    assert not dense.stale
    for n, p in zip(names, net.parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), after[n])  # pulled back
        assert p.grad is None


def test_standard_training_loop_learns(client):
    """A logistic model with a PS embedding bag and a local torch layer, trained by a plain
    loop (forward, backward, both optimizers' step), fits a learnable rule."""
    torch.manual_seed(0)
    table = _table()
    bag = PsEmbeddingBag(client, table, 4, mode="mean", optimizer="adagrad",
                         learning_rate=0.3)
    head = nn.Linear(4, 1)
    ps_opt = PsOptimizer(bag)
    local_opt = torch.optim.SGD(head.parameters(), lr=0.3)
    rng = np.random.default_rng(0)
    good = set(range(0, 40, 2))

    def batch(n):
        ids = rng.integers(0, 40, size=(n, 3))
        y = np.array([float(sum(i in good for i in r) >= 2) for r in ids], np.float32)
        return torch.from_numpy(ids), torch.from_numpy(y)

    ids, y = batch(400)
    with torch.no_grad():
        loss0 = float(nn.functional.binary_cross_entropy_with_logits(
            head(bag(ids)).squeeze(1), y))
    for _ in range(200):
        bids, by = batch(64)
        loss = nn.functional.binary_cross_entropy_with_logits(head(bag(bids)).squeeze(1), by)
        loss.backward()
        ps_opt.step()
        local_opt.step()
        ps_opt.zero_grad()
        local_opt.zero_grad()
    with torch.no_grad():
        loss1 = float(nn.functional.binary_cross_entropy_with_logits(
            head(bag(ids)).squeeze(1), y))
    assert loss1 < 0.6 * loss0, (loss0, loss1)


def test_bad_arguments():
    c = FakePsClient()
    with pytest.raises(ValueError):
        PsEmbeddingBag(c, "x", 4, mode="median")
    with pytest.raises(ValueError):
        PsEmbedding(c, "x", 0)
    with pytest.raises(ValueError):
        PsOptimizer(nn.Linear(2, 2))
