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

    python bench/id_vocabulary.py [--work_dir data_cache/id_vocabulary] [--rows_per_day 50000]
        [--table_rows 2000] [--min_id_count 2]
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
from harness.launch import eval_record, read_log, run_script

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


def _train(flags: IdVocabularyBenchFlags, lake: str, name: str, extra: list[str]) -> dict:
    log = os.path.join(flags.work_dir, f"{name}.jsonl")
    argv = [
        *("dlrm_main.py", "--parquet_path", lake, "--time_column", "date", "--dense_columns", "I*"),
        *("--sparse_columns", ",".join(COLUMNS), "--num_embeddings", str(flags.table_rows)),
        *("--embedding_dim", "16", "--dense_arch_layer_sizes", "64,16", "--over_arch_layer_sizes", "64,1"),
        *("--batch_size", "512", "--learning_rate", "0.05", "--optimizer", "adagrad", "--device", "cpu"),
        *("--epochs", str(flags.epochs), "--log_path", log),
        *("--checkpoint_dir", os.path.join(flags.work_dir, f"{name}_checkpoints"), *extra),
    ]
    proc = run_script(argv, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"bench/id_vocabulary.py: the {name} run failed: {proc.stderr.strip().splitlines()[-1]}")
    meta = sorted(glob.glob(os.path.join(flags.work_dir, f"{name}_checkpoints", "step_*", "meta.json")))[-1]
    with open(meta) as f:
        rows = json.load(f)["config"]["model"]["num_embeddings_per_feature"]
    records: Any = read_log(log)
    return {"test": eval_record(records, "test"), "rows": rows}


def _true_unseen(lake: str, train_days: list[str], test_day: str) -> dict[str, float]:
    shares = {}
    for name in COLUMNS:
        trained = np.unique(
            np.concatenate([ParquetColumns._bags(pq.read_table(d, columns=[name]).column(name))[0] for d in train_days])
        )
        keys = ParquetColumns._bags(pq.read_table(test_day, columns=[name]).column(name))[0]
        shares[name] = float(np.mean(~np.isin(keys, trained)))
    return shares


def main(argv: Sequence[str] | None = None) -> int:
    flags = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), IdVocabularyBenchFlags, argv)
    shutil.rmtree(flags.work_dir, ignore_errors=True)
    os.makedirs(flags.work_dir)
    lake = os.path.join(flags.work_dir, "lake")
    spec = SyntheticParquetSpec(
        days=flags.days, rows_per_day=flags.rows_per_day, files_per_day=1, new_id_rate=flags.new_id_rate
    )
    generate_synthetic_parquet(spec, lake)
    hashed = _train(flags, lake, "hash", [])
    vocabulary = _train(
        flags, lake, "vocabulary", ["--id_hashing", "vocabulary", "--min_id_count", str(flags.min_id_count)]
    )
    model = os.path.join(flags.work_dir, "vocabulary_model")
    checkpoints = os.path.join(flags.work_dir, "vocabulary_checkpoints")
    proc = run_script(["-m", "serving.export", "--checkpoint", checkpoints, "--output", model], timeout=3600)
    if proc.returncode:
        raise SystemExit(f"bench/id_vocabulary.py: export failed: {proc.stderr.strip().splitlines()[-1]}")
    days = sorted(glob.glob(os.path.join(lake, "date=*")))
    metrics_file = os.path.join(flags.work_dir, "predict_metrics.json")
    predict = ["-m", "serving.predict", "--model", model, "--input", days[-1]]
    predict += ["--output", os.path.join(flags.work_dir, "scores.parquet"), "--metrics_output", metrics_file]
    proc = run_script(predict, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"bench/id_vocabulary.py: predict failed: {proc.stderr.strip().splitlines()[-1]}")
    with open(metrics_file) as f:
        reported = json.load(f).get("unseen_share_by_feature", {})
    truth = _true_unseen(lake, days[:-2], days[-1])
    print(f"{'run':<12} {'test AUROC':>10} {'table rows':>40}")
    for name, run in (("hash", hashed), ("vocabulary", vocabulary)):
        print(f"{name:<12} {run['test']['auroc']:>10.4f} {','.join(map(str, run['rows'])):>40}")
    print(
        "unseen share of the test day, predict vs truth: "
        + ", ".join(f"{n} {reported.get(n, 0.0):.2%} vs {truth[n]:.2%}" for n in COLUMNS)
    )
    result = {
        "hash_test_auroc": hashed["test"]["auroc"],
        "vocabulary_test_auroc": vocabulary["test"]["auroc"],
        "hash_rows": hashed["rows"],
        "vocabulary_rows": vocabulary["rows"],
        "unseen_share_reported": reported,
        "unseen_share_true": truth,
        "max_unseen_share_error": max(abs(reported.get(n, 0.0) - truth[n]) for n in COLUMNS),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
