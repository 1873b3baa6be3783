"""A run that ends diverged (finite but no better than a constant predictor, or a loss
grown 100-fold) exits 4 with one line, unless --allow_divergence; sweeps say "diverged"."""

import pytest

import dlrm_main
from data.synthetic_criteo import SyntheticCriteoSpec, generate_synthetic_criteo
from harness.launch import read_log
from sweeps.results import collect_row, format_markdown
from sweeps.run_state import FAILED, RunRecord
from training.divergence import CONSTANT_AUROC_MARGIN, diverged
from training.failures import EXIT_DIVERGED

GOOD = {"auroc": 0.78, "ne": 0.85, "num_samples": 4096}


def test_a_learning_run_has_not_diverged():
    assert diverged([0.69, 0.6, 0.5, 0.45], ("test", GOOD), labels_carry_signal=True) is None


def test_the_issues_run_diverged_on_both_counts():
    # log loss 1.2e6 over an entropy of 0.57, AUROC 0.5: issue 37's run.
    reason = diverged([0.69, 3.0, 8e5, 1.2e6], ("test", {"auroc": 0.5, "ne": 1.2e6 / 0.57, "num_samples": 663}), True)
    assert reason == (
        "training loss grew from 0.69 (first step) to 5e+05 (mean of the last 4 steps), 100 times or "
        "more; test NE 2.105e+06 >= 10: a log loss 2.11e+06 times that of predicting the click rate "
        "for every row"
    ), reason


@pytest.mark.parametrize(
    "auroc, ne, constant",
    [
        (0.5, 1.0, True),  # a constant at the split's rate: NE exactly 1
        (0.5 + CONSTANT_AUROC_MARGIN, 1.3, True),
        (0.5 + CONSTANT_AUROC_MARGIN + 1e-6, 1.3, False),  # ranks (a little): --calibrate fixes its NE
        (0.5, 0.999, False),  # learned the rate better than... the rate: not constant
        (0.75, 1.05, False),  # a good ranker, miscalibrated
        (float("nan"), float("nan"), False),  # one class only: no verdict
    ],
)
def test_no_better_than_a_constant_predictor_needs_both_figures(auroc, ne, constant):
    reason = diverged([0.69, 0.6], ("validation", {"auroc": auroc, "ne": ne, "num_samples": 1000}), True)
    assert (reason is not None) == constant, reason
    # On fewer rows the AUROC's spread is above the margin: no verdict but an absurd NE.
    assert diverged([0.69, 0.6], ("validation", {"auroc": auroc, "ne": ne, "num_samples": 999}), True) is None
    assert diverged([0.69, 0.6], ("test", {"auroc": auroc, "ne": 10.0, "num_samples": 64}), True) is not None


def test_random_data_is_never_compared_with_a_constant_predictor():
    final = ("test", {"auroc": 0.5, "ne": 1.01, "num_samples": 8192})
    assert diverged([0.69, 0.69], final, labels_carry_signal=False) is None
    # ... but its loss may still grow, and its NE be absurd.
    assert diverged([0.69] + [70.0] * 10, final, False).startswith("training loss grew")
    assert diverged([0.69], ("test", {"auroc": 0.5, "ne": 12.0, "num_samples": 8192}), False).startswith("test NE 12")


def test_loss_growth_is_the_last_steps_mean_against_the_first_step():
    spike = [0.7, 4e4] + [0.6] * 10  # a spike the run recovers from (tests/training/test_recipes_stable_start.py)
    assert diverged(spike, None, True) is None
    assert diverged([0.7] + [69.0] * 10, None, True) is None  # 98.6x
    assert diverged([0.7] + [70.0] * 10, None, True) is not None  # 100x
    assert diverged([], None, True) is None


def test_a_sweep_reports_a_diverged_run_as_diverged(tmp_path):
    records = [
        RunRecord(
            index=i,
            name=f"learning_rate={lr}",
            directory=str(tmp_path / str(i)),
            grid_values={},
            argv=[],
            scheduler="local_cwd",
            ranks=1,
            ranks_per_node=1,
            state=FAILED,
            exit_code=code,
            error=f"dlrm_main.py: error: {text}",
        )
        for i, (lr, code, text) in enumerate(
            [
                (0.5, EXIT_DIVERGED, "the run diverged: ..."),
                (1e30, 3, "training loss is nan at step 1"),
                (0.1, 1, "rank 0 of 1 failed at step 3"),
            ]
        )
    ]
    assert [collect_row(r)["state"] for r in records] == ["diverged", "diverged", "failed"]
    markdown = format_markdown([collect_row(r) for r in records], records)
    assert "- learning_rate=0.5 diverged (exit code 4): dlrm_main.py: error: the run diverged: ...\n" in markdown
    assert "- learning_rate=1e+30 diverged (exit code 3): " in markdown
    assert "- learning_rate=0.1 failed (exit code 1): " in markdown


@pytest.mark.slow
def test_a_run_that_learns_nothing_exits_4_unless_allowed(tmp_path, capsys):
    """Labels independent of the features (--signal_scale 0) and a rate that moves
    nothing: the test split ends at NE > 1 and AUROC ~0.5 -> exit 4, one line, the run
    log's ``diverged`` record; with --allow_divergence exit 0 and a warning line."""
    data = str(tmp_path / "data")
    generate_synthetic_criteo(
        SyntheticCriteoSpec(num_days=2, rows_per_day=4096, seed=0, signal_scale=0.0), data, show_progress=False
    )
    argv = [
        "--in_memory_binary_criteo_path",
        data,
        "--batch_size",
        "256",
        "--learning_rate",
        "1e-9",
        "--num_embeddings",
        "1000",
        "--embedding_dim",
        "16",
        "--dense_arch_layer_sizes",
        "32,16",
        "--over_arch_layer_sizes",
        "32,1",
        "--device",
        "cpu",
        "--limit_train_batches",
        "2",
    ]
    log = str(tmp_path / "log.jsonl")
    assert dlrm_main.main([*argv, "--log_path", log]) == EXIT_DIVERGED
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if "error" in line]
    assert len(lines) == 1 and lines[0].startswith("dlrm_main.py: error: the run diverged: test NE "), err
    assert "no better than predicting the click rate for every row" in lines[0]
    assert "--allow_divergence: exit 0 with a warning" in lines[0]
    records = read_log(log)
    test = [r for r in records if r["event"] == "eval" and r["stage"] == "test"][-1]
    assert test["ne"] >= 1 and test["auroc"] <= 0.5 + CONSTANT_AUROC_MARGIN
    verdict = [r for r in records if r["event"] == "diverged"]
    assert len(verdict) == 1 and verdict[0]["allowed"] is False and "test NE" in verdict[0]["reason"]

    assert dlrm_main.main([*argv, "--allow_divergence"]) == 0
    out, err = capsys.readouterr()
    assert "warning: the run diverged: test NE " in out and "(--allow_divergence)" in out, out
    assert "error" not in err, err
