"""Training from Parquet against training from the in-memory binary: the same model on the same rows.

Writes a synthetic Criteo data set (data.synthetic_criteo: --days days, the last one
validation + test) and the same rows as one Parquet table (label, I1..I13 float32 as
the binary holds them, C1..C26 int64 ids), then trains ``make train``'s model
(dlrm_main's defaults with the Makefile's TRAIN_FLAGS: 512 rows per rank, Adagrad 0.05,
seed 0) on --nproc gloo ranks for --steps steps from each source, --rounds times one
after the other, and prints the records/s of each (the log's train intervals but the
first, a warm-up) and ``ratio``: Parquet over binary (median over rounds; goal >= 0.95).

The Parquet run reads ``--dense_transform none`` and ``--id_hashing modulo`` with the
binary's table sizes, so the model, its tables and every batch's values are the binary
run's; its split is the binary's (the last day halved into validation and test). The
feed's threads are ``--data_workers`` (unset: the rank's share of the cores, as a run).

    python bench/parquet_training.py [--steps 300] [--nproc 2] [--rows_per_day 200000]
        [--rounds 1] [--data_workers N]
"""

import json
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import dlrm_main
from common.cli import OneLineParser, positive_int
from common.config_flags import flag, parse_flags
from data.binary.criteo import CriteoBinaryDataset
from data.synthetic_criteo import SyntheticCriteoSpec, generate_synthetic_criteo
from harness.launch import launch, read_log

# `make train`'s flags (the Makefile's TRAIN_FLAGS) that shape the work of a step.
TRAIN_FLAGS = ["--batch_size", "512", "--learning_rate", "0.05", "--optimizer", "adagrad", "--seed", "0"]
ROW_GROUP_ROWS = 128 * 1024


def write_parquet_copy(binary_dir: str, output_dir: str, row_group_rows: int = ROW_GROUP_ROWS) -> int:
    """The binary data set's rows, in order, as one Parquet file in ``output_dir``
    (label int8, I1..I13 float32, C1..C26 int64); returns its rows."""
    dataset = CriteoBinaryDataset(binary_dir)
    dense, sparse, labels = dataset.read(0, dataset.num_rows)
    assert isinstance(sparse, np.ndarray)  # one-hot days: one (rows, 26) array
    columns: dict[str, pa.Array] = {"label": pa.array(np.asarray(labels).reshape(-1).astype(np.int8))}
    for j in range(dense.shape[1]):
        columns[f"I{j + 1}"] = pa.array(np.asarray(dense[:, j], dtype=np.float32))
    for j in range(sparse.shape[1]):
        columns[f"C{j + 1}"] = pa.array(np.asarray(sparse[:, j], dtype=np.int64))
    os.makedirs(output_dir, exist_ok=True)
    pq.write_table(pa.table(columns), os.path.join(output_dir, "part-0.parquet"), row_group_size=row_group_rows)
    return dataset.num_rows


def parquet_flags(parquet_dir: str, rows_per_day: int, days: int) -> list[str]:
    """The flags that read the Parquet copy as the binary run reads its days (with the
    binary's table sizes): the same values and split (the last day's halves validation
    and test)."""
    half = f"{rows_per_day // 2 / (rows_per_day * days):.12f}"
    return [
        "--parquet_path",
        parquet_dir,
        "--dense_columns",
        "I*",
        "--sparse_columns",
        "C*",
        "--dense_transform",
        "none",
        "--id_hashing",
        "modulo",
        "--validation_window",
        half,
        "--test_window",
        half,
    ]


def records_per_sec(log_path: str) -> float:
    """Training records/s of a run's log: its train intervals but the first (warm-up)."""
    train = [r for r in read_log(log_path) if r["event"] == "train"][1:]
    if not train:
        raise RuntimeError(f"{log_path}: fewer than two train intervals (raise --steps)")
    return sum(r["records"] for r in train) / sum(r["seconds"] for r in train)


@dataclass
class ParquetTrainingFlags:
    """The flags of ``python bench/parquet_training.py``: what it measures and how."""

    steps: int = flag(300, parse=positive_int, help="training steps of each run (the first sixth is warm-up)")
    nproc: int = flag(2, parse=positive_int, help="ranks (torchrun --nproc_per_node)")
    rows_per_day: int = flag(200_000, parse=positive_int, help="rows of each synthetic day")
    days: int = flag(3, parse=positive_int, help="synthetic days (the last one validation + test)")
    rounds: int = flag(1, parse=positive_int, help="binary and Parquet runs, one after the other; the median ratio")
    data_workers: int | None = flag(None, help="the Parquet run's --data_workers (unset: the run's default)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    args = parse_flags(parser, ParquetTrainingFlags, argv)
    if args.days < 2:
        parser.error(f"--days must be at least 2 (training + evaluation), got {args.days}")
    interval = max(1, args.steps // 6)
    with tempfile.TemporaryDirectory() as tmp:
        binary_dir, parquet_dir = os.path.join(tmp, "binary"), os.path.join(tmp, "parquet")
        spec = SyntheticCriteoSpec(num_days=args.days, rows_per_day=args.rows_per_day)
        generate_synthetic_criteo(spec, binary_dir, show_progress=False)
        write_parquet_copy(binary_dir, parquet_dir)
        common = [
            *TRAIN_FLAGS,
            "--num_embeddings_per_feature",
            ",".join(map(str, spec.cardinalities)),
            "--limit_train_batches",
            str(args.steps),
            "--limit_val_batches",
            "0",
            "--limit_test_batches",
            "0",
            "--log_every_n_steps",
            str(interval),
        ]
        sources = {
            "binary": ["--in_memory_binary_criteo_path", binary_dir],
            "parquet": parquet_flags(parquet_dir, args.rows_per_day, args.days)
            + (["--data_workers", str(args.data_workers)] if args.data_workers else []),
        }
        rates: dict[str, list[float]] = {name: [] for name in sources}
        for round_ in range(args.rounds):
            for name, flags in sources.items():
                log = os.path.join(tmp, f"{name}-{round_}.jsonl")
                launch(dlrm_main.main, [*common, *flags, "--log_path", log], nproc=args.nproc)
                rates[name].append(records_per_sec(log))
    ratios = [p / b for p, b in zip(rates["parquet"], rates["binary"])]
    result = {
        "binary_records_per_sec": round(statistics.median(rates["binary"])),
        "parquet_records_per_sec": round(statistics.median(rates["parquet"])),
        "ratio": round(statistics.median(ratios), 3),
        "ratios": [round(r, 3) for r in ratios],
        "ranks": args.nproc,
        "batch_size_per_rank": 512,
        "steps": args.steps,
        "data_workers": args.data_workers,
    }
    print(
        f"binary {result['binary_records_per_sec']:,} records/s, Parquet {result['parquet_records_per_sec']:,} "
        f"records/s: ratio {result['ratio']:.3f} (goal >= 0.95; {args.nproc} ranks, {args.steps} steps, "
        f"{args.rounds} round(s))"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
