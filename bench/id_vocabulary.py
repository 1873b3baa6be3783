"""Hash or vocabulary at the same memory: test AUROC of ``--id_hashing hash`` against
``--id_hashing vocabulary --min_id_count N`` on the synthetic lake with new ids every day,
and the unseen-id share predict reports against the true one.

Both runs train on the same rows (every day but the last two; validation and test are
the last two days, one each) with every table at most ``--table_rows`` rows: the hashed
tables have exactly that many, the vocabulary's keep at most ``--table_rows - 1`` ids (the
most frequent of those read at least ``--min_id_count`` times) and the out-of-vocabulary
row. The vocabulary model is exported and predict scores the test day; the true unseen
share is the share of the test day's ids that the training days never held. Prints a
table and one JSON line.

With ``--seeds S`` every figure is measured on S lakes and runs (seeds 0 .. S - 1, or
from ``--first_seed``: the lake's and the training's), reported as the mean, the sample standard deviation and the
paired difference (vocabulary - hash, seed by seed), so a small difference can be told
from noise. With ``--min_id_counts 1,2,3`` each seed trains one vocabulary run per N and
keeps the one of best *validation* AUROC (the test day is never looked at to choose).

    python bench/id_vocabulary.py [--work_dir data_cache/id_vocabulary] [--rows_per_day 50000]
        [--table_rows 2000] [--min_id_count 2] [--min_id_counts 1,2,3] [--seeds 3]
"""

import glob
import json
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from data.parquet.columns import ParquetColumns
from data.synthetic_parquet import SyntheticParquetSpec, generate_synthetic_parquet
from harness.id_benches import train_small_model
from harness.launch import eval_record, run_script

COLUMNS = ["C1", "C3", "C4", "C10", "M1"]


@dataclass
class IdVocabularyBenchFlags:
    """The bench's flags."""

    work_dir: str = flag("data_cache/id_vocabulary", help="where the lake, runs and model go (replaced)")
    rows_per_day: int = flag(50_000, help="rows of each of the lake's days")
    days: int = flag(4, help="days of the lake: all but the last two are trained on")
    new_id_rate: float = flag(0.05, help="the lake's share of each day's ids first seen that day")
    table_rows: int = flag(2000, help="rows of every table at most (the memory both runs get)")
    min_id_count: int = flag(2, help="--min_id_count of the vocabulary run")
    epochs: int = flag(2, help="training epochs of both runs")
    seeds: int = flag(1, help="seeds 0 .. SEEDS - 1 of the lake and of the runs (mean, std, paired difference)")
    first_seed: int = flag(0, help="start the seeds here (FIRST .. FIRST + SEEDS - 1: seeds split between processes)")
    min_id_counts: str = flag(
        "", help="candidates for --min_id_count, e.g. 1,2,3: each seed keeps the best on validation (default: the one)"
    )

    def candidates(self) -> list[int]:
        """The --min_id_count values tried (empty: a bad --min_id_counts)."""
        if not self.min_id_counts:
            return [self.min_id_count]
        try:
            values = [int(v) for v in self.min_id_counts.split(",")]
        except ValueError:
            return []
        return values if min(values) >= 1 else []


def _train(flags: IdVocabularyBenchFlags, work_dir: str, seed: int, name: str, extra: list[str]) -> dict:
    lake = os.path.join(work_dir, "lake")
    log = os.path.join(work_dir, f"{name}.jsonl")
    argv = [
        *("--parquet_path", lake, "--time_column", "date", "--dense_columns", "I*"),
        *("--sparse_columns", ",".join(COLUMNS), "--num_embeddings", str(flags.table_rows)),
        *("--batch_size", "512", "--epochs", str(flags.epochs), "--seed", str(seed)),
        *("--checkpoint_dir", os.path.join(work_dir, f"{name}_checkpoints"), *extra),
    ]
    records: Any = train_small_model("bench/id_vocabulary.py", name, argv, log, timeout=3600)
    meta = sorted(glob.glob(os.path.join(work_dir, f"{name}_checkpoints", "step_*", "meta.json")))[-1]
    with open(meta) as f:
        rows = json.load(f)["config"]["model"]["num_embeddings_per_feature"]
    # The test record is the best validation's model (the trainer tests it last): N is
    # chosen on that same validation figure, not on the last epoch's.
    validations = [r for r in records if r["event"] == "eval" and r["stage"] == "validation"]
    best = max(validations, key=lambda r: r["auroc"])
    return {"test": eval_record(records, "test"), "validation": best, "rows": rows}


def _true_unseen(lake: str, train_days: list[str], test_day: str) -> dict[str, float]:
    shares = {}
    for name in COLUMNS:
        trained = np.unique(
            np.concatenate([ParquetColumns._bags(pq.read_table(d, columns=[name]).column(name))[0] for d in train_days])
        )
        keys = ParquetColumns._bags(pq.read_table(test_day, columns=[name]).column(name))[0]
        shares[name] = float(np.mean(~np.isin(keys, trained)))
    return shares


