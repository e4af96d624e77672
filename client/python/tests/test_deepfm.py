"""The example DeepFM's input standardization and the baseline's minibatches (examples/)."""

import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

torch = pytest.importorskip("torch")

import baseline as bl  # noqa: E402
import deepfm  # noqa: E402

from elastic_ps import criteo, synth  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return synth.generate(str(tmp_path_factory.mktemp("d")), records=5000, files=2, seed=4,
                          holdout=500)


def test_input_stats_from_the_manifest_equal_the_computed_ones(data):
    files = [(e["path"], e["records"]) for e in data["files"]]
    assert deepfm.input_stats(data) == criteo.dense_stats(files)
    bare = {k: v for k, v in data.items() if k not in ("dense_mean", "dense_std")}
    assert deepfm.input_stats(bare) == criteo.dense_stats(files)
    mean, std = deepfm.input_stats(data)
    assert len(mean) == len(std) == criteo.NUM_DENSE and min(std) > 0
    assert 0.5 < float(np.mean(mean)) < 10  # log counts: the inputs are far from centered


def test_the_model_standardizes_its_dense_inputs(data):
    mean, std = deepfm.input_stats(data)
    torch.manual_seed(0)
    model, _ = deepfm.local_model(100, (mean, std))
    plain, _ = deepfm.local_model(100, ([0.0] * 13, [1.0] * 13))
    plain.load_state_dict({k: v for k, v in model.state_dict().items()
                           if not k.startswith("dense_")}, strict=False)
    b = criteo.read_all(data["files"][0]["path"], 0, 64)
    cat = torch.from_numpy(np.arange(64 * 26).reshape(64, 26) % 100)
    x = torch.from_numpy(b.dense)
    z = (x - torch.tensor(mean, dtype=torch.float32)) / torch.tensor(std, dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(model(x, cat), plain(z, cat))
    # Buffers, not parameters: not trained, not bound to PS dense tensors.
    assert "dense_mean" not in dict(model.named_parameters())
    assert not any(n.startswith("dense_mean") for n, _ in model.dense_net.named_buffers())
    with pytest.raises(ValueError):
        deepfm.DeepFM(torch.nn.EmbeddingBag(10, 1 + deepfm.K), ([0.0] * 13, [0.0] * 13))
    with pytest.raises(ValueError):
        deepfm.DeepFM(torch.nn.EmbeddingBag(10, 1 + deepfm.K), ([0.0] * 12, [1.0] * 12))


def test_the_baseline_trains_the_workers_minibatches(data):
    files = [(e["path"], e["records"]) for e in data["files"]]
    prepared = bl.prepare(files, data["holdout"]["path"], deepfm.input_stats(data))
    per_task, batch = 1000, 256
    got = [dense.numpy() for dense, _, _ in bl.batches(prepared, batch,
                                                        task_records=per_task)]
    want = []
    for path, n in files:  # the master's tasks of each file, as train_worker reads them
        for first in range(0, n, per_task):
            for b in criteo.read_range(path, first, min(n, first + per_task), batch,
                                       balanced=True):
                want.append(b.dense)
    assert [len(g) for g in got] == [len(w) for w in want] == [250] * 20
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_the_ps_model_over_its_collection_is_the_model_over_a_bag(data):
    """deepfm.ps_model (a PsEmbeddingBagCollection, "ids" layout) computes what the same
    DeepFM over a PsEmbeddingBag of the same table computes, prefetched or not."""
    from fake_ps import FakePsClient

    from elastic_ps.torch_modules import PsEmbeddingBag

    client = FakePsClient()
    stats = deepfm.input_stats(data)
    model, opt = deepfm.ps_model(client, stats, staleness=1)
    other = deepfm.DeepFM(PsEmbeddingBag(client, deepfm.TABLE, 1 + deepfm.K, create=False),
                          stats)
    other.dense_net.load_state_dict(model.dense_net.state_dict())
    b = criteo.read_all(data["files"][0]["path"], 0, 64)
    dense, cat, _ = deepfm.to_tensors(b)
    model.prefetch(cat)
    with torch.no_grad():
        expect = other(dense, cat)
    got = model(dense, cat)  # training mode: the prefetched rows
    torch.testing.assert_close(got.detach(), expect, rtol=0, atol=0)
    got.sum().backward()
    assert opt.step() == {deepfm.TABLE: 64 * criteo.NUM_CAT}  # one row per id
    opt.flush()
