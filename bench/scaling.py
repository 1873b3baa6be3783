"""How start-up, memory, checkpoints, evaluation and the loader scale, each against a
limit measured in the same run.

For tables growing by 10x (26 tables of --rows rows at dim 64, one process, fused
SGD, random data), each size in fresh processes:

- start-up: seconds from constructing the trainer to the end of its first training
  step, per GB of tables, against a plain ``torch.empty`` + ``fill_`` of the same
  bytes in a fresh process (page faults included);
- peak RSS at the first step per GB of tables (the limit is 1.0: the tables), and
  the RSS of the fresh process with torch and torchrec imported, the constant;
- checkpoint save and load (through the trainer) per GB, against a plain copy of
  the checkpoint's files with fsync;
- evaluation records/s against training records/s (the same batches' size and model).

For training data growing by 10x (synthetic binary Criteo days), one rank's
memory-mapped loader (--mmap_mode, rank 0 of 2, 1024 rows per batch) against a
sequential read of the same files, both with the files first evicted from the page
cache (posix_fadvise, our files only), and the loader's peak RSS (in a fresh process;
mapped file pages count while resident).

    python bench/scaling.py [--rows 10000,100000,1000000] [--data_rows 100000,1000000,10000000]
        [--dir /some/disk]
"""

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Dict, List

from bench.checkpoint_throughput import plain_copy_seconds
from bench.loader_throughput import loader_rate
from bench.train_throughput import BOTTOM, DIM, TOP
from tests.support.launch import launch, read_log

