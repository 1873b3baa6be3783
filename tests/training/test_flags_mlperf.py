"""The MLPerf DLRM-DCNv2 reference's flags: --validation_auroc, --evaluate_on_epoch_end,
--evaluate_on_training_end, --print_progress, --collect_multi_hot_freqs_stats."""

import os

import numpy as np
import pytest

import dlrm_main
from data.binary.criteo_layout import NUM_SPARSE_FEATURES
from harness.launch import launch, read_log

BATCH = 256
SMALL = [
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
    "--batch_size",
    str(BATCH),
    "--seed",
    "3",
    "--log_every_n_steps",
    "5",
]


def run(data_dir: str, log: str, *extra: str, nproc: int = 1) -> list:
    assert launch(
        dlrm_main.main, ["--in_memory_binary_criteo_path", data_dir, *SMALL, "--log_path", log, *extra], nproc=nproc
    ) == {r: 0 for r in range(nproc)}
    return read_log(log)


def evals(records: list, stage: str) -> list:
    return [(r["step"], r["auroc"]) for r in records if r["event"] == "eval" and r["stage"] == stage]


def summary(records: list) -> dict:
    return [r for r in records if r["event"] == "summary"][-1]


@pytest.mark.slow
def test_validation_auroc_stops_at_the_first_validation_reaching_it(synthetic_dir, tmp_path):
    common = [
        "--limit_train_batches",
        "20",
        "--limit_val_batches",
        "4",
        "--limit_test_batches",
        "2",
        "--validation_freq_within_epoch",
        "4",
    ]
    curve = evals(run(synthetic_dir, str(tmp_path / "curve.jsonl"), *common), "validation")
    # The target: a validation above every earlier one, not the first (so one was below it).
    k = next(i for i in range(2, len(curve)) if curve[i][1] > max(a for _, a in curve[:i]))
    target_step, target = curve[k]
    records = run(synthetic_dir, str(tmp_path / "target.jsonl"), *common, "--validation_auroc", repr(target))
    seen = evals(records, "validation")
    assert seen == curve[: k + 1]  # stopped at the first validation reaching the target
    assert seen[-1][1] >= target > seen[-2][1]
    s = summary(records)
    assert s["steps"] == target_step and s["target_reached"] is True
    assert s["records_to_target"] == target_step * BATCH
    assert s["time_to_target_s"] > 0
    assert evals(records, "test")  # the test split still runs at the end
    unreached = summary(
        run(
            synthetic_dir,
            str(tmp_path / "unreached.jsonl"),
            "--limit_train_batches",
            "10",
            "--limit_val_batches",
            "2",
            "--limit_test_batches",
            "1",
            "--validation_auroc",
            "1.0",
        )
    )
    assert (
        unreached["steps"],
        unreached["target_reached"],
        unreached["time_to_target_s"],
        unreached["records_to_target"],
    ) == (10, False, None, None)


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags, validation_steps, tested",
    [
        (["--evaluate_on_epoch_end"], [3, 6], False),  # the reference's schedule: no test unless asked
        (["--evaluate_on_training_end"], [], True),
        (["--evaluate_on_epoch_end", "--evaluate_on_training_end"], [3, 6], True),
    ],
)
def test_evaluation_schedule(synthetic_dir, tmp_path, flags, validation_steps, tested):
    """Without either flag ours validates at every epoch end and tests (tests/training/test_trainer.py)."""
    records = run(
        synthetic_dir,
        str(tmp_path / "log.jsonl"),
        "--epochs",
        "2",
        "--limit_train_batches",
        "3",
        "--limit_val_batches",
        "1",
        "--limit_test_batches",
        "1",
        *flags,
    )
    assert [s for s, _ in evals(records, "validation")] == validation_steps
    assert bool(evals(records, "test")) is tested


@pytest.mark.slow
def test_print_progress_and_id_frequencies(synthetic_dir, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)  # the frequency files go to the current directory, as in the reference
    hotness = [1, 3] + [2] * 24
    common = [
        "--limit_train_batches",
        "4",
        "--limit_val_batches",
        "1",
        "--limit_test_batches",
        "1",
        "--multi_hot_sizes",
        ",".join(map(str, hotness)),
    ]
    run(synthetic_dir, str(tmp_path / "quiet.jsonl"), *common)
    assert "epoch 0:" not in capfd.readouterr().err  # stderr is not a terminal here: no bar by default
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".npz")]
    run(
        synthetic_dir,
        str(tmp_path / "log.jsonl"),
        *common,
        "--print_progress",
        "--collect_multi_hot_freqs_stats",
        nproc=2,
    )
    assert "epoch 0:" in capfd.readouterr().err  # the tqdm bar
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith(".npz")) == [
        "multi_hot_freqs_rank_0.npz",
        "multi_hot_freqs_rank_1.npz",
    ]
    sizes = [1000, 500] + [None] * 24
    one_hot = np.load(os.path.join(synthetic_dir, "day_0_sparse.npy"))[: 4 * BATCH * 2]  # the rows both ranks trained
    totals = {}
    for rank in range(2):
        with np.load(tmp_path / f"multi_hot_freqs_rank_{rank}.npz") as counts:
            assert len(counts.files) == 2 * NUM_SPARSE_FEATURES
            for key in ("t_cat_0", "t_cat_0.first", "t_cat_1", "t_cat_1.first"):
                totals[key] = totals.get(key, 0) + counts[key]
    for f, table in enumerate(("t_cat_0", "t_cat_1")):
        expected_first = np.bincount(one_hot[:, f] % sizes[f], minlength=sizes[f])
        np.testing.assert_array_equal(totals[f"{table}.first"], expected_first)  # the one-hot ids
        assert totals[table].sum() == len(one_hot) * hotness[f]  # every id of every bag
    np.testing.assert_array_equal(totals["t_cat_0"], totals["t_cat_0.first"])  # hotness 1: the same ids
