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

For training data growing by 10x (synthetic binary Criteo days), and for an
existing data set (--data_dir, e.g. one larger than memory), the memory-mapped loader
(--mmap_mode, one rank, so that it reads every byte the sequential read reads; 1024
rows per batch) over the whole training split against a sequential read of the same
files, each with the files first evicted from the page cache (posix_fadvise, our
files only), and the loader's peak RSS (in a fresh process; mapped file pages count
while resident): in order with the pages read released (the default), in order with
them kept mapped (the peer), and in shuffled batch order (--shuffle_batches; the
first 20,000 batches).

    python bench/scaling.py [--rows 10000,100000,1000000] [--data_rows 100000,1000000,10000000]
        [--dir /some/disk] [--data_dir /an/existing/data_set]
"""

import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from bench.checkpoint_throughput import plain_copy_seconds
from bench.loader_throughput import loader_rate
from bench.train_throughput import BOTTOM, DIM, TOP
from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from harness.launch import launch, read_log

TABLES, BATCH, TRAIN_STEPS, EVAL_BATCHES = 26, 1024, 40, 40
GB = 1e9


def _peak_rss() -> int:
    """The process's peak RSS, counting what came before the trainer's plan-memory probe
    started the kernel's peak again (training/distributed.py)."""
    import torch

    from training.distributed import local_peak_memory_bytes

    return local_peak_memory_bytes(torch.device("cpu"))


