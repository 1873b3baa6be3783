"""--rolling_windows N: train window k, evaluate window k + 1, checkpoint at each window
end, resume at any window with the results of the uninterrupted run; refusals.

The runs read a tiny day-partitioned log of data.synthetic_parquet through the real
Parquet source: --rolling_windows 3 over its 4 days makes each day a window."""

import os
import shutil

import pytest

import dlrm_main
from checkpoints.opened import read_meta
from data.sources import source_for
from data.synthetic_parquet import SyntheticParquetSpec, generate_synthetic_parquet
from harness.launch import launch, read_log
from tests.support.doc_commands import commands_starting, replaced
from training import report
from training.distributed import resolve_env
from training.flags import parse_config, parse_config_and_source
from training.startup_report import StartupReport

WINDOWS = 3
BATCH, EVAL_BATCH, RANKS = 16, 32, 2
ROWS_PER_DAY = 4 * BATCH * RANKS  # a window (a day) is 4 training steps
STEPS_PER_WINDOW = ROWS_PER_DAY // (BATCH * RANKS)
LOG = SyntheticParquetSpec(
    days=WINDOWS + 1, rows_per_day=ROWS_PER_DAY, files_per_day=1, row_group_rows=64, multi_hot_columns=0, seed=3
)


def flags(root, clicks, *extra: str) -> list:
    return [
        "--parquet_path",
        str(clicks),
        "--time_column",
        "date",
        "--dense_columns",
        "I*",
        "--sparse_columns",
        "C*",
        "--rolling_windows",
        str(WINDOWS),
        "--num_embeddings",
        "50",
        "--embedding_dim",
        "8",
        "--dense_arch_layer_sizes",
        "16,8",
        "--over_arch_layer_sizes",
        "16,1",
        "--batch_size",
        str(BATCH),
        "--test_batch_size",
        str(EVAL_BATCH),
        "--optimizer",
        "adagrad",
        "--learning_rate",
        "0.05",
        "--log_every_n_steps",
        "1",
        "--seed",
        "3",
        "--checkpoint_dir",
        str(root / "ckpt"),
        "--checkpoint_every_n_steps",
        "3",
        "--log_path",
        str(root / "log.jsonl"),
        *extra,
    ]


def losses(records) -> dict:
    return {r["step"]: r["loss"] for r in records if r["event"] == "train"}


def window_metrics(records) -> dict:
    return {r["window"]: r for r in records if r["event"] == "eval"}


@pytest.fixture(scope="module")
def clicks(tmp_path_factory):
    """The log, written in-process (a few milliseconds)."""
    path = tmp_path_factory.mktemp("log") / "clicks"
    generate_synthetic_parquet(LOG, str(path))
    return path


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, clicks):
    root = tmp_path_factory.mktemp("rolling")
    assert launch(dlrm_main.main, flags(root, clicks), nproc=RANKS) == {0: 0, 1: 0}
    return root, read_log(str(root / "log.jsonl"))


@pytest.mark.slow
def test_each_window_is_trained_once_and_evaluated_on_the_next(uninterrupted):
    root, records = uninterrupted
    assert sorted(losses(records)) == list(range(1, WINDOWS * STEPS_PER_WINDOW + 1))
    assert [r["epoch"] for r in records if r["event"] == "train"] == [
        w for w in range(WINDOWS) for _ in range(STEPS_PER_WINDOW)
    ]
    evaluations = [r for r in records if r["event"] == "eval"]
    assert [(r["stage"], r["window"], r["step"]) for r in evaluations] == [
        ("validation", k + 1, (k + 1) * STEPS_PER_WINDOW) for k in range(WINDOWS)
    ]
    for r in evaluations:
        assert r["num_samples"] == ROWS_PER_DAY  # the whole next day
        assert all(isinstance(r[key], float) for key in ("auroc", "log_loss", "ne", "calibration"))
    assert len({r["log_loss"] for r in evaluations}) == WINDOWS  # distinct windows, distinct figures
    summary = [r for r in records if r["event"] == "summary"][-1]
    assert summary["test"] is None
    assert [{k: w[k] for k in ("window", "auroc", "log_loss")} for w in summary["windows"]] == [
        {"window": r["window"], "auroc": r["auroc"], "log_loss": r["log_loss"]} for r in evaluations
    ]
    # Export takes the newest checkpoint (no best across windows): the model the last
    # window evaluated, which the summary and the report say.
    assert [(w["step"], w["exported"]) for w in summary["windows"]] == [
        ((k + 1) * STEPS_PER_WINDOW, k + 1 == WINDOWS) for k in range(WINDOWS)
    ]
    assert summary["export_step"] == WINDOWS * STEPS_PER_WINDOW and summary["test_model"] is None
    (run,) = report.read_runs(str(root / "log.jsonl"))
    assert run.exported_window == (WINDOWS, WINDOWS * STEPS_PER_WINDOW)


