"""Early stopping and the best model on real 2-rank runs: the stop, the test on the
best weights (checkpointed or kept in memory), pruning, export, resume, bad flags."""

import json
import os
import shutil

import pytest

import dlrm_main
from harness.launch import eval_metrics, eval_record, launch, read_log, run_script
from serving import export
from serving.model_inputs import read_inputs
from training import report
from training.config import EarlyStoppingConfig
from training.early_stopping import EarlyStopping

METRICS = ("auroc", "log_loss", "accuracy", "ne", "calibration", "positive_rate", "num_samples")
STEPS_PER_EPOCH = 4
PATIENCE = 2


def _overfitting_run(data_dir: str, epochs: int) -> list:
    """4 training batches a epoch at a high rate, seed 1: the run overfits."""
    return [
        "--in_memory_binary_criteo_path",
        data_dir,
        "--embedding_dim",
        "16",
        "--dense_arch_layer_sizes",
        "64,16",
        "--over_arch_layer_sizes",
        "64,32,1",
        "--optimizer",
        "adagrad",
        "--learning_rate",
        "0.1",
        "--batch_size",
        "128",
        "--limit_train_batches",
        str(STEPS_PER_EPOCH),
        "--limit_val_batches",
        "4",
        "--limit_test_batches",
        "2",
        "--epochs",
        str(epochs),
        "--log_every_n_steps",
        "4",
        "--seed",
        "1",
    ]


def flags(data_dir: str, log: str, *extra: str) -> list:
    """A run that overfits 4 training batches: validation log loss is lowest after a few
    epochs (its AUROC creeps up by 1e-4 for long after)."""
    return [
        *_overfitting_run(data_dir, 12),
        "--early_stopping_patience",
        str(PATIENCE),
        "--early_stopping_metric",
        "log_loss",
        "--log_path",
        log,
        *extra,
    ]


def summary(log: str) -> dict:
    return [r for r in read_log(log) if r["event"] == "summary"][-1]


def validations(log: str) -> list:
    return [(r["step"], r["log_loss"]) for r in read_log(log) if r["event"] == "eval" and r["stage"] == "validation"]


@pytest.fixture(scope="module")
def stopped(synthetic_dir, tmp_path_factory):
    """A 2-rank run with checkpoints at every epoch end, keeping the last 2."""
    root = tmp_path_factory.mktemp("early_stopping")
    ckpt, log = str(root / "ckpt"), str(root / "run.jsonl")
    assert launch(
        dlrm_main.main,
        flags(
            synthetic_dir, log, "--checkpoint_dir", ckpt, "--checkpoint_at_epoch_end", "--keep_last_n_checkpoints", "2"
        ),
    ) == {0: 0, 1: 0}
    return root, ckpt, log


@pytest.mark.slow
def test_stops_after_patience_and_tests_the_best_checkpoint(stopped, synthetic_dir, tmp_path):
    root, ckpt, log = stopped
    seen = validations(log)
    best_step, best_loss = min(seen, key=lambda v: v[1])
    last_step = seen[-1][0]
    # The metric peaked early, then PATIENCE validations without improvement ended the run.
    assert best_step < last_step == best_step + PATIENCE * STEPS_PER_EPOCH < 12 * STEPS_PER_EPOCH
    assert [s for s, _ in seen] == list(range(STEPS_PER_EPOCH, last_step + 1, STEPS_PER_EPOCH))
    record = summary(log)
    assert record["stopped_early"] is True and record["steps"] == last_step
    assert record["best_step"] == best_step and record["best_validation"]["log_loss"] == best_loss
    # The best checkpoint survived pruning (keep 2: the two newest), and best.json names it.
    assert sorted(os.listdir(ckpt)) == ["best.json"] + [
        f"step_{s:09d}" for s in (best_step, last_step - STEPS_PER_EPOCH, last_step)
    ]
    with open(os.path.join(ckpt, "best.json")) as f:
        assert json.load(f) == {
            "checkpoint": f"step_{best_step:09d}",
            "step": best_step,
            "metric": "log_loss",
            "value": best_loss,
        }
    # The test figures are those of the best step's checkpoint, evaluated on its own:
    # --mode test with the checkpoint directory takes the checkpoint marked best.
    test = eval_record(read_log(log), "test")
    assert test["step"] == best_step
    # The final weights are tested first, then the best, which export takes.
    assert [(r["model"], r["step"], r["exported"]) for r in _test_records(log)] == [
        ("final", last_step, False),
        ("best", best_step, True),
    ]
    evaluated = str(tmp_path / "evaluated.jsonl")
    assert launch(
        dlrm_main.main, flags(synthetic_dir, evaluated, "--mode", "test", "--restore_checkpoint_path", ckpt)
    ) == {0: 0, 1: 0}
    assert [eval_record(read_log(evaluated), "test")[k] for k in METRICS] == [test[k] for k in METRICS]
    # serving.export on the directory exports the best checkpoint; --newest the last one.
    assert export.main(["--checkpoint", ckpt, "--output", str(tmp_path / "best"), "--quantize", "none"]) == 0
    assert read_inputs(str(tmp_path / "best")).step == best_step
    assert (
        export.main(["--checkpoint", ckpt, "--output", str(tmp_path / "newest"), "--quantize", "none", "--newest"]) == 0
    )
    assert read_inputs(str(tmp_path / "newest")).step == last_step


