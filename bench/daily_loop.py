"""The daily loop against retraining from scratch, on a lake whose catalogue drifts
(goal: every day's progressive-validation AUROC of the warm-started loop at least the
from-scratch model's, at no more than 1/5 of its cumulative training time).

A lake of ``--days`` days (``python -m data.synthetic_parquet --id_lifetime_days``:
each id lives ``--id_lifetime_days`` days, so every day ids are born and die) is run
through ``python -m training.daily`` once: day k trained warm-started from day k - 1,
its run scoring day k + 1 (the progressive validation), with its optimizer state
(``--warm_start_optimizer``; ``--fresh_optimizer`` for the weights only). The baseline is the same model
and flags trained from scratch, for every day k + 1, on all of days 0 .. k (a
``dlrm_main.py`` run whose validation window is day k + 1 and test window day k + 2,
so days 1 .. DAYS - 2 are compared). Training time is the runs' own ``train_seconds``
(their summary records: the steps and the checkpoint each saves at its end, not the
processes' start-up or evaluation), summed over the days. Also reported: the loop's delta exports, each one day's changes (bytes
against the bytes of the rows that changed and the dense part; goal at most 1.1x).

    python bench/daily_loop.py [--days 30] [--rows_per_day 20000] [--id_lifetime_days 7]
        [--work_dir data_cache/daily_loop] [--parallel] [--scratch_jobs N] [--one_core]
        [--fresh_optimizer] [--summarize]

On a busy machine: ``--parallel --scratch_jobs 3 --one_core`` (the loop and three
from-scratch runs at once, each process on one core: at load 20-30 on 2 cores a day's
20 steps took 3 s against 145-160 s with two threads each).

Prints a line per day and one JSON line. ``--days 5 --rows_per_day 2000`` is a quick
check of the machinery (a few minutes); the goal is stated for 30 days.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq

from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from data.synthetic_parquet import PARTITION_COLUMN, SyntheticParquetSpec, generate_synthetic_parquet
from harness.launch import REPO, read_log

AUROC_GOAL = "warm >= scratch every day"
TIME_GOAL = 0.2  # warm-started training time / from-scratch, at most
DELTA_GOAL = 1.1  # a delta's bytes / its changed rows and dense part, at most


@dataclass
class DailyLoopBench:
    days: int = flag(30, help="days of the lake (at least 4: two compared days)")
    rows_per_day: int = flag(20_000, help="rows of each day")
    id_lifetime_days: int = flag(7, help="days each id lives (the lake's drift; 0: none)")
    num_embeddings: int = flag(20_000, help="rows of each table (ids are hashed onto them)")
    batch_size: int = flag(256, help="rows of a training batch")
    full_export_every: int = flag(7, help="the loop's --full_export_every")
    work_dir: str = flag("data_cache/daily_loop", help="where the lake, the loop and the baselines go (replaced)")
    seed: int = flag(1, help="seed of the lake and of the runs")
    parallel: bool = flag(
        False,
        help="run the loop beside the from-scratch runs (two processes at once: the wall time of the longer, "
        "each side's train_seconds slowed alike by the other; for a busy machine, not for a timing)",
    )
    summarize: bool = flag(
        False,
        help="run nothing: the figures of the run in --work_dir as far as it went (the days both sides finished; "
        "a stopped 30-day run still gives its first days)",
    )
    fresh_optimizer: bool = flag(
        False, help="warm-start the weights only (the loop's default carries the optimizer: --warm_start_optimizer)"
    )
    one_core: bool = flag(
        False,
        help="run each process the bench starts on one core, the cores taken in turn (the processes it starts "
        "inherit it): one intra-op thread each, whose work does not wait on a second thread descheduled by a busy "
        "machine; both sides alike",
    )
    scratch_jobs: int = flag(
        1,
        help="from-scratch runs at once (each one process; more take a larger share of a busy machine, and slow "
        "each other's train_seconds alike: not for a timing)",
    )


def training_flags(bench: DailyLoopBench) -> list[str]:
    """The flags of every run, warm or from scratch."""
    return [
        "--dense_columns",
        "I*",
        "--sparse_columns",
        "C*",
        "--num_embeddings",
        str(bench.num_embeddings),
        "--embedding_dim",
        "16",
        "--dense_arch_layer_sizes",
        "64,16",
        "--over_arch_layer_sizes",
        "64,1",
        "--batch_size",
        str(bench.batch_size),
        "--optimizer",
        "adagrad",
        "--learning_rate",
        "0.05",
        "--seed",
        str(bench.seed),
        "--device",
        "cpu",
    ]


def _summary(log: str) -> dict[str, Any]:
    (summary,) = [r for r in read_log(log) if r["event"] == "summary"][-1:]
    return summary


# Run by a child's interpreter before it becomes the command (exec keeps the affinity;
# not a preexec_fn: this process has threads with --scratch_jobs).
_ON_CORE = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nos.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n"


def on_core(bench: DailyLoopBench, turn: int, command: list[str]) -> list[str]:
    """--one_core: ``command`` (a Python command line) run on the turn-th of this
    process's cores (its threads follow: common/cores.py sizes them by the affinity)."""
    if not bench.one_core:
        return command
    cores = sorted(os.sched_getaffinity(0))
    return [sys.executable, "-c", _ON_CORE, str(cores[turn % len(cores)]), *command[1:]]