@pytest.mark.slow
def test_a_checkpoint_at_each_window_end_records_the_window(uninterrupted):
    root, _ = uninterrupted
    ckpt = root / "ckpt"
    steps = sorted(int(name[len("step_") :]) for name in os.listdir(ckpt) if name.startswith("step_"))
    assert steps == [3, 4, 6, 8, 9, 12]  # every 3 steps, and each window's end (4, 8, 12)
    positions = {
        s: (read_meta(str(ckpt / f"step_{s:09d}")).next_window, read_meta(str(ckpt / f"step_{s:09d}")).batch_in_epoch)
        for s in steps
    }
    # Step 12 is due by the cadence first: saved before its window's evaluation, it
    # continues at the end of window 2 (and evaluates window 3), as the run did after it.
    assert positions == {3: (0, 3), 4: (1, 0), 6: (1, 2), 8: (2, 0), 9: (2, 1), 12: (2, 4)}
    assert not os.path.exists(ckpt / "best.json")  # windows are other rows: no best across them


@pytest.mark.slow
@pytest.mark.parametrize("step", [4, 6], ids=["at_a_window_end", "within_a_window"])
def test_resume_at_a_window_equals_the_uninterrupted_run(uninterrupted, clicks, tmp_path, step):
    root, records = uninterrupted
    os.makedirs(tmp_path / "ckpt")
    name = f"step_{step:09d}"
    shutil.copytree(root / "ckpt" / name, tmp_path / "ckpt" / name)
    assert launch(dlrm_main.main, flags(tmp_path, clicks, "--resume"), nproc=RANKS) == {0: 0, 1: 0}
    resumed = read_log(str(tmp_path / "log.jsonl"))
    expected = losses(records)
    got = losses(resumed)
    assert sorted(got) == list(range(step + 1, WINDOWS * STEPS_PER_WINDOW + 1))
    assert all(got[s] == expected[s] for s in got)  # bit-identical, not merely close
    metrics = ("auroc", "log_loss", "ne", "calibration", "num_samples")
    first = step // STEPS_PER_WINDOW + 1  # the windows evaluated after the resume
    assert {w: [r[k] for k in metrics] for w, r in window_metrics(resumed).items()} == {
        w: [r[k] for k in metrics] for w, r in window_metrics(records).items() if w >= first
    }


@pytest.mark.slow
def test_resume_within_a_window_on_one_rank_reads_what_two_ranks_left(uninterrupted, clicks, tmp_path):
    """Step 6 (window 1, batch 2) of the 2-rank run, resumed on one rank with the same
    global batch: the run keeps the checkpoint's 2 epoch shares, so the window's rest is
    the rows the two ranks read next (the second half of each share: both row groups of
    the day), step for step the uninterrupted run's; its checkpoints record the 2 shares."""
    root, records = uninterrupted
    os.makedirs(tmp_path / "ckpt")
    name = f"step_{6:09d}"
    shutil.copytree(root / "ckpt" / name, tmp_path / "ckpt" / name)
    one_rank = ["--batch_size", str(BATCH * RANKS), "--test_batch_size", str(EVAL_BATCH * RANKS)]
    assert launch(dlrm_main.main, flags(tmp_path, clicks, "--resume", *one_rank), nproc=1) == {0: 0}
    resumed = read_log(str(tmp_path / "log.jsonl"))
    got, expected = losses(resumed), losses(records)
    assert sorted(got) == list(range(7, WINDOWS * STEPS_PER_WINDOW + 1))
    assert all(got[s] == pytest.approx(expected[s], rel=1e-4) for s in got)  # one rank's sums, not two ranks'
    reader = [r for r in resumed if r["event"] == "data_statistics"][0]["reader"]
    # Rows 32-63 of the day (share 0's) and 96-127 (share 1's): row groups of 64, both read.
    assert reader == {"rows_read": 2 * 64, "bytes_read": reader["bytes_read"], "rows_decoded": 2 * BATCH * RANKS}
    assert window_metrics(resumed)[2]["num_samples"] == ROWS_PER_DAY
    assert read_meta(str(tmp_path / "ckpt" / f"step_{12:09d}")).data.epoch_shares == RANKS


