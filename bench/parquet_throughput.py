"""Parquet loader speed against pyarrow's own read of the same columns (the limit).

Writes three tables, then measures in the same run (one rank of one):
- pyarrow's own read: every row group of the table, the same columns, into Arrow,
  as pyarrow reads by default (``ParquetFile.read_row_group``: strings materialised,
  not dictionary-encoded), its thread pool of one thread, rows/s;
- our loader: the rows/s the training loader (data.parquet.loader.ParquetLoader:
  reading, hashing, transform, id counters, KJT batches) hands to training, with one
  worker (``ratio``: over pyarrow's) and with two (``workers_2_speedup``: over one); a
  worker reads and converts its own batches, so N workers use N cores:
  ``*_rows_per_sec_per_core`` is the rows/s over the workers;
- a 2-rank job's reading of the training split, from the readers' own counters:
  ``decoded_rows_per_split_row`` (rows both ranks converted / the split's rows; 2.0
  when every rank checked the whole global batch) and ``read_rows_per_split_row`` (rows
  of the row groups pyarrow decoded: a row group two ranks' shares straddle counts twice).
Tables: Criteo-shaped (label, 13 dense floats, 26 string ids, every id drawn uniformly
from 2**31: a row group's ids nearly all distinct, the worst case for anything that
works per distinct value), Criteo-skewed (the same columns, each column's ids drawn
from as many values as Criteo's Kaggle day has for it, 3 to 10.1 million, with the
frequency of the i-th most frequent one proportional to 1/i, as click logs' ids are:
each row group's dictionary holds a part of its values) and multi-hot (label, 13 dense,
4 list columns of 1-100 int64 ids; a twentieth of the rows, but at least `MIN_BATCHES`
batches' rows: an epoch of 3 full batches and a partial one, as 262,144 rows gave it, held two
workers to 1.55x one however fast each was). The loader reads string id columns
dictionary-encoded while a row group holds few distinct values
(data/parquet/loader.py DICTIONARY_SHARE); ``plain_rows_per_sec`` is its rows/s with
that off (``read_dictionary=False``). ``cpu_ratio`` (and ``plain_cpu_ratio``) compare
the rows per CPU second of the process (every thread's) instead: steadier than the
rows/s on a busy machine. ``--rounds N`` alternates the measurements N times and takes
each figure's median (``ratios``: each round's ratio). Prints each figure, which conversion ran
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
# Distinct values of each categorical column of Criteo's Kaggle display-advertising day
# (C1 ... C26), as the DLRM reference and TorchRec's Criteo tools size its tables.
CRITEO_KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
TABLES = ("criteo_shaped", "criteo_skewed", "multi_hot")
# The multi-hot table's rows are at least this many batches' (its training split about
# 31): N workers finish an epoch of B equal batches in ceil(B / N) batches' time at best,
# so few batches bound `workers_2_speedup`.
MIN_BATCHES = 32


def skewed_ids(rng: np.random.Generator, cardinality: int, rows: int, column: int) -> pa.Array:
    """``rows`` 8-hex-digit string ids of one of ``cardinality`` values, the i-th most
    frequent drawn with probability proportional to 1/i (i = floor(cardinality ** u),
    u uniform): a click log's heavy head and long tail."""
    rank = np.floor(np.power(float(cardinality), rng.random(rows))).astype(np.uint64) - np.uint64(1)
    values = (rank * np.uint64(2654435761) + np.uint64(97 * column)) % np.uint64(2**32)  # distinct per rank
    return pa.array([f"{v:08x}" for v in values.tolist()])


def write_table(
    directory: str, rows: int, multi_hot: bool, row_group_rows: int, seed: int = 0, skewed: bool = False
) -> str:
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
    elif skewed:
        for i, cardinality in enumerate(CRITEO_KAGGLE_CARDINALITIES):
            columns[f"C{i + 1}"] = skewed_ids(rng, cardinality, rows, i)
    else:
        for i in range(NUM_STRING_IDS):
            columns[f"C{i + 1}"] = pa.array([f"{v:08x}" for v in rng.integers(0, 2**31, rows)])
    os.makedirs(directory, exist_ok=True)
    pq.write_table(pa.table(columns), os.path.join(directory, "part-0.parquet"), row_group_size=row_group_rows)
    return directory


def pyarrow_rows_per_sec(directory: str, columns: list) -> tuple[float, float]:
    """(rows/s, rows per CPU second of the process) of pyarrow reading every row group
    of the table's columns."""
    path = os.path.join(directory, "part-0.parquet")
    start, cpu, rows = time.perf_counter(), time.process_time(), 0
    parquet = pq.ParquetFile(path)
    for group in range(parquet.num_row_groups):
        rows += parquet.read_row_group(group, columns=columns).num_rows
    return rows / (time.perf_counter() - start), rows / (time.process_time() - cpu)


