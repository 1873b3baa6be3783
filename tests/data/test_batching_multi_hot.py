"""Multi-hot bags: on-the-fly expansion, the MLPerf npz layout, training on both."""

import os

import numpy as np
import pytest

import dlrm_main
from common.errors import BadInput
from data.batching.multi_hot import MultiHotExpander, open_npz_arrays
from data.binary.criteo import CriteoBinaryDataset, CriteoBinaryLoader
from data.binary.criteo_layout import NUM_SPARSE_FEATURES
from data.synthetic_criteo import SyntheticCriteoSpec, generate_multi_hot_criteo
from harness.launch import eval_record, launch, read_log, step_losses

HOTNESS = [1, 2, 3] + [2] * 23
SIZES = [50] * (NUM_SPARSE_FEATURES // 2) + [100000] * (NUM_SPARSE_FEATURES // 2)


@pytest.mark.parametrize("distribution", ["uniform", "pareto"])
def test_expansion_is_a_fixed_function_of_the_id(distribution):
    ids = np.random.default_rng(0).integers(0, 50, size=(200, NUM_SPARSE_FEATURES)).astype(np.int32)
    expand = MultiHotExpander(HOTNESS, SIZES, distribution, seed=3)
    bags = expand(ids)
    assert [b.shape for b in bags] == [(200, k) for k in HOTNESS]
    for f, bag in enumerate(bags):
        assert bag.dtype == np.int32 and np.array_equal(bag[:, 0], ids[:, f])
        assert (bag >= 0).all() and (bag < SIZES[f]).all()
    # the same id gets the same bag in any row, batch or process
    again = MultiHotExpander(HOTNESS, SIZES, distribution, seed=3)(ids[::-1].copy())
    assert all(np.array_equal(a, b[::-1]) for a, b in zip(bags, again))
    other_seed = MultiHotExpander(HOTNESS, SIZES, distribution, seed=4)(ids)
    assert not np.array_equal(bags[2], other_seed[2])


def test_pareto_bags_stay_near_the_id():
    ids = np.zeros((2000, NUM_SPARSE_FEATURES), np.int32)
    uniform = MultiHotExpander([4] * NUM_SPARSE_FEATURES, [100000] * NUM_SPARSE_FEATURES, "uniform", 0)(ids)[0][:, 1:]
    pareto = MultiHotExpander([4] * NUM_SPARSE_FEATURES, [100000] * NUM_SPARSE_FEATURES, "pareto", 0)(ids)[0][:, 1:]
    assert np.median(pareto) < np.median(uniform) / 10


def test_npz_members_memory_mapped_or_loaded(tmp_path):
    arrays = {str(f): np.arange(6 * (f + 1), dtype=np.int32).reshape(6, f + 1) for f in range(3)}
    np.savez(tmp_path / "plain.npz", **arrays)
    np.savez_compressed(tmp_path / "packed.npz", **arrays)
    plain = open_npz_arrays(str(tmp_path / "plain.npz"), ["0", "1", "2"])
    packed = open_npz_arrays(str(tmp_path / "packed.npz"), ["0", "1", "2"])
    assert all(isinstance(a, np.memmap) for a in plain)
    for key, a, b in zip("012", plain, packed):
        assert np.array_equal(a, arrays[key]) and np.array_equal(b, arrays[key])
    with pytest.raises(BadInput, match="no array '3'"):
        open_npz_arrays(str(tmp_path / "plain.npz"), ["3"])


@pytest.fixture(scope="module")
def multi_hot_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("multi_hot"))
    spec = SyntheticCriteoSpec(
        num_days=3,
        rows_per_day=16384,
        seed=4,
        cardinalities=[min(c, 2000) for c in SyntheticCriteoSpec().cardinalities],
    )
    generate_multi_hot_criteo(spec, path, HOTNESS)
    return path


def test_multi_hot_loader_rows_and_kjt(multi_hot_dir):
    dataset = CriteoBinaryDataset(multi_hot_dir, multi_hot=True)
    assert dataset.hotness == HOTNESS
    batch = next(iter(CriteoBinaryLoader(dataset, "validation", 64, 1, 2)))
    kjt = batch.sparse_features
    assert kjt.lengths().tolist() == np.repeat(HOTNESS, 64).tolist()
    bags = np.load(os.path.join(multi_hot_dir, "day_2_sparse_multi_hot.npz"))
    f2 = kjt.to_dict()["cat_2"].values().numpy().reshape(64, 3)
    assert np.array_equal(f2, bags["2"][64:128])  # rank 1 holds rows 64..127 of the split


@pytest.mark.slow
def test_two_ranks_train_on_multi_hot_files(multi_hot_dir, tmp_path):
    log = str(tmp_path / "log.jsonl")
    assert launch(
        dlrm_main.main,
        [
            "--synthetic_multi_hot_criteo_path",
            multi_hot_dir,
            "--batch_size",
            "256",
            "--embedding_dim",
            "16",
            "--dense_arch_layer_sizes",
            "64,16",
            "--over_arch_layer_sizes",
            "64,32,1",
            "--optimizer",
            "adagrad",
            "--learning_rate",
            "0.05",
            "--log_path",
            log,
        ],
    ) == {0: 0, 1: 0}
    assert eval_record(read_log(log), "test")["auroc"] > 0.6


@pytest.mark.slow
def test_on_the_fly_multi_hot_is_deterministic(synthetic_dir, tmp_path):
    logs = [str(tmp_path / f"{i}.jsonl") for i in range(2)]
    for log in logs:
        assert launch(
            dlrm_main.main,
            [
                "--in_memory_binary_criteo_path",
                synthetic_dir,
                "--batch_size",
                "128",
                "--embedding_dim",
                "16",
                "--dense_arch_layer_sizes",
                "64,16",
                "--over_arch_layer_sizes",
                "64,1",
                "--log_every_n_steps",
                "1",
                "--multi_hot_sizes",
                ",".join(map(str, HOTNESS)),
                "--multi_hot_distribution_type",
                "pareto",
                "--limit_train_batches",
                "6",
                "--limit_val_batches",
                "0",
                "--limit_test_batches",
                "1",
                "--learning_rate",
                "0.5",
                "--log_path",
                log,
            ],
        ) == {0: 0, 1: 0}
    first, second = step_losses(read_log(logs[0])), step_losses(read_log(logs[1]))
    assert len(first) == 6 and first == second