def start_loop(bench: DailyLoopBench, lake: str) -> tuple[subprocess.Popen, float]:
    """Starts the loop over the lake: its process and its start time."""
    state_dir = os.path.join(bench.work_dir, "loop")
    command = [sys.executable, "-m", "training.daily", "--state_dir", state_dir, "--parquet_path", lake]
    command += ["--time_column", PARTITION_COLUMN, "--quantize", "none"]
    command += ["--full_export_every", str(bench.full_export_every), *training_flags(bench)]
    if not bench.fresh_optimizer:  # Adagrad's accumulators carry: the days train as one run would
        command.append("--warm_start_optimizer")
    proc = subprocess.Popen(on_core(bench, 0, command), cwd=REPO, stdout=subprocess.DEVNULL)
    return proc, time.monotonic()


def finish_loop(bench: DailyLoopBench, started: tuple[subprocess.Popen, float], days: list[str]) -> dict[str, Any]:
    """Waits for the loop and reads its figures (`loop_results`)."""
    proc, start = started
    if proc.wait():
        raise subprocess.CalledProcessError(proc.returncode, proc.args)
    return loop_results(bench, days, time.monotonic() - start)


def loop_results(bench: DailyLoopBench, days: list[str], wall: float | None) -> dict[str, Any]:
    """The loop's figures as far as it went: {day scored: AUROC}, each trained day's
    train seconds, the deltas."""
    state_dir = os.path.join(bench.work_dir, "loop")
    auroc, seconds = {}, {}
    for day, following in zip(days[:-1], days[1:]):
        log = os.path.join(state_dir, "days", day, "train.jsonl")
        records = read_log(log) if os.path.exists(log) else []
        scored = [r for r in records if r["event"] == "eval" and r.get("window") == 1]
        summaries = [r for r in records if r["event"] == "summary"]
        if scored and summaries:  # a day still training (a run stopped early) is left out
            auroc[following] = scored[-1]["auroc"]
            seconds[day] = summaries[-1]["train_seconds"]
    log = os.path.join(state_dir, "daily.jsonl")
    deltas = [r for r in read_log(log) if r["event"] == "export"] if os.path.exists(log) else []
    return {"auroc": auroc, "train_seconds": seconds, "wall_seconds": wall, "deltas": deltas}


def scratch_result(bench: DailyLoopBench, scored: str) -> tuple[float, float] | None:
    """The from-scratch model scoring ``scored``: its validation AUROC and train seconds
    (None: not run, or not finished)."""
    log = os.path.join(bench.work_dir, "scratch", scored, "train.jsonl")
    records = read_log(log) if os.path.exists(log) else []
    validation = [r for r in records if r["event"] == "eval" and r.get("stage") == "validation"]
    summaries = [r for r in records if r["event"] == "summary"]
    if not validation or not summaries:
        return None
    return validation[-1]["auroc"], summaries[-1]["train_seconds"]


