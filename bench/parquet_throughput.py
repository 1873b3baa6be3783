"""Parquet loader speed against pyarrow's own read of the same columns (the limit).

Writes two tables, then measures in the same run (one rank of one):
- pyarrow's own read: every row group of the table, the same columns, into Arrow
  (``ParquetFile.read_row_group``), rows/s, on one core;
- our loader: the rows/s the training loader (data.parquet.loader.ParquetLoader:
  reading, hashing, transform, id counters, KJT batches) hands to training, with one
  worker (``ratio``: over pyarrow's) and with two (``workers_2_speedup``: over one); a
  worker reads and converts its own batches, so N workers use N cores:
  ``*_rows_per_sec_per_core`` is the rows/s over the workers;
- a 2-rank job's reading of the training split, from the readers' own counters:
  ``decoded_rows_per_split_row`` (rows both ranks converted / the split's rows; 2.0
  when every rank checked the whole global batch) and ``read_rows_per_split_row`` (rows
  of the row groups pyarrow decoded: a row group two ranks' shares straddle counts twice).
Tables: Criteo-shaped (label, 13 dense floats, 26 string ids) and multi-hot (label,
13 dense, 4 list columns of 1-100 int64 ids). Prints each figure, which conversion ran
("kernels": data/parquet/kernel.py, the compiled pass per column; "numpy": not built, or
DLRM_PARQUET_KERNEL=numpy) and one JSON line.

    python bench/parquet_throughput.py [--rows 1000000] [--batch_size 4096]
"""

import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from data.config import DataConfig
from data.parquet import kernel
from data.sources import source_for

NUM_DENSE = 13
NUM_STRING_IDS = 26
NUM_LISTS = 4


def write_table(directory: str, rows: int, multi_hot: bool, row_group_rows: int, seed: int = 0) -> str:
    """One Parquet file of ``rows`` rows; returns its directory."""
    rng = np.random.default_rng(seed)
    columns = {"label": pa.array(rng.integers(0, 2, rows), pa.int8())}
    for i in range(NUM_DENSE):
        columns[f"I{i + 1}"] = pa.array(rng.exponential(10, rows).astype(np.float32))
    if multi_hot:
        for i in range(NUM_LISTS):
            lengths = rng.integers(1, 101, rows)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            values = rng.integers(0, 2**40, int(offsets[-1]), dtype=np.int64)
            columns[f"C{i + 1}"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    else:
        for i in range(NUM_STRING_IDS):
            columns[f"C{i + 1}"] = pa.array([f"{v:08x}" for v in rng.integers(0, 2**31, rows)])
    os.makedirs(directory, exist_ok=True)
    pq.write_table(pa.table(columns), os.path.join(directory, "part-0.parquet"), row_group_size=row_group_rows)
    return directory


def pyarrow_rows_per_sec(directory: str, columns: list) -> float:
    """Rows/s of pyarrow reading every row group of the table's columns."""
    path = os.path.join(directory, "part-0.parquet")
    start, rows = time.perf_counter(), 0
    parquet = pq.ParquetFile(path)
    for group in range(parquet.num_row_groups):
        rows += parquet.read_row_group(group, columns=columns).num_rows
    return rows / (time.perf_counter() - start)


def _train_loader(directory: str, batch_size: int, workers: int, rank: int = 0, world_size: int = 1) -> Any:
    """The training split's loader of one rank, as a run builds it (one process on CPU)."""
    config = DataConfig.from_flags(
        parquet_path=directory,
        dense_columns="I*",
        sparse_columns="C*",
        batch_size=batch_size,
        validation_window="0.01",
        test_window="0.01",
        data_workers=workers,
    )
    config.validate()
    source = source_for(config)
    dataset = source.open()
    return source.loaders(dataset, [1_000_000] * len(source.describe().sparse_feature_names), rank, world_size)["train"]


def loader_rows_per_sec(directory: str, batch_size: int, workers: int = 1) -> float:
    """Rows/s of the training loader's batches in its second pass (one rank of one)."""
    loader = _train_loader(directory, batch_size, workers)
    for _ in loader:  # warm-up pass: imports torchrec's batch types (each pass reads the files anew)
        pass
    start, rows = time.perf_counter(), 0
    for batch in loader:
        rows += batch.labels.numel()
    return rows / (time.perf_counter() - start)


def job_reading(directory: str, batch_size: int, world_size: int = 2) -> dict[str, float]:
    """The readers' counters of a ``world_size``-rank job's epoch of the training split,
    over the split's rows: {"decoded_rows_per_split_row", "read_rows_per_split_row"}."""
    decoded = read = 0
    for rank in range(world_size):  # one after the other: the counters do not depend on timing
        loader = _train_loader(directory, batch_size, 1, rank, world_size)
        for _ in loader:
            pass
        counters = loader.statistics()["reader"]
        decoded, read = decoded + counters["rows_decoded"], read + counters["rows_read"]
    rows = sum(len(batch.labels) for batch in _train_loader(directory, batch_size, 1))  # the split's, on one rank
    return {"decoded_rows_per_split_row": decoded / rows, "read_rows_per_split_row": read / rows}


@dataclass
class ParquetThroughputFlags:
    """The flags of ``python bench/parquet_throughput.py``: what it measures and how."""

    rows: int = flag(1_000_000, help="rows of the one-hot table (the multi-hot one has a twentieth)")
    batch_size: int = flag(4096, help="rows per batch read")
    row_group_rows: int = flag(
        128 * 1024, help="rows per Parquet row group of the one-hot table (a twentieth multi-hot)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), ParquetThroughputFlags, argv)
    import torch

    # One core a thread, as the goals say: torch's and Arrow's pools hold one thread (the
    # loader's workers are the threads that count).
    torch.set_num_threads(1)
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    results = {}
    conversion = "numpy" if kernel.library() is None else "kernels"
    with tempfile.TemporaryDirectory() as tmp:
        for name, multi_hot in (("criteo_shaped", False), ("multi_hot", True)):
            # ~50 ids a bag: a twentieth of the rows (and of a row group's) keeps the bytes close.
            rows = args.rows if not multi_hot else max(1, args.rows // 20)
            group_rows = args.row_group_rows if not multi_hot else max(1, args.row_group_rows // 20)
            directory = write_table(os.path.join(tmp, name), rows, multi_hot, group_rows)
            columns = pq.ParquetFile(os.path.join(directory, "part-0.parquet")).schema_arrow.names
            limit = pyarrow_rows_per_sec(directory, columns)
            ours = loader_rows_per_sec(directory, args.batch_size)
            two = loader_rows_per_sec(directory, args.batch_size, workers=2)
            job = job_reading(directory, args.batch_size)
            results[name] = {
                "rows": rows,
                "pyarrow_rows_per_sec": limit,
                "loader_rows_per_sec": ours,
                "ratio": ours / limit,
                "loader_rows_per_sec_per_core": ours,
                "workers_2_rows_per_sec": two,
                "workers_2_rows_per_sec_per_core": two / 2,
                "workers_2_speedup": two / ours,
                **job,
                "conversion": conversion,
            }
            print(
                f"{name}: pyarrow {limit:,.0f} rows/s, loader {ours:,.0f} rows/s, ratio {ours / limit:.2f}x "
                f"(goal >= 1.0x; {conversion}); 2 workers {two:,.0f} rows/s ({two / 2:,.0f} a core), {two / ours:.2f}x "
                f"one (goal >= 1.8x); a 2-rank job decodes {job['decoded_rows_per_split_row']:.2f} rows per row of "
                f"the split (goal 1.0; pyarrow reads {job['read_rows_per_split_row']:.3f})"
            )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