def _fill(argv: list[str]) -> dict[str, float]:
    """The limit: a fresh process allocates and fills the tables' bytes."""
    import torch
    import torchrec  # noqa: F401  (the constant RSS of a process that trains)

    base_rss = _peak_rss()
    start = time.perf_counter()
    torch.empty(int(argv[0]) // 4).fill_(0.5)
    return {"fill_seconds": time.perf_counter() - start, "base_rss": base_rss}


def _train(argv: list[str]) -> dict[str, Any]:
    """One rank: build, first step, more steps, evaluation, checkpoint save and load."""
    import torch.distributed as dist

    from training.checkpoint_policy import find_restore_point
    from training.distributed import resolve_env
    from training.flags import parse_config
    from training.trainer import Trainer

    config = parse_config(argv, "bench", "")
    start = time.perf_counter()
    trainer = Trainer(config, resolve_env("cpu"))
    eval_seconds: dict[str, float] = {}
    evaluate = trainer.evaluate

    def timed_evaluate(stage: str, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        values = evaluate(stage, *args, **kwargs)
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
        "build_seconds": built,
        "first_step_seconds": first_step,
        "rss_at_first_step": rss_at_first_step,
        "train_records_per_sec": sum(r["records"] for r in rest) / sum(r["seconds"] for r in rest),
        "eval_records_per_sec": result.validation["num_samples"] / eval_seconds["validation"],
        "save_seconds": save_seconds,
        "load_seconds": load_seconds,
        "peak_rss": _peak_rss(),
    }


def _evict(paths: list[str]) -> None:
    """Drops our files from the page cache, so reads come from the disk."""
    for path in paths:
        with open(path, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _sequential_read_seconds(paths: list[str]) -> float:
    start = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass
    return time.perf_counter() - start


def measure_tables(rows: int, root: str) -> dict[str, Any]:
    """Every table figure for 26 tables of ``rows`` rows."""
    table_bytes = TABLES * rows * DIM * 4
    limit = launch(_fill, [str(table_bytes)], nproc=1)[0]
    work = tempfile.mkdtemp(dir=root)
    try:
        ckpt, log = os.path.join(work, "ckpt"), os.path.join(work, "log.jsonl")
        argv = [
            "--num_embeddings",
            str(rows),
            "--embedding_dim",
            str(DIM),
            "--dense_arch_layer_sizes",
            ",".join(map(str, BOTTOM)),
            "--over_arch_layer_sizes",
            ",".join(map(str, TOP)),
            "--learning_rate",
            "0.1",
            "--batch_size",
            str(BATCH),
            "--limit_train_batches",
            str(TRAIN_STEPS),
            "--limit_val_batches",
            str(EVAL_BATCHES),
            "--limit_test_batches",
            "0",
            "--log_every_n_steps",
            "1",
            "--log_path",
            log,
            "--checkpoint_dir",
            ckpt,
            "--checkpoint_every_n_steps",
            str(10**9),
        ]  # saving on, but only when asked
        run = launch(_train, argv, nproc=1)[0]
        step_dir = os.path.join(ckpt, sorted(os.listdir(ckpt))[-1])
        ckpt_bytes = sum(os.path.getsize(os.path.join(step_dir, f)) for f in os.listdir(step_dir))
        copy_seconds = plain_copy_seconds(step_dir, os.path.join(work, "copy"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gb = table_bytes / GB
    return {
        "rows": rows,
        "table_gb": round(gb, 3),
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


def _mmap_loader_run(directory: str, shuffled: bool, release: bool) -> dict[str, float]:
    """In a fresh process: one rank's memory-mapped loader over the training split (in
    shuffled order its first SHUFFLED_BATCHES batches: random reads are slower)."""
    from data.binary.criteo import CriteoBinaryDataset, CriteoBinaryLoader
    from data.binary.mapped_pages import RELEASE_EVERY_BYTES

    loader = CriteoBinaryLoader(
        CriteoBinaryDataset(directory),
        "train",
        batch_size=BATCH,
        rank=0,
        world_size=1,
        mmap_mode=True,
        shuffle_batches_seed=0 if shuffled else None,
        release_every_bytes=RELEASE_EVERY_BYTES if release else None,
    )
    rate = loader_rate(loader, max_batches=min(len(loader), SHUFFLED_BATCHES) if shuffled else len(loader))
    return {"rate": rate, "peak_rss": _peak_rss()}


SHUFFLED_BATCHES = 20_000
# The loader runs measured: (name, batches in shuffled order, pages read released).
LOADER_RUNS = [("sequential", False, True), ("sequential_kept", False, False), ("shuffled", True, True)]


def measure_loader(directory: str) -> dict[str, Any]:
    """The memory-mapped loader against a sequential read of the data set's files, each
    run from the disk (the files evicted from the page cache first)."""
    from data.binary.criteo import CriteoBinaryDataset

    files = [os.path.join(directory, f) for f in sorted(os.listdir(directory)) if f.endswith(".npy")]
    data_bytes = sum(os.path.getsize(f) for f in files)
    rows = CriteoBinaryDataset(directory).num_rows
    _evict(files)
    read_seconds = _sequential_read_seconds(files)
    read_batches_per_sec = (data_bytes / read_seconds) / (data_bytes / rows * BATCH)
    result: dict[str, Any] = {
        "data_gb": round(data_bytes / GB, 3),
        "read_mb_per_sec": round(data_bytes / read_seconds / 1e6, 1),
        "read_batches_per_sec": round(read_batches_per_sec, 1),
    }
    for name, shuffled, release in LOADER_RUNS:
        _evict(files)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            run = pool.submit(_mmap_loader_run, directory, shuffled, release).result()
        result[f"{name}_batches_per_sec"] = round(run["rate"], 1)
        result[f"{name}_vs_read"] = round(run["rate"] / read_batches_per_sec, 2)
        result[f"{name}_peak_rss_gb"] = round(run["peak_rss"] / GB, 3)
        print(
            f"{directory}: {name} loader {run['rate']:.0f} batches/s, peak RSS {run['peak_rss'] / GB:.2f} GB; "
            f"sequential read {read_batches_per_sec:.0f} batches/s",
            file=sys.stderr,
            flush=True,
        )
    return result


def measure_data(rows_per_day: int, root: str) -> dict[str, Any]:
    """The memory-mapped loader on a generated data set: 2 training days + 1 eval day."""
    from data.synthetic_criteo import SyntheticCriteoSpec, generate_synthetic_criteo

    work = tempfile.mkdtemp(dir=root)
    try:
        generate_synthetic_criteo(
            SyntheticCriteoSpec(num_days=3, rows_per_day=rows_per_day, seed=2), work, show_progress=False
        )
        return {"data": f"3 x {rows_per_day:,} rows", **measure_loader(work)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


@dataclass
class ScalingFlags:
    """The flags of ``python bench/scaling.py``: what it measures and how."""

    rows: str = flag("10000,100000,1000000", help='rows per table, comma-separated ("": no checkpoint runs)')
    data_rows: str = flag("100000,1000000,10000000", help='rows per synthetic day, comma-separated ("": no data runs)')
    dir: str | None = flag(None, help="where checkpoints and data go (default: a temporary directory)")
    data_dir: str | None = flag(
        None, help="also measure the loader on this existing binary Criteo data set (left in place)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), ScalingFlags, argv)
    root = tempfile.mkdtemp(dir=args.dir)
    try:
        tables = [measure_tables(int(r), root) for r in args.rows.split(",") if r]
        data = [measure_data(int(r), root) for r in args.data_rows.split(",") if r]
        if args.data_dir:
            data.append({"data": args.data_dir, **measure_loader(args.data_dir)})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        "| tables | first step s/GB | fill s/GB | ratio | RSS/GB at step 1 | (RSS - base)/GB | "
        "save s/GB | load s/GB | copy s/GB | save/copy | load/copy | eval/train records/s |"
    )
    print("| --- " * 12 + "|")
    for t in tables:
        print(
            f"| 26 x {t['rows']:,} ({t['table_gb']} GB) | {t['first_step_s_per_gb']} | {t['fill_s_per_gb']} | "
            f"{t['first_step_vs_fill']} | {t['rss_at_first_step_per_table_gb']} | "
            f"{t['rss_minus_base_per_table_gb']} | {t['save_s_per_gb']} | {t['load_s_per_gb']} | "
            f"{t['copy_s_per_gb']} | {t['save_vs_copy']} | {t['load_vs_copy']} | "
            f"{t['eval_records_per_sec']:,} / {t['train_records_per_sec']:,} = {t['eval_vs_train']} |"
        )
    if data:
        print(
            "\n| data | sequential read MB/s (as batches/s) | "
            + " | ".join(f"{name}: batches/s, ratio, peak RSS GB" for name, _, _ in LOADER_RUNS)
            + " |"
        )
        print("| --- " * (2 + len(LOADER_RUNS)) + "|")
        for d in data:
            print(
                f"| {d['data']} ({d['data_gb']} GB) | {d['read_mb_per_sec']} ({d['read_batches_per_sec']}) | "
                + " | ".join(
                    f"{d[name + '_batches_per_sec']}, {d[name + '_vs_read']}, {d[name + '_peak_rss_gb']}"
                    for name, _, _ in LOADER_RUNS
                )
                + " |"
            )
    print(json.dumps({"tables": tables, "data": data}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
