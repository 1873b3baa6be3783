"""Binary Criteo loader speed against the rate at which training consumes batches.

Writes a synthetic data set (2 training days + 1 eval day), then measures in the same
run: batches/s of one rank's training loader alone (rank 0 of 2, 1024 rows per
batch) in memory, memory-mapped, with --shuffle_training_set, and with on-the-fly
multi-hot bags; and the training steps/s of the public example's default model on
2 ranks (bench/train_throughput.py's setup). Prints each loader's ratio to the
training rate.

    python bench/loader_throughput.py [--rows_per_day 500000] [--train_steps 120]
"""

import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

import dlrm_main
from bench.train_throughput import BOTTOM, DIM, ROWS, TOP
from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from data.batching.multi_hot import MultiHotExpander
from data.binary.criteo import CriteoBinaryDataset, CriteoBinaryLoader
from data.synthetic_criteo import SyntheticCriteoSpec, generate_synthetic_criteo
from harness.launch import launch, read_log

BATCH = 1024


def loader_rate(loader: CriteoBinaryLoader, max_batches: int = 400) -> float:
    """Batches per second of iterating the loader (building each Batch)."""
    start, count = time.perf_counter(), 0
    for _ in loader:
        count += 1
        if count == max_batches:
            break
    return count / (time.perf_counter() - start)


def training_steps_per_sec(steps: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "train.jsonl")
        launch(
            dlrm_main.main,
            [
                "--num_embeddings",
                str(ROWS),
                "--embedding_dim",
                str(DIM),
                "--dense_arch_layer_sizes",
                ",".join(map(str, BOTTOM)),
                "--over_arch_layer_sizes",
                ",".join(map(str, TOP)),
                "--batch_size",
                str(BATCH),
                "--limit_train_batches",
                str(steps),
                "--limit_val_batches",
                "0",
                "--limit_test_batches",
                "0",
                "--learning_rate",
                "0.1",
                "--log_every_n_steps",
                str(max(1, steps // 6)),
                "--log_path",
                log,
            ],
        )
        train = [r for r in read_log(log) if r["event"] == "train"][1:]  # drop warm-up interval
    return sum(len(r["step_losses"]) for r in train) / sum(r["seconds"] for r in train)


@dataclass
class LoaderThroughputFlags:
    """The flags of ``python bench/loader_throughput.py``: what it measures and how."""

    rows_per_day: int = flag(500_000, help="rows of each of the 3 synthetic days read")
    train_steps: int = flag(120, help="steps of the training run the loader's rate is compared with")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), LoaderThroughputFlags, argv)
    with tempfile.TemporaryDirectory() as tmp:
        spec = SyntheticCriteoSpec(num_days=3, rows_per_day=args.rows_per_day, seed=2)
        generate_synthetic_criteo(spec, tmp, show_progress=False)
        dataset = CriteoBinaryDataset(tmp)
        common = dict(batch_size=BATCH, rank=0, world_size=2, num_embeddings_per_feature=spec.cardinalities)
        loaders = {
            "in_memory": CriteoBinaryLoader(dataset, "train", **common),
            "mmap": CriteoBinaryLoader(dataset, "train", mmap_mode=True, **common),
            "shuffled_rows_in_memory": CriteoBinaryLoader(dataset, "train", row_permutation_seed=1, **common),
            "multi_hot_20_in_memory": CriteoBinaryLoader(
                dataset, "train", expand=MultiHotExpander([20] * 26, spec.cardinalities, "uniform", 0), **common
            ),
        }
        rates = {name: loader_rate(loader) for name, loader in loaders.items()}
    steps = training_steps_per_sec(args.train_steps)
    result = {
        "training_steps_per_sec": round(steps, 2),
        **{f"{k}_batches_per_sec": round(v, 1) for k, v in rates.items()},
        **{f"{k}_ratio_to_training": round(v / steps, 1) for k, v in rates.items()},
    }
    for name, rate in rates.items():
        print(
            f"{name:<26} {rate:8.1f} batches/s  = {rate / steps:5.1f} x the training rate "
            f"({steps:.2f} steps/s, default model, 2 ranks)"
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
