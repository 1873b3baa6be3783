"""Synthetic data generator, per-rank batch layout and the binary loader."""

import json
import os

import numpy as np
import pytest

from data.batching import RankBatchLayout
from data.config import DataConfig, build_loaders, open_dataset
from data.criteo_binary import CriteoBinaryDataset, CriteoBinaryLoader
from data.synthetic_criteo import SyntheticCriteoSpec, generate_synthetic_criteo
from tests.conftest import SMALL_SPEC

SPEC = SyntheticCriteoSpec(num_days=3, rows_per_day=1000, seed=1)


def test_generator_layout_and_metadata(tmp_path):
    out = str(tmp_path / "d")
    metadata = generate_synthetic_criteo(SPEC, out, show_progress=False)
    for day in range(3):
        dense = np.load(os.path.join(out, f"day_{day}_dense.npy"))
        sparse = np.load(os.path.join(out, f"day_{day}_sparse.npy"))
        labels = np.load(os.path.join(out, f"day_{day}_labels.npy"))
        assert dense.dtype == np.float32 and dense.shape == (1000, 13)
        assert sparse.dtype == np.int32 and sparse.shape == (1000, 26)
        assert labels.dtype == np.int32 and labels.shape == (1000, 1)
        assert dense.min() >= np.log(3.0) - 1e-6  # log(x + 3) of counts >= 0
        assert (sparse >= 0).all() and (sparse < np.asarray(SPEC.cardinalities)).all()
        assert set(np.unique(labels)) <= {0, 1}
    on_disk = json.load(open(os.path.join(out, "metadata.json")))
    assert on_disk == metadata
    assert on_disk["num_embeddings_per_feature"] == SPEC.cardinalities
    assert 0.05 < on_disk["positive_rate"] < 0.95
    assert not [f for f in os.listdir(out) if ".tmp" in f]


def test_generator_is_deterministic_and_skips_identical(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    generate_synthetic_criteo(SPEC, a, show_progress=False)
    generate_synthetic_criteo(SPEC, b, show_progress=False)
    for name in os.listdir(a):
        if name.endswith(".npy"):
            assert np.array_equal(np.load(os.path.join(a, name)), np.load(os.path.join(b, name)))
    before = os.stat(os.path.join(a, "day_0_dense.npy")).st_mtime_ns
    generate_synthetic_criteo(SPEC, a, show_progress=False)  # identical spec: nothing rewritten
    assert os.stat(os.path.join(a, "day_0_dense.npy")).st_mtime_ns == before
    other = SyntheticCriteoSpec(num_days=3, rows_per_day=1000, seed=2)
    generate_synthetic_criteo(other, a, show_progress=False)
    assert not np.array_equal(np.load(os.path.join(a, "day_0_sparse.npy")),
                              np.load(os.path.join(b, "day_0_sparse.npy")))


def test_labels_depend_on_features():
    """A logistic fit on the dense features alone already beats chance: the data is learnable."""
    from data.synthetic_criteo import _hidden_model, generate_rows

    rng = np.random.default_rng(0)
    dense, sparse, labels = generate_rows(SPEC, _hidden_model(SPEC), rng, 20000)
    effect = _hidden_model(SPEC).id_effects
    score = sum(effect[f][sparse[:, f]] for f in range(26))
    y = labels[:, 0]
    order = np.argsort(score)
    ranks = np.empty(len(order))
    ranks[order] = np.arange(1, len(order) + 1)
    pos = y.sum()
    auroc = (ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(y) - pos))
    assert auroc > 0.75


@pytest.mark.parametrize("rows, batch, world, drop_last", [
    (1000, 64, 2, False), (1000, 64, 2, True), (1001, 50, 4, False), (7, 2, 2, False), (130, 64, 1, False),
])
def test_layout_covers_rows_once_with_equal_batches(rows, batch, world, drop_last):
    layouts = [RankBatchLayout(rows, batch, r, world, drop_last) for r in range(world)]
    assert len({len(l) for l in layouts}) == 1
    seen = []
    for b in range(len(layouts[0])):
        spans = [l.rows(b) for l in layouts]
        assert len({hi - lo for lo, hi in spans}) == 1 and spans[0][1] > spans[0][0]
        for lo, hi in spans:
            seen.extend(range(lo, hi))
    assert len(seen) == len(set(seen))
    dropped = rows - len(seen)
    if drop_last:
        assert dropped == rows % (batch * world)
    else:
        assert 0 <= dropped < world


