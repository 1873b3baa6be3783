"""Checkpoint save, load and the training stall of a background save, against their goals.

Builds the public example's default model (26 tables of 100k x 64 = 0.67 GB, Adagrad,
so the optimizer state is as large as the tables; ``--num_embeddings 1000000`` for
6.66 GB) on 2 gloo ranks, trains 2 steps on random data, then, through the real
trainer and in the same run:

- a full blocking save, against a plain copy of the checkpoint's files with fsync
  (goal: at most 1.5x);
- a full restore (weights, optimizer state, position), against a plain read of the
  same files (goal: at most 1.3x);
- the step loop's stall while an ``--async_checkpoint`` save is written: the time of
  steps run beside it minus the same number of steps without a save, against the
  blocking save's time (goal: at most 20%). Enough steps run to outlast the write.

    python bench/checkpoint_throughput.py [--nproc 2] [--dir /some/disk] [--num_embeddings 1000000]
"""

import itertools
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from bench.train_throughput import BOTTOM, DIM, ROWS, TOP
from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from harness.launch import launch


def plain_copy_seconds(source: str, target: str) -> float:
    """Seconds to copy every file of ``source`` into a new directory ``target`` and fsync
    it (a checkpoint's files are fsynced too): the limit a checkpoint save is held to."""
    os.makedirs(target)
    start = time.perf_counter()
    for name in os.listdir(source):
        shutil.copyfile(os.path.join(source, name), os.path.join(target, name))
        with open(os.path.join(target, name), "rb+") as f:
            os.fsync(f.fileno())
    return time.perf_counter() - start


def plain_read_seconds(source: str) -> float:
    """Seconds to read every file of ``source`` (what a load must read): the limit a
    checkpoint load is held to."""
    start = time.perf_counter()
    for name in os.listdir(source):
        with open(os.path.join(source, name), "rb") as f:
            while f.read(64 << 20):
                pass
    return time.perf_counter() - start


def _endless_batches(trainer) -> Iterator:
    """The training split's batches, epoch after epoch."""
    loader = trainer.loaders["train"]
    for epoch in itertools.count():
        loader.set_epoch(epoch, 0)
        yield from trainer._batches(loader)


def _steps_seconds(trainer, batches: Iterator, steps: int) -> float:
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        trainer.train_pipeline.progress(batches)
        trainer.step += 1
    dist.barrier()
    return time.perf_counter() - start


def _stall_seconds(trainer, save_seconds: float) -> dict[str, float]:
    """Steps beside a background save, less the same steps alone (rank 0's count of
    steps, broadcast: every rank runs the same)."""
    import torch.distributed as dist

    from checkpoints.save import CheckpointManager

    batches = _endless_batches(trainer)
    step_seconds = _steps_seconds(trainer, batches, 3) / 3  # also warms the pipeline up
    steps = [max(3, math.ceil(2 * save_seconds / step_seconds))]
    dist.broadcast_object_list(steps, src=0)
    alone = _steps_seconds(trainer, batches, steps[0])
    blocking = trainer.checkpoints
    trainer.checkpoints = CheckpointManager(blocking.directory, 0, trainer.env.rank, asynchronous=True)
    dist.barrier()
    start = time.perf_counter()
    trainer.save_checkpoint(epoch=1, batch_in_epoch=0)
    beside = time.perf_counter() - start + _steps_seconds(trainer, batches, steps[0])
    trainer.checkpoints.wait()
    trainer.checkpoints = blocking
    return {"stall_seconds": max(0.0, beside - alone), "stall_steps": steps[0], "step_seconds": alone / steps[0]}


def _run(argv: list[str]) -> dict[str, float]:
    """One rank: build, train 2 steps, save, restore into a fresh trainer, then steps
    beside a background save; times on rank 0."""
    import torch.distributed as dist

    from training.checkpoint_policy import find_restore_point
    from training.distributed import resolve_env
    from training.flags import parse_config
    from training.trainer import Trainer

    config = parse_config(argv, "bench", "")
    trainer = Trainer(config, resolve_env("cpu"))
    trainer.fit()
    dist.barrier()
    start = time.perf_counter()
    trainer.save_checkpoint(epoch=1, batch_in_epoch=0)
    dist.barrier()
    save_seconds = time.perf_counter() - start
    config.checkpoint.resume = True
    restore = find_restore_point(config)
    assert restore is not None and restore.full
    dist.barrier()
    start = time.perf_counter()
    trainer.restore_from(restore)  # weights, optimizer state and position
    dist.barrier()
    load_seconds = time.perf_counter() - start
    stall = _stall_seconds(trainer, save_seconds)
    dist.destroy_process_group()
    return {"save_seconds": save_seconds, "load_seconds": load_seconds, **stall}