def _train_loader(
    directory: str, batch_size: int, workers: int, rank: int = 0, world_size: int = 1, dictionary: bool = True
) -> Any:
    """The training split's loader of one rank, as a run builds it (one process on CPU);
    without ``dictionary``, string ids read plain."""
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
    sizes = [1_000_000] * len(source.describe().sparse_feature_names)
    loader: Any = source.loaders(dataset, sizes, rank, world_size)["train"]
    if not dictionary:
        loader.read_dictionary = False  # a ParquetLoader's
    return loader


def loader_rows_per_sec(
    directory: str, batch_size: int, workers: int = 1, dictionary: bool = True
) -> tuple[float, float]:
    """(rows/s, rows per CPU second of the process: every thread's) of the training
    loader's batches in its second pass (one rank of one)."""
    loader = _train_loader(directory, batch_size, workers, dictionary=dictionary)
    for _ in loader:  # warm-up pass: imports torchrec's batch types (each pass reads the files anew)
        pass
    start, cpu, rows = time.perf_counter(), time.process_time(), 0
    for batch in loader:
        rows += batch.labels.numel()
    return rows / (time.perf_counter() - start), rows / (time.process_time() - cpu)


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

    rows: int = flag(
        1_000_000, help="rows of the one-hot table (the multi-hot one has a twentieth, at least 32 batches' rows)"
    )
    batch_size: int = flag(4096, help="rows per batch read")
    row_group_rows: int = flag(
        128 * 1024, help="rows per Parquet row group of the one-hot table (a twentieth multi-hot)"
    )
    tables: str = flag(",".join(TABLES), help=f"the tables measured, comma-separated (of {', '.join(TABLES)})")
    rounds: int = flag(1, help="measurements of each figure, alternated; each figure the median")


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
    chosen = [t.strip() for t in args.tables.split(",") if t.strip()]
    unknown = sorted(set(chosen) - set(TABLES))
    if unknown:
        raise SystemExit(f"--tables {','.join(unknown)}: no such table (of {', '.join(TABLES)})")
    with tempfile.TemporaryDirectory() as tmp:
        for name in chosen:
            multi_hot = name == "multi_hot"
            # ~50 ids a bag: a twentieth of the rows (and of a row group's) keeps the bytes close.
            rows = args.rows if not multi_hot else max(args.rows // 20, MIN_BATCHES * args.batch_size)
            group_rows = args.row_group_rows if not multi_hot else max(1, args.row_group_rows // 20)
            directory = write_table(
                os.path.join(tmp, name), rows, multi_hot, group_rows, skewed=name == "criteo_skewed"
            )
            columns = pq.ParquetFile(os.path.join(directory, "part-0.parquet")).schema_arrow.names
            # Rounds alternate the figures, so that a busy machine's load weighs on each alike.
            # Each figure (rows/s, rows per CPU second): on a busy machine the CPU-time ratio
            # (``cpu_ratio``: the process's, every thread) is the steadier one.
            figures: dict[str, list[tuple[float, float]]] = {"limit": [], "ours": [], "plain": [], "two": []}
            for _ in range(args.rounds):
                figures["limit"].append(pyarrow_rows_per_sec(directory, columns))
                figures["ours"].append(loader_rows_per_sec(directory, args.batch_size))
                figures["plain"].append(loader_rows_per_sec(directory, args.batch_size, dictionary=False))
                figures["two"].append(loader_rows_per_sec(directory, args.batch_size, workers=2))
            limit, ours, plain, two = (
                float(np.median([f[0] for f in figures[k]])) for k in ("limit", "ours", "plain", "two")
            )
            cpu_limit, cpu_ours, cpu_plain = (
                float(np.median([f[1] for f in figures[k]])) for k in ("limit", "ours", "plain")
            )
            job = job_reading(directory, args.batch_size)
            results[name] = {
                "rows": rows,
                "pyarrow_rows_per_sec": limit,
                "loader_rows_per_sec": ours,
                "ratio": ours / limit,
                "ratios": [o[0] / p[0] for o, p in zip(figures["ours"], figures["limit"])],
                "cpu_ratio": cpu_ours / cpu_limit,
                "plain_cpu_ratio": cpu_plain / cpu_limit,
                "plain_rows_per_sec": plain,
                "plain_ratio": plain / limit,
                "loader_rows_per_sec_per_core": ours,
                "workers_2_rows_per_sec": two,
                "workers_2_rows_per_sec_per_core": two / 2,
                "workers_2_speedup": two / ours,
                **job,
                "conversion": conversion,
            }
            print(
                f"{name}: pyarrow {limit:,.0f} rows/s, loader {ours:,.0f} rows/s, ratio {ours / limit:.2f}x "
                f"(goal >= 1.0x; {conversion}; ids read plain {plain / limit:.2f}x; by CPU time "
                f"{cpu_ours / cpu_limit:.2f}x, plain {cpu_plain / cpu_limit:.2f}x); 2 workers {two:,.0f} rows/s "
                f"({two / 2:,.0f} a core), {two / ours:.2f}x one (goal >= 1.8x); a 2-rank job decodes "
                f"{job['decoded_rows_per_split_row']:.2f} rows per row of the split (goal 1.0; pyarrow reads "
                f"{job['read_rows_per_split_row']:.3f})"
            )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
