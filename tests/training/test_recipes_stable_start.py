"""A stable start: make train's flags keep every early loss near the first one, and the
run report's loss panel is scaled by the bulk of the losses, not by a spike."""

import json
import os
import re
import struct

import pytest

import dlrm_main
from data.synthetic_criteo import SyntheticCriteoSpec, generate_synthetic_criteo
from harness.launch import REPO, launch, read_log, step_losses
from tests.support.doc_commands import without_flags
from training.report import loss_limits, read_runs
from training.report import main as report_main

# The first steps checked, and how far above the first step's loss any of them may go.
EARLY_STEPS = 50
EARLY_LOSS_FACTOR = 3.0


def make_train_flags() -> list:
    """TRAIN_FLAGS of the Makefile (one source: the test follows the Makefile)."""
    with open(os.path.join(REPO, "Makefile")) as f:
        text = f.read().replace("\\\n", " ")
    return re.search(r"^TRAIN_FLAGS \?=(.*)$", text, re.MULTILINE).group(1).split()


@pytest.mark.slow
def test_make_train_flags_start_stably(tmp_path):
    """make train's flags on a small generated data set (make train's generator and
    table sizes, 2 ranks): none of the first 50 losses exceeds 3x the first one. Before
    the dense Adagrad's initial accumulator the second loss was ~4e4."""
    data, log = str(tmp_path / "data"), str(tmp_path / "log.jsonl")
    # Two days of 51,200 rows: day 0 is 50 steps of 2 x 512, day 1 validation and test.
    generate_synthetic_criteo(SyntheticCriteoSpec(num_days=2, rows_per_day=51_200, seed=0), data, show_progress=False)
    flags = without_flags(make_train_flags(), "--log_path", "--log_every_n_steps", "--validation_freq_within_epoch")
    argv = [
        "--in_memory_binary_criteo_path",
        data,
        *flags,
        "--log_path",
        log,
        "--log_every_n_steps",
        "1",
        "--limit_train_batches",
        str(EARLY_STEPS),
        "--limit_val_batches",
        "1",
        "--limit_test_batches",
        "1",
    ]
    assert launch(dlrm_main.main, argv) == {0: 0, 1: 0}
    losses = step_losses(read_log(log))
    assert len(losses) == EARLY_STEPS
    assert max(losses) <= EARLY_LOSS_FACTOR * losses[0], (losses[0], max(losses), losses)
    assert sum(losses[-10:]) / 10 < losses[0]  # and it learns


def _write_log(path: str, losses: list) -> None:
    with open(path, "w") as f:
        for step, loss in enumerate(losses, start=1):
            f.write(
                json.dumps(
                    {
                        "event": "train",
                        "run_id": "r",
                        "time": float(step),
                        "step": step,
                        "loss": loss,
                        "lr": 0.05,
                        "records_per_sec": 1000.0,
                    }
                )
                + "\n"
            )


def test_report_loss_panel_range_is_set_by_the_bulk(tmp_path):
    """One spike of 4e4 among losses falling from 0.70 to 0.55: the loss panel's y-range
    is the bulk's (0.55-0.70, padded by 5%), and the spike is off it."""
    bulk = [0.70 - 0.15 * i / 98 for i in range(99)]
    spiked = [bulk[0], 42355.0, *bulk[1:]]
    log = str(tmp_path / "spike.jsonl")
    _write_log(log, spiked)
    low, high = loss_limits(read_runs(log))
    pad = 0.05 * (max(bulk) - min(bulk))
    assert low == pytest.approx(min(bulk) - pad) and high == pytest.approx(max(bulk) + pad)
    png = str(tmp_path / "spike.png")
    assert report_main([log, "--output", png]) == 0
    with open(png, "rb") as f:
        header = f.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", header[16:24]) == (1200, 800)

    plain = str(tmp_path / "plain.jsonl")  # no outlier: the plot's own range, every point on it
    _write_log(plain, bulk)
    assert loss_limits(read_runs(plain)) is None
