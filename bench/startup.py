"""Time to the first training step per GB of tables against a plain fill of the same
bytes, each in fresh processes (goal: at most 1.5x the fill).

For 26 tables of --rows rows at dim 64 (fp32, fused SGD, random data, 1024 rows a
batch) on --nproc gloo ranks: the seconds from constructing the trainer to the end of
its first step (the slowest rank), split into the build (planning, sharding, the
seeded table init, optimizers, loaders) and the first step; and, in a fresh process
with torch and torchrec imported, ``torch.empty`` + ``fill_`` of one rank's share of
the tables' bytes (bench/scaling.py's fill) with torch's intra-op threads set to that
rank's share of the cores, as the trainer sets them.

    python bench/startup.py [--rows 100000,300000] [--nproc 1]
"""

import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.scaling import _fill
from bench.train_throughput import BOTTOM, DIM, TOP
from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from harness.launch import launch, read_log

TABLES, BATCH = 26, 1024
GB = 1e9
GOAL = 1.5  # first step / fill, at most


def _first_step(argv: list[str]) -> dict[str, float]:
    """One rank: seconds to build the trainer, and to the end of its first step."""
    import torch.distributed as dist

    from training.distributed import resolve_env
    from training.flags import parse_config
    from training.trainer import Trainer

    config = parse_config(argv, "bench", "")
    start = time.perf_counter()
    trainer = Trainer(config, resolve_env("cpu"))
    built = time.perf_counter() - start
    trainer.fit()
    [first] = [r for r in read_log(config.log_path) if r["event"] == "train"][:1]  # log_every_n_steps 1
    dist.destroy_process_group()
    return {"build_seconds": built, "first_step_seconds": built + first["seconds"]}


def _rank_fill(argv: list[str]) -> dict[str, float]:
    """`bench.scaling._fill` on this rank's share of the cores (argv: bytes, threads)."""
    import torch

    torch.set_num_threads(int(argv[1]))
    return _fill(argv[:1])


def measure(rows: int, nproc: int) -> dict[str, Any]:
    table_bytes = TABLES * rows * DIM * 4
    threads = max(1, (len(os.sched_getaffinity(0))) // nproc)
    fill = launch(_rank_fill, [str(table_bytes // nproc), str(threads)], nproc=1)[0]["fill_seconds"]
    with tempfile.TemporaryDirectory() as work:
        argv = [
            "--num_embeddings",
            str(rows),
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
            "1",
            "--limit_val_batches",
            "0",
            "--limit_test_batches",
            "0",
            "--log_every_n_steps",
            "1",
            "--log_path",
            os.path.join(work, "log.jsonl"),
        ]
        ranks = launch(_first_step, argv, nproc=nproc)
    slowest = max(ranks.values(), key=lambda r: r["first_step_seconds"])
    gb = table_bytes / GB
    return {
        "rows": rows,
        "table_gb": round(gb, 3),
        "ranks": nproc,
        "build_s_per_gb": round(slowest["build_seconds"] / gb, 3),
        "first_step_s_per_gb": round(slowest["first_step_seconds"] / gb, 3),
        "fill_s_per_gb": round(fill * nproc / gb, 3),
        "first_step_vs_fill": round(slowest["first_step_seconds"] / fill, 2),
    }


@dataclass
class StartupFlags:
    """The flags of ``python bench/startup.py``: what it measures and how."""

    rows: str = flag("100000,300000", help="rows per table, comma-separated")
    nproc: int = flag(1, help="ranks (torchrun --nproc_per_node)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), StartupFlags, argv)
    results = [measure(int(r), args.nproc) for r in args.rows.split(",") if r]
    print("| tables | ranks | build s/GB | first step s/GB | fill s/GB | first step / fill |")
    print("| --- " * 6 + "|")
    for r in results:
        print(
            f"| 26 x {r['rows']:,} ({r['table_gb']} GB) | {r['ranks']} | {r['build_s_per_gb']} | "
            f"{r['first_step_s_per_gb']} | {r['fill_s_per_gb']} | {r['first_step_vs_fill']} (goal <= {GOAL}) |"
        )
    print(json.dumps({"tables": results, "goal": GOAL}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