def run_seed(flags: IdVocabularyBenchFlags, seed: int) -> dict[str, Any]:
    """One lake and its runs: hash, a vocabulary run per candidate N, the one of best
    validation AUROC exported and scored by predict."""
    work_dir = os.path.join(flags.work_dir, f"seed_{seed}")
    os.makedirs(work_dir)
    lake = os.path.join(work_dir, "lake")
    spec = SyntheticParquetSpec(
        days=flags.days, rows_per_day=flags.rows_per_day, files_per_day=1, new_id_rate=flags.new_id_rate, seed=seed
    )
    generate_synthetic_parquet(spec, lake)
    hashed = _train(flags, work_dir, seed, "hash", [])
    tried = {
        n: _train(flags, work_dir, seed, f"vocabulary_n{n}", ["--id_hashing", "vocabulary", "--min_id_count", str(n)])
        for n in flags.candidates()
    }
    chosen = max(tried, key=lambda n: tried[n]["validation"]["auroc"])  # validation only: never the test day
    model = os.path.join(work_dir, "vocabulary_model")
    checkpoints = os.path.join(work_dir, f"vocabulary_n{chosen}_checkpoints")
    proc = run_script(["-m", "serving.export", "--checkpoint", checkpoints, "--output", model], timeout=3600)
    if proc.returncode:
        raise SystemExit(f"bench/id_vocabulary.py: export failed: {proc.stderr.strip().splitlines()[-1]}")
    days = sorted(glob.glob(os.path.join(lake, "date=*")))
    metrics_file = os.path.join(work_dir, "predict_metrics.json")
    predict = ["-m", "serving.predict", "--model", model, "--input", days[-1]]
    predict += ["--output", os.path.join(work_dir, "scores.parquet"), "--metrics_output", metrics_file]
    proc = run_script(predict, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"bench/id_vocabulary.py: predict failed: {proc.stderr.strip().splitlines()[-1]}")
    with open(metrics_file) as f:
        reported = json.load(f).get("unseen_share_by_feature", {})
    truth = _true_unseen(lake, days[:-2], days[-1])
    vocabulary = tried[chosen]
    print(f"seed {seed}: {'run':<16} {'validation':>10} {'test AUROC':>10} {'table rows':>34}")
    runs = [("hash", hashed)] + [(f"vocabulary N={n}" + (" *" if n == chosen else ""), r) for n, r in tried.items()]
    for name, run in runs:
        print(
            f"seed {seed}: {name:<16} {run['validation']['auroc']:>10.4f} {run['test']['auroc']:>10.4f} "
            f"{','.join(map(str, run['rows'])):>34}"
        )
    print(
        f"seed {seed}: unseen share of the test day, predict vs truth: "
        + ", ".join(f"{n} {reported.get(n, 0.0):.2%} vs {truth[n]:.2%}" for n in COLUMNS),
        flush=True,
    )
    return {
        "seed": seed,
        "hash_test_auroc": hashed["test"]["auroc"],
        "hash_validation_auroc": hashed["validation"]["auroc"],
        "vocabulary_test_auroc": vocabulary["test"]["auroc"],
        "min_id_count": chosen,
        "vocabulary_by_min_id_count": {
            str(n): {"validation_auroc": r["validation"]["auroc"], "test_auroc": r["test"]["auroc"], "rows": r["rows"]}
            for n, r in tried.items()
        },
        "hash_rows": hashed["rows"],
        "vocabulary_rows": vocabulary["rows"],
        "unseen_share_reported": reported,
        "unseen_share_true": truth,
        "max_unseen_share_error": max(abs(reported.get(n, 0.0) - truth[n]) for n in COLUMNS),
    }


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    array = np.array(values, dtype=np.float64)
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0


def main(argv: Sequence[str] | None = None) -> int:
    flags = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), IdVocabularyBenchFlags, argv)
    if flags.seeds < 1:
        print(f"bench/id_vocabulary.py: --seeds must be positive, got {flags.seeds}", file=sys.stderr)
        return 2
    if not flags.candidates():
        print(
            f"bench/id_vocabulary.py: --min_id_counts {flags.min_id_counts!r}: expected positive integers, e.g. 1,2,3",
            file=sys.stderr,
        )
        return 2
    shutil.rmtree(flags.work_dir, ignore_errors=True)
    os.makedirs(flags.work_dir)
    per_seed = [run_seed(flags, seed) for seed in range(flags.first_seed, flags.first_seed + flags.seeds)]
    hashed = _mean_std([r["hash_test_auroc"] for r in per_seed])
    vocabulary = _mean_std([r["vocabulary_test_auroc"] for r in per_seed])
    difference = _mean_std([r["vocabulary_test_auroc"] - r["hash_test_auroc"] for r in per_seed])
    wins = sum(r["vocabulary_test_auroc"] >= r["hash_test_auroc"] for r in per_seed)
    print(
        f"test AUROC over {flags.seeds} seed(s): hash {hashed[0]:.4f} ± {hashed[1]:.4f}, vocabulary "
        f"{vocabulary[0]:.4f} ± {vocabulary[1]:.4f} (N chosen on validation: "
        f"{', '.join(str(r['min_id_count']) for r in per_seed)}); vocabulary - hash {difference[0]:+.4f} ± "
        f"{difference[1]:.4f}, vocabulary >= hash on {wins} of {flags.seeds}"
    )
    result = {
        "bench": "id_vocabulary",
        "rows_per_day": flags.rows_per_day,
        "table_rows": flags.table_rows,
        "seeds": flags.seeds,
        "min_id_counts": flags.candidates(),
        "hash_test_auroc": hashed[0],
        "hash_test_auroc_std": hashed[1],
        "vocabulary_test_auroc": vocabulary[0],
        "vocabulary_test_auroc_std": vocabulary[1],
        "difference": difference[0],
        "difference_std": difference[1],
        "vocabulary_wins": wins,
        "max_unseen_share_error": max(r["max_unseen_share_error"] for r in per_seed),
        "per_seed": per_seed,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