@dataclass
class CheckpointThroughputFlags:
    """The flags of ``python bench/checkpoint_throughput.py``: what it measures and how."""

    nproc: int = flag(2, help="ranks (torchrun --nproc_per_node) that save and load")
    dir: str | None = flag(None, help="where to write (default: a temporary directory)")
    num_embeddings: int = flag(ROWS, help="rows of each of the 26 tables (1000000: 6.66 GB)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), CheckpointThroughputFlags, argv)
    root = tempfile.mkdtemp(dir=args.dir)
    try:
        ckpt = os.path.join(root, "ckpt")
        argv = [
            "--num_embeddings",
            str(args.num_embeddings),
            "--embedding_dim",
            str(DIM),
            "--dense_arch_layer_sizes",
            ",".join(map(str, BOTTOM)),
            "--over_arch_layer_sizes",
            ",".join(map(str, TOP)),
            "--optimizer",
            "adagrad",
            "--learning_rate",
            "0.01",
            "--batch_size",
            "1024",
            "--limit_train_batches",
            "2",
            "--limit_val_batches",
            "0",
            "--limit_test_batches",
            "0",
            "--checkpoint_dir",
            ckpt,
            "--checkpoint_at_epoch_end",
        ]
        times = launch(_run, argv, nproc=args.nproc)[0]
        step_dir = os.path.join(ckpt, sorted(name for name in os.listdir(ckpt) if name.startswith("step_"))[0])
        total = sum(os.path.getsize(os.path.join(step_dir, f)) for f in os.listdir(step_dir))
        copy_seconds = plain_copy_seconds(step_dir, os.path.join(root, "copy"))
        read_seconds = plain_read_seconds(step_dir)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mb = total / 1e6
    save_ratio, load_ratio = times["save_seconds"] / copy_seconds, times["load_seconds"] / read_seconds
    stall_ratio = times["stall_seconds"] / times["save_seconds"]
    result = {
        "table_gb": round(26 * args.num_embeddings * DIM * 4 / 1e9, 2),
        "checkpoint_mb": round(mb, 1),
        "save_seconds": round(times["save_seconds"], 2),
        "save_mb_s": round(mb / times["save_seconds"], 1),
        "load_seconds": round(times["load_seconds"], 2),
        "load_mb_s": round(mb / times["load_seconds"], 1),
        "plain_copy_seconds": round(copy_seconds, 2),
        "plain_copy_mb_s": round(mb / copy_seconds, 1),
        "plain_read_seconds": round(read_seconds, 2),
        "save_over_copy": round(save_ratio, 2),
        "load_over_read": round(load_ratio, 2),
        "async_stall_seconds": round(times["stall_seconds"], 2),
        "async_stall_steps": times["stall_steps"],
        "stall_over_blocking_save": round(stall_ratio, 3),
        "ranks": args.nproc,
    }
    print(
        f"checkpoint {mb:.0f} MB: save {times['save_seconds']:.2f} s ({result['save_mb_s']} MB/s), "
        f"load {times['load_seconds']:.2f} s ({result['load_mb_s']} MB/s), "
        f"plain copy {copy_seconds:.2f} s ({result['plain_copy_mb_s']} MB/s), plain read {read_seconds:.2f} s"
    )
    for what, ratio, goal in (
        ("save / plain copy+fsync", save_ratio, 1.5),
        ("load / plain read", load_ratio, 1.3),
        ("async save's stall / blocking save", stall_ratio, 0.2),
    ):
        print(f"{what}: {ratio:.2f} (goal <= {goal}: {'met' if ratio <= goal else 'NOT met'})")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
