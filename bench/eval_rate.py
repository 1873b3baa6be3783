"""Evaluation records/s against training records/s at the default model, in one run,
and the memory the exact AUROC holds per evaluated row.

Trains the default architecture (bench/train_throughput.py's: dim 64, 26 tables of
100k rows, 1024 rows per rank, random data) on --nproc gloo ranks through the real
entry point, then tests on --eval_batches batches; the run log's train records (the
first interval, warm-up, dropped) and its test record's ``records_per_sec`` give the
two rates (goal: evaluation >= 10x training). Then, in this process, torchmetrics'
exact BinaryAUROC (what evaluation uses without --auroc_bins) over --auroc_rows
predictions: the resident memory it holds after the updates and its peak during
``compute``, per row (on several ranks every rank gathers every rank's rows first).

    python bench/eval_rate.py [--steps 120] [--eval_batches 60] [--nproc 2] [--auroc_rows 8000000]
        [--num_embeddings 100000]
"""

import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torchmetrics.classification import BinaryAUROC

import dlrm_main
from bench.train_throughput import BOTTOM, DIM, ROWS, TOP
from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from harness.launch import launch, read_log

GOAL = 10.0  # evaluation records/s over training records/s, at least
BATCH = 1024


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def auroc_bytes_per_row(rows: int, batch: int = 16384) -> dict:
    """Resident bytes per row the exact AUROC holds after its updates, and its peak
    during compute, both over the resident memory before the first update."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak RSS (VmHWM) starts again from the current RSS
    before = _status_bytes("VmRSS")
    metric = BinaryAUROC()
    generator = torch.Generator().manual_seed(0)
    for start in range(0, rows, batch):
        n = min(batch, rows - start)
        metric.update(
            torch.rand(n, generator=generator), torch.randint(0, 2, (n,), generator=generator, dtype=torch.int32)
        )
    held = _status_bytes("VmRSS") - before
    metric.compute()
    peak = _status_bytes("VmHWM") - before
    return {
        "rows": rows,
        "held_bytes_per_row": round(held / rows, 1),
        "compute_peak_bytes_per_row": round(peak / rows, 1),
    }


@dataclass
class EvalRateFlags:
    """The flags of ``python bench/eval_rate.py``: what it measures and how."""

    steps: int = flag(120, help="training steps (the first interval is warm-up)")
    eval_batches: int = flag(60, help="test batches per rank")
    nproc: int = flag(2, help="ranks (torchrun --nproc_per_node)")
    auroc_rows: int = flag(8_000_000, help="rows fed to an exact AUROC to measure its memory per row")
    num_embeddings: int = flag(ROWS, help="rows of every table (smaller: a quick run)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), EvalRateFlags, argv)
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "bench.jsonl")
        argv = [
            "--num_embeddings",
            str(args.num_embeddings),
            "--embedding_dim",
            str(DIM),
            "--dense_arch_layer_sizes",
            ",".join(map(str, BOTTOM)),
            "--over_arch_layer_sizes",
            ",".join(map(str, TOP)),
            "--batch_size",
            str(BATCH),
            "--learning_rate",
            "0.1",
            "--limit_train_batches",
            str(args.steps),
            "--limit_val_batches",
            "0",
            "--limit_test_batches",
            str(args.eval_batches),
            "--log_every_n_steps",
            str(max(1, args.steps // 6)),
            "--log_path",
            log,
        ]
        launch(dlrm_main.main, argv, nproc=args.nproc)
        records = read_log(log)
    train = [r for r in records if r["event"] == "train"][1:]
    train_rate = sum(r["records"] for r in train) / sum(r["seconds"] for r in train)
    [test] = [r for r in records if r["event"] == "eval"]
    ratio = test["records_per_sec"] / train_rate
    memory = auroc_bytes_per_row(args.auroc_rows)
    result = {
        "train_records_per_sec": round(train_rate),
        "eval_records_per_sec": round(test["records_per_sec"]),
        "eval_rows": test["num_samples"],
        "eval_vs_train": round(ratio, 2),
        "goal": GOAL,
        "ranks": args.nproc,
        "auroc_memory": memory,
    }
    print(
        f"evaluation {test['records_per_sec']:,.0f} records/s over {test['num_samples']:,} rows, training "
        f"{train_rate:,.0f} records/s: {ratio:.1f}x (goal >= {GOAL:g}x) | exact AUROC: "
        f"{memory['held_bytes_per_row']} bytes per row held, {memory['compute_peak_bytes_per_row']} at its "
        f"compute's peak ({memory['rows']:,} rows)"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
