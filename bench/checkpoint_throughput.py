"""Checkpoint save and load speed for the default model, beside a plain copy of the bytes.

Builds the public example's default model (26 tables of 100k x 64, Adagrad, so the
optimizer state is as large as the tables) on 2 gloo ranks, trains 2 steps on random
data, then times a full checkpoint save and a full restore (weights, optimizer state,
position) through the real trainer, and in the same run copies the checkpoint's files
with a plain file copy.

    python bench/checkpoint_throughput.py [--nproc 2] [--dir /some/disk]
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Dict, List

from bench.train_throughput import BOTTOM, DIM, ROWS, TOP
from tests.support.launch import launch


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


def _run(argv: List[str]) -> Dict[str, float]:
    """One rank: build, train 2 steps, save, restore into a fresh trainer; times on rank 0."""
    import torch.distributed as dist

    from training.checkpoint import find_restore_point
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
    dist.destroy_process_group()
    return {"save_seconds": save_seconds, "load_seconds": load_seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    root = tempfile.mkdtemp(dir=args.dir)
    try:
        ckpt = os.path.join(root, "ckpt")
        argv = ["--num_embeddings", str(ROWS), "--embedding_dim", str(DIM),
                "--dense_arch_layer_sizes", ",".join(map(str, BOTTOM)),
                "--over_arch_layer_sizes", ",".join(map(str, TOP)), "--optimizer", "adagrad",
                "--learning_rate", "0.01", "--batch_size", "1024", "--limit_train_batches", "2",
                "--limit_val_batches", "0", "--limit_test_batches", "0", "--checkpoint_dir", ckpt,
                "--checkpoint_at_epoch_end"]
        times = launch(_run, argv, nproc=args.nproc)[0]
        step_dir = os.path.join(ckpt, sorted(os.listdir(ckpt))[-1])
        total = sum(os.path.getsize(os.path.join(step_dir, f)) for f in os.listdir(step_dir))
        copy_seconds = plain_copy_seconds(step_dir, os.path.join(root, "copy"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mb = total / 1e6
    result = {
        "checkpoint_mb": round(mb, 1),
        "save_seconds": round(times["save_seconds"], 2),
        "save_mb_s": round(mb / times["save_seconds"], 1),
        "load_seconds": round(times["load_seconds"], 2),
        "load_mb_s": round(mb / times["load_seconds"], 1),
        "plain_copy_seconds": round(copy_seconds, 2),
        "plain_copy_mb_s": round(mb / copy_seconds, 1),
        "ranks": args.nproc,
    }
    print(f"checkpoint {mb:.0f} MB: save {times['save_seconds']:.2f} s ({result['save_mb_s']} MB/s), "
          f"load {times['load_seconds']:.2f} s ({result['load_mb_s']} MB/s), "
          f"plain copy {copy_seconds:.2f} s ({result['plain_copy_mb_s']} MB/s)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