@pytest.mark.slow
def test_best_weights_in_memory_without_a_checkpoint_dir(stopped, synthetic_dir, tmp_path):
    """Each rank keeps its own shards of the best step: the test figures are the same."""
    _, _, log = stopped
    memory = str(tmp_path / "memory.jsonl")
    assert launch(dlrm_main.main, flags(synthetic_dir, memory)) == {0: 0, 1: 0}
    expected, got = eval_record(read_log(log), "test"), eval_record(read_log(memory), "test")
    assert [got[k] for k in METRICS + ("step",)] == [expected[k] for k in METRICS + ("step",)]
    # Nothing to export from without a checkpoint directory: no line says export takes it.
    assert [(r["model"], r["exported"]) for r in _test_records(memory)] == [("final", False), ("best", False)]
    assert {k: summary(memory)[k] for k in ("best_step", "best_validation", "stopped_early")} == {
        k: summary(log)[k] for k in ("best_step", "best_validation", "stopped_early")
    }


@pytest.mark.slow
def test_resumed_run_keeps_best_and_patience(stopped, synthetic_dir, tmp_path):
    """Resumed one epoch after the best (one validation without improvement counted),
    the run stops after one more validation, not PATIENCE more, and tests the best step."""
    _, ckpt, log = stopped
    best_step, last_step = summary(log)["best_step"], summary(log)["steps"]
    copy = str(tmp_path / "ckpt")
    shutil.copytree(ckpt, copy)
    shutil.rmtree(os.path.join(copy, f"step_{last_step:09d}"))  # the newest is now best + 1 epoch
    resumed = str(tmp_path / "resumed.jsonl")
    assert launch(
        dlrm_main.main, flags(synthetic_dir, resumed, "--checkpoint_dir", copy, "--checkpoint_at_epoch_end", "--resume")
    ) == {0: 0, 1: 0}
    assert [s for s, _ in validations(resumed)] == [last_step]
    assert {k: summary(resumed)[k] for k in ("steps", "best_step", "best_validation", "stopped_early")} == {
        k: summary(log)[k] for k in ("steps", "best_step", "best_validation", "stopped_early")
    }
    assert eval_metrics(eval_record(read_log(resumed), "test")) == eval_metrics(eval_record(read_log(log), "test"))
    assert best_step == summary(resumed)["best_step"]


@pytest.mark.parametrize(
    "metric, values, stop_after",
    [
        ("auroc", [0.70, 0.71, 0.709, 0.7105], 4),  # 0.7105 does not beat 0.71 by min_delta 0.001
        ("log_loss", [0.50, 0.49, 0.495, 0.48], None),
        ("ne", [0.90, float("nan"), 0.95], 3),  # NaN never improves
    ],
)
def test_improvement_rules(metric, values, stop_after):
    stopping = EarlyStopping(EarlyStoppingConfig(patience=2, metric=metric, min_delta=0.001))
    stops = [stopping.update(step, {metric: v}) is False and stopping.should_stop for step, v in enumerate(values, 1)]
    assert (stops.index(True) + 1 if True in stops else None) == stop_after


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--early_stopping_patience", "-1"], "--early_stopping_patience must not be negative, got -1"),
        (
            ["--early_stopping_patience", "2", "--early_stopping_metric", "accuracy"],
            "argument --early_stopping_metric: invalid choice: 'accuracy' (choose from 'auroc', 'log_loss', 'ne')",
        ),
        (["--early_stopping_metric", "ne"], "--early_stopping_metric needs --early_stopping_patience"),
        (
            ["--early_stopping_patience", "2", "--early_stopping_min_delta", "-0.1"],
            "--early_stopping_min_delta must not be negative, got -0.1",
        ),
        (
            ["--early_stopping_patience", "2", "--limit_val_batches", "0"],
            "--early_stopping_patience watches validation: it cannot be combined with --limit_val_batches 0",
        ),
    ],
)
def test_bad_early_stopping_flags_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        dlrm_main.main(["--num_embeddings", "100", *argv])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == f"dlrm_main.py: error: {message}"


