"""python -m training.baseline: a logistic regression on the trainer's data, split and
metrics, whose log has the trainer's records (docs/quality.md)."""

import pytest

import dlrm_main
from harness.launch import eval_record, launch, read_log
from training import baseline

PROG = "python -m training.baseline"
DATA_FLAGS = [
    "--batch_size",
    "256",
    "--limit_train_batches",
    "60",
    "--limit_val_batches",
    "8",
    "--limit_test_batches",
    "8",
    "--seed",
    "3",
]


def test_deep_model_flags_are_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exited:
        baseline.main(["--embedding_dim", "16", "--over_arch_layer_sizes=64,1"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        f"{PROG}: error: --embedding_dim, --over_arch_layer_sizes: flags of the deep model's training, which the "
        "baseline (a logistic regression on one CPU process) does not have; it takes the data, table-size and run "
        f"flags ({PROG} --help)\n"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--learning_rat", "0.1"], "unrecognized arguments: --learning_rat 0.1"),  # no prefixes
        (["--learning_rate", "0"], "--learning_rate must be positive, got 0.0"),
        (["--epochs", "0"], "--epochs must be positive, got 0"),
        (
            ["--parquet_path", "p", "--time_column", "t", "--rolling_windows", "3"],
            "--rolling_windows: the baseline trains once on the training split and tests once (run it on each window's "
            "data instead)",
        ),
    ],
)
def test_bad_flags_are_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        baseline.main(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"{PROG}: error: {message}\n"


def test_torchrun_is_refused(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert baseline.main(["--limit_train_batches", "1"]) == 2
    assert capsys.readouterr().err == (
        f"{PROG}: error: WORLD_SIZE is 2: the baseline runs in one process (run it with python, not torchrun)\n"
    )


@pytest.mark.slow
def test_baseline_learns_and_logs_what_the_trainer_logs(synthetic_dir, tmp_path, capsys):
    """On data with signal the baseline beats a constant predictor (AUROC 0.5) by a
    margin; its log's eval and summary records have the trainer's keys, on the same
    validation and test rows (a DLRM run with the same data flags for reference)."""
    log = str(tmp_path / "baseline.jsonl")
    assert (
        baseline.main(
            ["--in_memory_binary_criteo_path", synthetic_dir, *DATA_FLAGS, "--epochs", "2", "--log_path", log]
        )
        == 0
    )
    out = capsys.readouterr().out
    records = read_log(log)
    test = eval_record(records, "test")
    assert test["auroc"] > 0.6, test
    assert 0.5 < test["calibration"] < 2 and test["ne"] < 1, test  # better than predicting the mean
    summary = [r for r in records if r["event"] == "summary"][-1]
    validations = [r for r in records if r["event"] == "eval" and r["stage"] == "validation"]
    assert [r["step"] for r in validations] == [60, 120]  # after each epoch
    best = max(validations, key=lambda r: r["auroc"])
    assert summary["best_step"] == best["step"] == test["step"]  # the best epoch's weights are tested
    assert "done: 120 steps in " in out and f"(the weights of step {best['step']}, the best validation AUROC)" in out

    reference = str(tmp_path / "dlrm.jsonl")
    assert launch(
        dlrm_main.main,
        [
            "--in_memory_binary_criteo_path",
            synthetic_dir,
            *DATA_FLAGS,
            "--limit_train_batches",
            "2",
            "--embedding_dim",
            "8",
            "--dense_arch_layer_sizes",
            "16,8",
            "--over_arch_layer_sizes",
            "16,1",
            "--log_path",
            reference,
            "--allow_divergence",
        ],
        nproc=1,
    ) == {0: 0}
    trained = read_log(reference)
    for stage in ("validation", "test"):
        theirs, ours = eval_record(trained, stage), eval_record(records, stage)
        assert set(ours) == set(theirs), (stage, set(ours) ^ set(theirs))
        assert ours["num_samples"] == theirs["num_samples"] == 8 * 256
        assert ours["positive_rate"] == pytest.approx(theirs["positive_rate"])  # the same rows
    their_summary = [r for r in trained if r["event"] == "summary"][-1]
    assert {"steps", "validation", "test", "best_step", "best_validation"} <= set(summary) & set(their_summary)