TABLES, BATCH, TRAIN_STEPS, EVAL_BATCHES = 26, 1024, 40, 40
GB = 1e9


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _fill(argv: List[str]) -> Dict[str, float]:
    """The limit: a fresh process allocates and fills the tables' bytes."""
    import torch
    import torchrec  # noqa: F401  (the constant RSS of a process that trains)

    base_rss = _peak_rss()
    start = time.perf_counter()
    torch.empty(int(argv[0]) // 4).fill_(0.5)
    return {"fill_seconds": time.perf_counter() - start, "base_rss": base_rss}


def _train(argv: List[str]) -> Dict[str, Any]:
    """One rank: build, first step, more steps, evaluation, checkpoint save and load."""
    import torch.distributed as dist

    from training.checkpoint import find_restore_point
    from training.distributed import resolve_env
    from training.flags import parse_config
    from training.trainer import Trainer

    config = parse_config(argv, "bench", "")
    start = time.perf_counter()
    trainer = Trainer(config, resolve_env("cpu"))
    eval_seconds: Dict[str, float] = {}
    evaluate = trainer.evaluate

    def timed_evaluate(stage: str) -> Any:
        began = time.perf_counter()
        values = evaluate(stage)
        eval_seconds[stage] = time.perf_counter() - began
        return values

    trainer.evaluate = timed_evaluate  # type: ignore[method-assign]
    built = time.perf_counter() - start
    result = trainer.fit()
    records = read_log(config.log_path)
    train = [r for r in records if r["event"] == "train"]
    first_step = built + train[0]["seconds"]  # log_every_n_steps 1: the first record is step 1
    rest = train[1:]
    rss_at_first_step = train[0]["peak_memory_bytes"][0]
    dist.barrier()
    began = time.perf_counter()
    trainer.save_checkpoint(epoch=1, batch_in_epoch=0)
    save_seconds = time.perf_counter() - began
    config.checkpoint.resume = True
    restore = find_restore_point(config)
    assert restore is not None and restore.full
    began = time.perf_counter()
    trainer.restore_from(restore)
    load_seconds = time.perf_counter() - began
    dist.destroy_process_group()
    return {
        "build_seconds": built, "first_step_seconds": first_step, "rss_at_first_step": rss_at_first_step,
        "train_records_per_sec": sum(r["records"] for r in rest) / sum(r["seconds"] for r in rest),
        "eval_records_per_sec": result.validation["num_samples"] / eval_seconds["validation"],
        "save_seconds": save_seconds, "load_seconds": load_seconds, "peak_rss": _peak_rss(),
    }


def _evict(paths: List[str]) -> None:
    """Drops our files from the page cache, so reads come from the disk."""
    for path in paths:
        with open(path, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _sequential_read_seconds(paths: List[str]) -> float:
    start = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass
    return time.perf_counter() - start


def measure_tables(rows: int, root: str) -> Dict[str, Any]:
    """Every table figure for 26 tables of ``rows`` rows."""
    table_bytes = TABLES * rows * DIM * 4
    limit = launch(_fill, [str(table_bytes)], nproc=1)[0]
    work = tempfile.mkdtemp(dir=root)
    try:
        ckpt, log = os.path.join(work, "ckpt"), os.path.join(work, "log.jsonl")
        argv = ["--num_embeddings", str(rows), "--embedding_dim", str(DIM),
                "--dense_arch_layer_sizes", ",".join(map(str, BOTTOM)),
                "--over_arch_layer_sizes", ",".join(map(str, TOP)), "--learning_rate", "0.1",
                "--batch_size", str(BATCH), "--limit_train_batches", str(TRAIN_STEPS),
                "--limit_val_batches", str(EVAL_BATCHES), "--limit_test_batches", "0",
                "--log_every_n_steps", "1", "--log_path", log, "--checkpoint_dir", ckpt,
                "--checkpoint_every_n_steps", str(10**9)]  # saving on, but only when asked
        run = launch(_train, argv, nproc=1)[0]
        step_dir = os.path.join(ckpt, sorted(os.listdir(ckpt))[-1])
        ckpt_bytes = sum(os.path.getsize(os.path.join(step_dir, f)) for f in os.listdir(step_dir))
        copy_seconds = plain_copy_seconds(step_dir, os.path.join(work, "copy"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gb = table_bytes / GB
    return {
        "rows": rows, "table_gb": round(gb, 3),
        "first_step_s_per_gb": round(run["first_step_seconds"] / gb, 3),
        "fill_s_per_gb": round(limit["fill_seconds"] / gb, 3),
        "first_step_vs_fill": round(run["first_step_seconds"] / limit["fill_seconds"], 2),
        "rss_at_first_step_per_table_gb": round(run["rss_at_first_step"] / table_bytes, 3),
        "base_rss_gb": round(limit["base_rss"] / GB, 3),
        "rss_minus_base_per_table_gb": round((run["rss_at_first_step"] - limit["base_rss"]) / table_bytes, 3),
        "checkpoint_gb": round(ckpt_bytes / GB, 3),
        "save_s_per_gb": round(run["save_seconds"] * GB / ckpt_bytes, 3),
        "load_s_per_gb": round(run["load_seconds"] * GB / ckpt_bytes, 3),
        "copy_s_per_gb": round(copy_seconds * GB / ckpt_bytes, 3),
        "save_vs_copy": round(run["save_seconds"] / copy_seconds, 2),
        "load_vs_copy": round(run["load_seconds"] / copy_seconds, 2),
        "peak_rss_with_checkpoint_per_table_gb": round(run["peak_rss"] / table_bytes, 3),
        "train_records_per_sec": round(run["train_records_per_sec"]),
        "eval_records_per_sec": round(run["eval_records_per_sec"]),
        "eval_vs_train": round(run["eval_records_per_sec"] / run["train_records_per_sec"], 2),
    }


def _mmap_loader_run(directory: str, cardinalities: List[int]) -> Dict[str, float]:
    """In a fresh process: one rank's memory-mapped loader over its whole training share."""
    from data.criteo_binary import CriteoBinaryDataset, CriteoBinaryLoader

    loader = CriteoBinaryLoader(CriteoBinaryDataset(directory), "train", batch_size=BATCH, rank=0, world_size=2,
                                num_embeddings_per_feature=cardinalities, mmap_mode=True)
    rate = loader_rate(loader, max_batches=len(loader))
    return {"rate": rate, "peak_rss": _peak_rss()}


def measure_data(rows_per_day: int, root: str) -> Dict[str, Any]:
    """The memory-mapped loader against a sequential read, on 2 training days + 1 eval day."""
    from data.synthetic_criteo import SyntheticCriteoSpec, generate_synthetic_criteo

    work = tempfile.mkdtemp(dir=root)
    try:
        spec = SyntheticCriteoSpec(num_days=3, rows_per_day=rows_per_day, seed=2)
        generate_synthetic_criteo(spec, work, show_progress=False)
        files = [os.path.join(work, f) for f in sorted(os.listdir(work)) if f.endswith(".npy")]
        data_bytes = sum(os.path.getsize(f) for f in files)
        _evict(files)
        read_seconds = _sequential_read_seconds(files)
        _evict(files)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            run = pool.submit(_mmap_loader_run, work, spec.cardinalities).result()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    read_batches_per_sec = (data_bytes / read_seconds) / (data_bytes / (3 * rows_per_day) * BATCH)
    return {
        "rows_per_day": rows_per_day, "data_gb": round(data_bytes / GB, 3),
        "mmap_batches_per_sec": round(run["rate"], 1),
        "read_mb_per_sec": round(data_bytes / read_seconds / 1e6, 1),
        "read_batches_per_sec": round(read_batches_per_sec, 1),
        "mmap_vs_read": round(run["rate"] / read_batches_per_sec, 2),
        "loader_peak_rss_gb": round(run["peak_rss"] / GB, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="10000,100000,1000000", help="rows per table, comma-separated")
    parser.add_argument("--data_rows", default="100000,1000000,10000000", help="rows per synthetic day")
    parser.add_argument("--dir", default=None, help="where checkpoints and data go (default: a temporary directory)")
    args = parser.parse_args()
    root = tempfile.mkdtemp(dir=args.dir)
    try:
        tables = [measure_tables(int(r), root) for r in args.rows.split(",") if r]
        data = [measure_data(int(r), root) for r in args.data_rows.split(",") if r]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("| tables | first step s/GB | fill s/GB | ratio | RSS/GB at step 1 | (RSS - base)/GB | "
          "save s/GB | load s/GB | copy s/GB | save/copy | load/copy | eval/train records/s |")
    print("| --- " * 12 + "|")
    for t in tables:
        print(f"| 26 x {t['rows']:,} ({t['table_gb']} GB) | {t['first_step_s_per_gb']} | {t['fill_s_per_gb']} | "
              f"{t['first_step_vs_fill']} | {t['rss_at_first_step_per_table_gb']} | "
              f"{t['rss_minus_base_per_table_gb']} | {t['save_s_per_gb']} | {t['load_s_per_gb']} | "
              f"{t['copy_s_per_gb']} | {t['save_vs_copy']} | {t['load_vs_copy']} | "
              f"{t['eval_records_per_sec']:,} / {t['train_records_per_sec']:,} = {t['eval_vs_train']} |")
    if data:
        print("\n| data | mmap loader batches/s | sequential read MB/s (as batches/s) | ratio | peak RSS GB |")
        print("| --- " * 5 + "|")
        for d in data:
            print(f"| 3 x {d['rows_per_day']:,} rows ({d['data_gb']} GB) | {d['mmap_batches_per_sec']} | "
                  f"{d['read_mb_per_sec']} ({d['read_batches_per_sec']}) | {d['mmap_vs_read']} | "
                  f"{d['loader_peak_rss_gb']} |")
    print(json.dumps({"tables": tables, "data": data}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
