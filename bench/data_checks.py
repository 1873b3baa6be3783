"""What the data value checks (data/batching/value_checks.py) cost, against the loader's own rate.

Writes a synthetic data set (2 training days + 1 eval day) and its split_binary copy,
then measures in the same run:

- at open (in memory, the default): the check of every file, against the time the
  in-memory loader of one rank (of 1) takes to read its rows;
- per batch (--mmap_mode): the memory-mapped loader's batches/s with and without
  its per-batch check, and the check of one batch alone, in microseconds.

    python bench/data_checks.py [--rows_per_day 500000] [--batch_size 1024]
"""

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.loader_throughput import loader_rate
from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from data.batching.value_checks import BatchValueCheck, check_value_files
from data.binary.criteo import CriteoBinaryDataset, CriteoBinaryLoader
from data.binary.split import SplitBinaryDataset
from data.criteo_feature_spec import criteo_to_split_binary
from data.synthetic_criteo import SyntheticCriteoSpec, generate_synthetic_criteo


def best_seconds(fn: Callable[[], object], repeats: int = 3) -> float:
    """The fastest of a few runs (the machine is shared)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(name: str, dataset, batch_size: int) -> dict[str, float]:
    common = dict(batch_size=batch_size, rank=0, world_size=1)
    rows = dataset.num_rows
    check_open = best_seconds(lambda: check_value_files(dataset.value_files()))
    load = best_seconds(lambda: CriteoBinaryLoader(dataset, "train", **common), repeats=2)
    checked = CriteoBinaryLoader(dataset, "train", mmap_mode=True, **common)
    unchecked = CriteoBinaryLoader(dataset, "train", mmap_mode=True, **common)
    unchecked._batch_check = None  # the same loader without its per-batch check
    rate_on = max(loader_rate(checked, 600) for _ in range(3))
    rate_off = max(loader_rate(unchecked, 600) for _ in range(3))
    batch = dataset.read(0, batch_size)
    check = BatchValueCheck(dataset.num_embeddings_per_feature)
    per_batch = best_seconds(lambda: [check.first_invalid_row(*batch) for _ in range(200)]) / 200
    result = {
        "open_check_seconds": check_open,
        "open_check_rows_per_sec": rows / check_open,
        "in_memory_load_seconds": load,
        "open_check_ratio_to_load": check_open / load,
        "mmap_batches_per_sec_checked": rate_on,
        "mmap_batches_per_sec_unchecked": rate_off,
        "mmap_check_slowdown": rate_off / rate_on - 1,
        "batch_check_us": per_batch * 1e6,
        "batch_check_share_of_batch_interval": per_batch * rate_off,
    }
    print(
        f"{name}: {rows:,} rows; at open the check takes {check_open:.3f} s ({rows / check_open / 1e6:.1f} M rows/s) "
        f"= {check_open / load:.2f} x the in-memory loader's own read ({load:.3f} s, train split)"
    )
    print(
        f"{name}: --mmap_mode {rate_on:.0f} batches/s checked vs {rate_off:.0f} unchecked; the check of one "
        f"{batch_size}-row batch takes {per_batch * 1e6:.0f} us = {per_batch * rate_off:.1%} of a batch interval"
    )
    return result


@dataclass
class DataChecksFlags:
    """The flags of ``python bench/data_checks.py``: what it measures and how."""

    rows_per_day: int = flag(500_000, help="rows of each of the 3 synthetic days read")
    batch_size: int = flag(1024, help="rows per batch read")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), DataChecksFlags, argv)
    with tempfile.TemporaryDirectory() as tmp:
        criteo, byo = os.path.join(tmp, "criteo"), os.path.join(tmp, "byo")
        generate_synthetic_criteo(
            SyntheticCriteoSpec(num_days=3, rows_per_day=args.rows_per_day, seed=2), criteo, show_progress=False
        )
        criteo_to_split_binary(criteo, byo)
        results = {
            "criteo_binary": measure("criteo_binary", CriteoBinaryDataset(criteo), args.batch_size),
            "split_binary": measure(
                "split_binary", SplitBinaryDataset(os.path.join(byo, "feature_spec.yaml")), args.batch_size
            ),
        }
    print(json.dumps({layout: {k: round(v, 4) for k, v in r.items()} for layout, r in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