@pytest.mark.slow
def test_resume_refuses_a_run_with_other_windows(uninterrupted, clicks, tmp_path, capsys, monkeypatch):
    """A rolling checkpoint resumed by a run with another --rolling_windows: one line, exit 2."""
    root, _ = uninterrupted
    os.makedirs(tmp_path / "ckpt")
    shutil.copytree(root / "ckpt" / "step_000000004", tmp_path / "ckpt" / "step_000000004")
    argv = flags(tmp_path, clicks, "--resume", "--batch_size", str(BATCH * RANKS))  # one rank, same global batch
    argv[argv.index("--rolling_windows") + 1] = "2"
    monkeypatch.delenv("RANK", raising=False)
    assert dlrm_main.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"dlrm_main.py: error: checkpoint {tmp_path / 'ckpt' / 'step_000000004'} was trained with "
        "--rolling_windows 3, this run has 2: its position in the data cannot carry over"
    )


@pytest.mark.slow
def test_a_rolling_checkpoint_is_evaluated_without_the_protocol(uninterrupted, capsys, monkeypatch):
    """--mode test of a checkpoint trained window by window evaluates the test split:
    the recorded --rolling_windows says how it was trained, not how to evaluate it."""
    root, _ = uninterrupted
    monkeypatch.delenv("RANK", raising=False)
    log = root / "evaluation.jsonl"
    assert dlrm_main.main(["--mode", "test", "--checkpoint_dir", str(root / "ckpt"), "--log_path", str(log)]) == 0
    tested = [r for r in read_log(str(log)) if r["event"] == "eval"]
    assert [(r["stage"], r["step"], r["num_samples"]) for r in tested] == [
        ("test", WINDOWS * STEPS_PER_WINDOW, ROWS_PER_DAY)
    ]  # the test split: the last day
    assert (tested[0]["model"], tested[0]["exported"]) == ("newest", True)  # none marked best
    assert f"test (newest, step {WINDOWS * STEPS_PER_WINDOW}, the one export takes): AUROC" in capsys.readouterr().out


def test_the_startup_block_says_the_windows_the_run_reads(clicks, tmp_path, capsys):
    """In a rolling run the rows and time ranges printed are the windows', not a
    train/validation/test split that the run never reads."""
    config, source = parse_config_and_source(flags(tmp_path, clicks), "dlrm_main.py", "")
    dataset = source.open(check_values=False)
    lines = StartupReport(config, resolve_env("cpu"), source).before_setup(dataset)
    days = [LOG.day(d).isoformat() for d in range(WINDOWS + 2)]
    assert lines[3:5] == [
        f"data: {clicks} | rows: "
        + ", ".join(f"window {w} {ROWS_PER_DAY}" for w in range(WINDOWS + 1))
        + f" | batch {BATCH} per rank",
        "time ranges (date): " + ", ".join(f"window {w} {days[w]} to before {days[w + 1]}" for w in range(WINDOWS + 1)),
    ]
    assert capsys.readouterr().out.splitlines() == lines


def test_two_days_make_one_rolling_window_and_its_evaluation(tmp_path):
    """Too short for the default train/validation/test split (1d, 1d): --rolling_windows 1
    reads its windows only, each day whole."""
    generate_synthetic_parquet(SyntheticParquetSpec(**{**vars(LOG), "days": 2}), str(tmp_path / "two_days"))
    argv = flags(tmp_path, tmp_path / "two_days")
    argv[argv.index("--rolling_windows") + 1] = "1"
    config = parse_config(argv, "dlrm_main.py", "")
    source = source_for(config.data)
    loaders = source.window_loaders(
        source.open(check_values=False), 0, 2, config.model.num_embeddings_per_feature, 0, RANKS
    )
    assert {split: len(loader) for split, loader in loaders.items()} == {
        "train": STEPS_PER_WINDOW,
        "validation": ROWS_PER_DAY // (EVAL_BATCH * RANKS),
    }