def overfitting_flags(data_dir: str, log: str, *extra: str) -> list:
    """No early stopping: 6 epochs of 4 batches at a high rate overfit, so the best
    validation AUROC (step 8 with seed 1, which best.json marks) is not the final one."""
    return [*_overfitting_run(data_dir, 6), "--log_path", log, *extra]


def _test_records(log: str) -> list:
    return [r for r in read_log(log) if r["event"] == "eval" and r["stage"] == "test"]


@pytest.mark.slow
def test_the_closing_lines_test_the_model_export_takes(synthetic_dir, tmp_path, capsys):
    """Without early stopping a run that validated still keeps its best checkpoint, and
    export takes that one: the run tests its final weights, then the best checkpoint's,
    each line naming its model; `--mode test` on the directory gives the marked figures."""
    ckpt, log = str(tmp_path / "ckpt"), str(tmp_path / "run.jsonl")
    final_step = 6 * STEPS_PER_EPOCH
    proc = run_script(
        ["dlrm_main.py", *overfitting_flags(synthetic_dir, log, "--checkpoint_dir", ckpt)], torchrun_nproc=2
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(ckpt, "best.json")) as f:
        best = json.load(f)["step"]
    assert best < final_step  # the run overfit: the best validation is not the last
    final, marked = _test_records(log)
    assert [(r["model"], r["step"], r["exported"]) for r in (final, marked)] == [
        ("final", final_step, False),
        ("best", best, True),
    ]
    assert final["log_loss"] > marked["log_loss"]  # the overfit weights are the worse model
    lines = proc.stdout.splitlines()
    assert (
        f"test (final, step {final_step}): AUROC {final['auroc']:.4f} | log loss {final['log_loss']:.4f}" in proc.stdout
    )
    assert (
        f"test (best, step {best}, the one export takes): AUROC {marked['auroc']:.4f} | log loss "
        f"{marked['log_loss']:.4f}" in proc.stdout
    )
    (done,) = [line for line in lines if line.startswith("done: ")]
    assert (
        f"| test (best, step {best}, the one export takes) AUROC {marked['auroc']:.4f}, log loss "
        f"{marked['log_loss']:.4f}, NE {marked['ne']:.4f} | test (final, step {final_step}) AUROC "
        f"{final['auroc']:.4f}, log loss {final['log_loss']:.4f}, NE {final['ne']:.4f} | best step {best} "
    ) in done
    record = summary(log)
    assert {k: record["test"][k] for k in METRICS} == {k: marked[k] for k in METRICS}
    assert {k: record["final_test"][k] for k in METRICS} == {k: final[k] for k in METRICS}
    assert record["test_model"] == {"model": "best", "step": best, "exported": True}
    assert (record["export_step"], record["best_step"], record["steps"]) == (best, best, final_step)
    # The references: --mode test on the directory evaluates the checkpoint export takes,
    # and on the final checkpoint the final weights; each gives the run's figures.
    evaluated = run_script(
        [
            "dlrm_main.py",
            *overfitting_flags(
                synthetic_dir, str(tmp_path / "best.jsonl"), "--mode", "test", "--restore_checkpoint_path", ckpt
            ),
        ],
        torchrun_nproc=2,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    (again,) = _test_records(str(tmp_path / "best.jsonl"))
    assert [again[k] for k in METRICS + ("step", "model", "exported")] == [
        marked[k] for k in METRICS + ("step", "model", "exported")
    ]
    assert f"test (best, step {best}, the one export takes): AUROC {marked['auroc']:.4f}" in evaluated.stdout
    last = str(tmp_path / "final.jsonl")
    assert launch(
        dlrm_main.main,
        overfitting_flags(
            synthetic_dir,
            last,
            "--mode",
            "test",
            "--restore_checkpoint_path",
            os.path.join(ckpt, f"step_{final_step:09d}"),
        ),
    ) == {0: 0, 1: 0}
    (again,) = _test_records(last)
    assert [again[k] for k in METRICS + ("step", "model", "exported")] == [final[k] for k in METRICS] + [
        final_step,
        None,
        False,
    ]  # neither best nor what export takes
    # The report names the model of each test figure.
    assert report.main([log, "--output", str(tmp_path / "run.png")]) == 0
    assert (
        f"test AUROC {marked['auroc']:.4f} (best, step {best}, the one export takes); {final['auroc']:.4f} "
        f"(final, step {final_step})"
    ) in capsys.readouterr().out
