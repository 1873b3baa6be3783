"""Training throughput against the machine's own fp32 matmul peak, measured in the same run.

Trains the public TorchRec example's default architecture (dim 64, bottom 512-256-64,
top 512-512-256-1, 26 tables of 100k rows, 1024 rows per rank, random data) on
2 gloo ranks through the real entry point, and prints records/s, the model FLOPs per
record (forward + backward), the matmul peak and their ratio.

    python bench/train_throughput.py [--steps 300] [--nproc 2] [--batch_size 1024]
        [--embedding_precision fp32|fp16]
"""

import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

import dlrm_main
from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from harness.launch import launch, read_log

BOTTOM = [512, 256, 64]
TOP = [512, 512, 256, 1]
DIM, TABLES, ROWS = 64, 26, 100_000


def matmul_peak_gflops(threads: int, size: int = 2048, repeats: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """Best GFLOP/s of a size^3 matmul in ``dtype`` using ``threads`` threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    torch.mm(a, b)  # warm-up
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * size**3 / (time.perf_counter() - start) / 1e9)
    torch.set_num_threads(previous)
    return best


def mlp_macs(in_features: int, sizes: list[int]) -> int:
    macs = 0
    for out in sizes:
        macs, in_features = macs + in_features * out, out
    return macs


def flops_per_record() -> float:
    """Forward + backward FLOPs of one record: matmuls and the interaction's batched
    matmul, 2 FLOPs a multiply-add, backward twice the forward."""
    interaction_in = DIM + math.comb(TABLES + 1, 2)
    forward_macs = mlp_macs(13, BOTTOM) + mlp_macs(interaction_in, TOP) + (TABLES + 1) ** 2 * DIM
    return 3 * 2 * forward_macs


@dataclass
class TrainThroughputFlags:
    """The flags of ``python bench/train_throughput.py``: what it measures and how."""

    steps: int = flag(300, help="training steps (first interval is warm-up)")
    nproc: int = flag(2, help="ranks (torchrun --nproc_per_node)")
    batch_size: int = flag(1024, help="rows per rank")
    embedding_precision: str = flag("fp32", choices=("fp32", "fp16"), help="the embedding tables' precision")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), TrainThroughputFlags, argv)
    interval = max(1, args.steps // 6)
    threads = os.cpu_count() or 1
    peak_before = matmul_peak_gflops(threads)
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "bench.jsonl")
        argv = [
            "--num_embeddings",
            str(ROWS),
            "--embedding_dim",
            str(DIM),
            "--dense_arch_layer_sizes",
            ",".join(map(str, BOTTOM)),
            "--over_arch_layer_sizes",
            ",".join(map(str, TOP)),
            "--batch_size",
            str(args.batch_size),
            "--limit_train_batches",
            str(args.steps),
            "--limit_val_batches",
            "0",
            "--limit_test_batches",
            "0",
            "--learning_rate",
            "0.1",
            "--log_every_n_steps",
            str(interval),
            "--log_path",
            log,
            "--embedding_precision",
            args.embedding_precision,
        ]
        launch(dlrm_main.main, argv, nproc=args.nproc)
        train = [r for r in read_log(log) if r["event"] == "train"][1:]  # drop warm-up interval
    peak_after = matmul_peak_gflops(threads)
    peak = max(peak_before, peak_after)
    steps = sum(len(r["step_losses"]) for r in train)
    records_per_sec = sum(r["records"] for r in train) / sum(r["seconds"] for r in train)
    flops = flops_per_record()
    achieved = records_per_sec * flops / 1e9
    table_bytes = TABLES * ROWS * DIM * (2 if args.embedding_precision == "fp16" else 4)
    result = {
        "embedding_precision": args.embedding_precision,
        "table_memory_mib": round(table_bytes / 2**20, 1),
        "records_per_sec": round(records_per_sec),
        "mflop_per_record": round(flops / 1e6, 3),
        "achieved_gflops": round(achieved, 1),
        "matmul_peak_gflops": round(peak, 1),
        "matmul_peak_before_after": [round(peak_before, 1), round(peak_after, 1)],
        "fraction_of_peak": round(achieved / peak, 3),
        "ranks": args.nproc,
        "batch_size_per_rank": args.batch_size,
        "measured_steps": steps,
    }
    print(
        f"{args.embedding_precision} tables {table_bytes / 2**20:,.0f} MiB | "
        f"records/s {records_per_sec:,.0f} | {flops / 1e6:.2f} MFLOP/record | "
        f"{achieved:.1f} GFLOP/s achieved | matmul peak {peak:.1f} GFLOP/s "
        f"({threads} threads) | {100 * achieved / peak:.1f}% of peak"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