@pytest.mark.parametrize("page", ["docs/training.md", "docs/data.md"])
def test_the_documented_rolling_command_is_accepted_on_the_documented_log(page, tmp_path):
    """The page's --rolling_windows command, on a tiny log of the shape its generator
    command writes (4 days, multi-hot columns): its flags pass and its windows hold rows.
    Training itself on these flags is the slow tests' (on 2 gloo ranks)."""
    (generate,) = commands_starting("docs/data.md", "python", "-m", "data.synthetic_parquet")
    clicks = generate[generate.index("--output_dir") + 1]
    documented = [argv for argv in commands_starting(page, "torchrun") if "--rolling_windows" in argv]
    assert documented, f"{page} shows no --rolling_windows command"
    generate_synthetic_parquet(
        SyntheticParquetSpec(days=int(generate[generate.index("--days") + 1]), rows_per_day=64, row_group_rows=16),
        str(tmp_path / "clicks"),
    )
    for argv in documented:
        assert argv[:3] == ["torchrun", "--nproc_per_node", "2"] and argv[3] == "dlrm_main.py", argv
        config = parse_config(replaced(argv[4:], {clicks: str(tmp_path / "clicks")}), "dlrm_main.py", "")
        dataset = source_for(config.data).open(check_values=False)
        assert list(dataset.splits) == [f"window {w}" for w in range(config.data.rolling_windows + 1)]


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--rolling_windows", "0"],
            "--rolling_windows must be at least 1 (train on window 0, evaluate on window 1), got 0",
        ),
        (["--rolling_windows", "2"], "--rolling_windows splits the data by time: give --time_column"),
        (
            ["--rolling_windows", "2", "--time_column", "date", "--epochs", "2"],
            "--rolling_windows cannot be combined with --epochs 2: it makes one pass over each window",
        ),
        (
            ["--rolling_windows", "2", "--time_column", "date", "--mode", "inference_benchmark"],
            "--rolling_windows cannot be combined with --mode inference_benchmark: it trains window after window",
        ),
        (
            ["--rolling_windows", "2", "--time_column", "date", "--test_window", "1d"],
            "--rolling_windows evaluates each window on the next one: --validation_window and --test_window do not apply",
        ),
        (
            ["--rolling_windows", "2", "--time_column", "date", "--validation_freq_within_epoch", "5"],
            "--rolling_windows cannot be combined with --validation_freq_within_epoch: it evaluates each window once",
        ),
        (
            ["--rolling_windows", "2", "--time_column", "date", "--early_stopping_patience", "1"],
            "--rolling_windows cannot be combined with --early_stopping_patience",
        ),
        (
            ["--rolling_windows", "2", "--time_column", "date", "--validation_auroc", "0.8"],
            "--rolling_windows cannot be combined with --validation_auroc",
        ),
        (
            ["--rolling_windows", "2", "--time_column", "date", "--evaluate_on_training_end"],
            "--rolling_windows cannot be combined with --evaluate_on_training_end alone",
        ),
        (
            ["--rolling_windows", "2", "--time_column", "date", "--limit_val_batches", "0"],
            "--rolling_windows cannot be combined with --limit_val_batches 0",
        ),
    ],
)
def test_combinations_the_protocol_cannot_honour_are_refused(clicks, capsys, monkeypatch, extra, message):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit) as refused:  # when the flags are parsed, before torch loads
        dlrm_main.main(["--parquet_path", str(clicks), "--sparse_columns", "C*", *extra])
    assert refused.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlrm_main.py: error: ") and message in lines[0], lines


def test_data_without_time_windows_is_refused_before_training(capsys, monkeypatch):
    """Random data (or any source without time windows): one line, exit 2, before any collective."""
    monkeypatch.delenv("RANK", raising=False)
    try:
        code = dlrm_main.main(["--rolling_windows", "2", "--time_column", "date", "--num_embeddings", "50"])
    except SystemExit as e:  # refused with the flags, should the data flags say it first
        code = e.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "--time_column" in lines[0], lines


@pytest.mark.slow
def test_progress_counts_every_windows_steps_from_the_start(tmp_path):
    """Windows of different lengths (day 0 holds half the rows of the others): the
    progress line's total is every window's steps, the same from the first step to the
    last and in the start-up record. It was recomputed at each window as if the windows
    left were as long as the current one, so it moved mid-run."""
    root = tmp_path / "clicks"
    generate_synthetic_parquet(SyntheticParquetSpec(**{**vars(LOG), "files_per_day": 2}), str(root))
    os.remove(root / f"date={LOG.day(0).isoformat()}" / "part-1.parquet")  # window 0: half a day
    assert launch(dlrm_main.main, flags(tmp_path, root), nproc=RANKS) == {0: 0, 1: 0}
    records = read_log(str(tmp_path / "log.jsonl"))
    total = STEPS_PER_WINDOW // 2 + (WINDOWS - 1) * STEPS_PER_WINDOW
    assert sorted(losses(records)) == list(range(1, total + 1))
    assert {r["total_steps"] for r in records if r["event"] in ("train", "startup")} == {total}