def run_scratch(bench: DailyLoopBench, lake: str, days: list[str], k: int) -> tuple[float, float, float]:
    """The model trained from scratch on days 0 .. k: its AUROC on day k + 1, its train
    seconds and its process's wall seconds."""
    view = os.path.join(bench.work_dir, "scratch", days[k + 1], "view")
    os.makedirs(view)
    for day in days[: k + 3]:
        name = f"{PARTITION_COLUMN}={day}"
        os.symlink(os.path.abspath(os.path.join(lake, name)), os.path.join(view, name))
    log = os.path.join(os.path.dirname(view), "train.jsonl")
    command = [sys.executable, os.path.join(REPO, "dlrm_main.py"), *training_flags(bench)]
    command += ["--parquet_path", view, "--time_column", PARTITION_COLUMN, "--validation_window", "1d"]
    command += ["--test_window", "1d", "--log_path", log]
    # It saves its model as each of the loop's days does (its train_seconds count the save).
    command += ["--checkpoint_dir", os.path.join(os.path.dirname(view), "ckpt"), "--checkpoint_at_epoch_end"]
    start = time.monotonic()
    subprocess.run(on_core(bench, k + 1, command), cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - start
    result = scratch_result(bench, days[k + 1])
    assert result is not None, f"{log}: no validation or summary record"
    return (*result, wall)


def report(bench: DailyLoopBench, days: list[str], loop: dict[str, Any], scratch: list[dict[str, Any]]) -> int:
    """Prints each day both sides scored, the totals and the JSON line."""
    rows = []
    for row in scratch:
        scored = row["day"]
        k = days.index(scored) - 1  # the loop's day k scores day k + 1; the from-scratch run trained on 0 .. k
        if scored not in loop["auroc"]:
            continue
        rows.append({**row, "warm": loop["auroc"][scored], "warm_seconds": loop["train_seconds"][days[k]]})
        print(
            f"{scored}: progressive AUROC warm {loop['auroc'][scored]:.4f} | from scratch on {k + 1} days "
            f"{row['scratch']:.4f} ({loop['auroc'][scored] - row['scratch']:+.4f}) | train seconds warm {loop['train_seconds'][days[k]]:.1f}, scratch "
            f"{row['scratch_seconds']:.1f}",
            flush=True,
        )
    if not rows:
        print(f"{bench.work_dir}: no day scored by both the loop and a from-scratch run", file=sys.stderr)
        return 2
    warm_seconds = sum(r["warm_seconds"] for r in rows)
    scratch_seconds = sum(r["scratch_seconds"] for r in rows)
    ratio = warm_seconds / scratch_seconds
    wins = sum(r["warm"] >= r["scratch"] for r in rows)
    delta_ratio = max((d["ratio"] for d in loop["deltas"]), default=None)
    mean = {side: sum(r[side] for r in rows) / len(rows) for side in ("warm", "scratch")}
    worst = min(rows, key=lambda r: r["warm"] - r["scratch"])  # the day the goal is nearest to failing (or fails)
    print(
        f"warm >= scratch on {wins} of {len(rows)} days (mean AUROC {mean['warm']:.4f} vs {mean['scratch']:.4f}); "
        f"training time {warm_seconds:.1f} s vs {scratch_seconds:.1f} s ({ratio:.3f}x, goal <= {TIME_GOAL}); "
        f"deltas: {len(loop['deltas'])}, at most {delta_ratio}x their changed rows and dense part (goal <= "
        f"{DELTA_GOAL})"
    )
    walls = [r["scratch_wall_seconds"] for r in rows if "scratch_wall_seconds" in r]
    result = {
        "bench": "daily_loop",
        "days": len(days),
        "parallel": None if bench.summarize else bench.parallel,  # --summarize cannot tell how the run ran
        "warm_start_optimizer": not bench.fresh_optimizer,
        "rows_per_day": bench.rows_per_day,
        "id_lifetime_days": bench.id_lifetime_days,
        "per_day": rows,
        "warm_wins": wins,
        "compared_days": len(rows),
        "mean_auroc_warm": mean["warm"],
        "mean_auroc_scratch": mean["scratch"],
        "worst_day": worst["day"],
        "worst_margin": worst["warm"] - worst["scratch"],  # warm - scratch AUROC there (negative: behind)
        "warm_train_seconds": warm_seconds,
        "scratch_train_seconds": scratch_seconds,
        "time_ratio": ratio,
        "loop_wall_seconds": loop["wall_seconds"],  # every step: training, export, gate (None: --summarize)
        "scratch_wall_seconds": sum(walls) if walls else None,  # training processes only
        "delta_ratio_max": delta_ratio,
        "delta_sketch_bytes": [d["sketch_bytes"] for d in loop["deltas"]],
        "auroc_goal_met": wins == len(rows),
        "time_goal_met": ratio <= TIME_GOAL,
        "delta_goal_met": delta_ratio is not None and delta_ratio <= DELTA_GOAL,
    }
    print(json.dumps(result))
    return 0


def summarize(bench: DailyLoopBench) -> int:
    """--summarize: the figures of a run in --work_dir as far as it went (both sides'
    finished days), running nothing."""
    lake = os.path.join(bench.work_dir, "lake")
    prefix = f"{PARTITION_COLUMN}="
    days = sorted(n[len(prefix) :] for n in os.listdir(lake) if n.startswith(prefix)) if os.path.isdir(lake) else []
    if len(days) < 4:
        print(f"--summarize: {lake} holds no lake of at least 4 days", file=sys.stderr)
        return 2
    first = pq.ParquetDataset(os.path.join(lake, prefix + days[0]))
    bench.rows_per_day = sum(f.metadata.num_rows for f in first.fragments)  # the lake's, not the flag's default
    scratch = []
    for scored in days[1:-1]:
        result = scratch_result(bench, scored)
        if result is not None:
            scratch.append({"day": scored, "scratch": result[0], "scratch_seconds": result[1]})
    return report(bench, days, loop_results(bench, days, None), scratch)


def main(argv: Sequence[str] | None = None) -> int:
    bench = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), DailyLoopBench, argv)
    if bench.summarize:
        return summarize(bench)
    if bench.days < 4:
        print("--days: at least 4 (two days compared)", file=sys.stderr)
        return 2
    if bench.scratch_jobs < 1:
        print(f"--scratch_jobs: at least 1, got {bench.scratch_jobs}", file=sys.stderr)
        return 2
    shutil.rmtree(bench.work_dir, ignore_errors=True)
    lake = os.path.join(bench.work_dir, "lake")
    spec = SyntheticParquetSpec(
        days=bench.days,
        rows_per_day=bench.rows_per_day,
        files_per_day=1,
        row_group_rows=min(bench.rows_per_day, 10_000),
        multi_hot_columns=0,
        id_lifetime_days=bench.id_lifetime_days,
        seed=bench.seed,
    )
    generate_synthetic_parquet(spec, lake)
    days = [spec.day(d).isoformat() for d in range(spec.days)]
    started = start_loop(bench, lake)
    loop = None if bench.parallel else finish_loop(bench, started, days)
    scratch = []
    with ThreadPoolExecutor(bench.scratch_jobs) as pool:  # threads: each waits on its own process
        # Started in day order, so a run stopped early has every day up to the slowest run's.
        for k, (auroc, seconds, wall) in enumerate(
            pool.map(lambda k: run_scratch(bench, lake, days, k), range(bench.days - 2))
        ):
            scratch.append(
                {"day": days[k + 1], "scratch": auroc, "scratch_seconds": seconds, "scratch_wall_seconds": wall}
            )
            print(
                f"{days[k + 1]}: from scratch on {k + 1} days AUROC {auroc:.4f}, {seconds:.1f} train seconds",
                flush=True,
            )
    return report(bench, days, loop or finish_loop(bench, started, days), scratch)


if __name__ == "__main__":
    sys.exit(main())