def _concat(loader):
    batches = list(loader)
    dense = np.concatenate([b.dense_features.numpy() for b in batches])
    labels = np.concatenate([b.labels.numpy() for b in batches])
    return batches, dense, labels


def test_splits_ranks_and_mmap(synthetic_dir):
    dataset = CriteoBinaryDataset(synthetic_dir)
    n = SMALL_SPEC.rows_per_day
    assert dataset.split_ranges() == {"train": (0, 2 * n), "validation": (2 * n, 2 * n + n // 2),
                                      "test": (2 * n + n // 2, 3 * n)}
    all_dense = np.concatenate([np.load(os.path.join(synthetic_dir, f"day_{d}_dense.npy")) for d in range(3)])
    for mmap in (False, True):
        parts = [_concat(CriteoBinaryLoader(dataset, "validation", 100, r, 2, mmap_mode=mmap)) for r in range(2)]
        (b0, d0, _), (b1, d1, _) = parts
        assert len(b0) == len(b1)
        # rank r holds the r-th half of every global batch of 200 rows
        assert np.array_equal(d0[:100], all_dense[2 * n: 2 * n + 100])
        assert np.array_equal(d1[:100], all_dense[2 * n + 100: 2 * n + 200])
        assert len(d0) + len(d1) == n // 2  # 12288 rows split without remainder
        kjt = b0[0].sparse_features
        assert kjt.keys()[0] == "cat_0" and kjt.values().numel() == 26 * 100


def test_shuffling_is_identical_across_ranks_and_covers_rows(synthetic_dir):
    dataset = CriteoBinaryDataset(synthetic_dir)
    loaders = [CriteoBinaryLoader(dataset, "train", 128, r, 2, row_permutation_seed=3,
                                  shuffle_batches_seed=3) for r in range(2)]
    labels = [np.concatenate([b.labels.numpy() for b in l]) for l in loaders]
    dense = [np.concatenate([b.dense_features.numpy() for b in l]) for l in loaders]
    train_dense = np.concatenate([np.load(os.path.join(synthetic_dir, f"day_{d}_dense.npy")) for d in range(2)])
    together = np.concatenate(dense)
    # every training row exactly once, in an order different from the files'
    assert sorted(map(tuple, together)) == sorted(map(tuple, train_dense))
    assert not np.array_equal(dense[0][:128], train_dense[:128])
    # same permutation on both ranks: a new pair of loaders reproduces both streams
    again = [np.concatenate([b.labels.numpy() for b in CriteoBinaryLoader(
        dataset, "train", 128, r, 2, row_permutation_seed=3, shuffle_batches_seed=3)]) for r in range(2)]
    assert all(np.array_equal(x, y) for x, y in zip(labels, again))
    loaders[0].set_epoch(1)
    assert not np.array_equal(np.concatenate([b.labels.numpy() for b in loaders[0]]), labels[0])


def test_modulo_applied_when_tables_are_smaller(synthetic_dir):
    dataset = CriteoBinaryDataset(synthetic_dir)
    small = [5] * 26
    batch = next(iter(CriteoBinaryLoader(dataset, "test", 64, 0, 1, num_embeddings_per_feature=small)))
    assert int(batch.sparse_features.values().max()) < 5
    raw = np.load(os.path.join(synthetic_dir, "day_2_sparse.npy"))[SMALL_SPEC.rows_per_day // 2:][:64]
    assert np.array_equal(batch.sparse_features.values().numpy(), (raw % 5).T.reshape(-1))


def test_bad_layout_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="needs at least two day files"):
        CriteoBinaryDataset(str(tmp_path))
    generate_synthetic_criteo(SPEC, str(tmp_path / "d"), show_progress=False)
    np.save(str(tmp_path / "d" / "day_1_dense.npy"), np.zeros((1000, 12), np.float32))
    with pytest.raises(ValueError, match=r"day_1_dense.npy: expected float32 of shape \(N, 13\)"):
        CriteoBinaryDataset(str(tmp_path / "d"))


def test_random_loader_is_world_size_independent():
    config = DataConfig(batch_size=8, limit_train_batches=3, seed=4)
    one = build_loaders(config, None, [100] * 26, 0, 1)["train"]
    config.batch_size = 4
    halves = [build_loaders(config, None, [100] * 26, r, 2)["train"] for r in range(2)]
    for whole, a, b in zip(one, *halves):
        assert np.array_equal(whole.dense_features.numpy(),
                              np.concatenate([a.dense_features.numpy(), b.dense_features.numpy()]))
    assert len(one) == 3 and open_dataset(config) is None
