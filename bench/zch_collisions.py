"""Collision share of ``--id_hashing hash`` against torchrec's zero-collision modules
(models/zch.py) at the same table sizes, on a Parquet lake's training split; with
``--train_epochs N``, also the test AUROC of a model trained each way at those sizes.

Per sparse column (its table's rows: ``--table_fraction`` times the split's distinct
ids, at least 2), in the split's row order, in batches of ``--batch_size`` rows:

- hash: the share of the split's distinct ids whose row another of its ids also has
  (what the training log's collision line reports), and the share of its lookups that
  read such a row;
- zch: an unsharded `MCHManagedCollisionModule` (``--zch_eviction_policy``,
  ``--zch_eviction_interval``) trained on the batches; the share of the distinct ids not
  holding a row of their own at the end (they share the default row), and the share of
  the lookups that read the default row while streaming (ids not admitted yet or
  evicted).

With ``--train_epochs N`` (N > 0) it then trains ``dlrm_main.py`` twice on the lake
(``--id_hashing hash``, then ``zch``; every day but the last two trained on, the last two
validation and test, ``--num_embeddings_per_feature`` the sizes above, ``--dense_columns``
the numerical columns) and reports each run's test AUROC.

    python bench/zch_collisions.py --parquet_path /tmp/lake --time_column date \
        [--table_fraction 0.5] [--batch_size 1024] [--zch_eviction_interval 10] [--train_epochs 1]

Prints a table and one JSON line (the medians and the per-column figures).
"""

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq  # noqa: F401  (pyarrow.dataset needs the Parquet format registered)
import torch

from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from data.parquet.id_hashing import embedding_rows, zch_ids
from harness.id_benches import column_keys, train_small_model
from models.zch import ZchOptions, reserve_history


def _shared(rows: np.ndarray) -> np.ndarray:
    """Whether each element's value occurs more than once in ``rows``."""
    _, inverse, counts = np.unique(rows, return_inverse=True, return_counts=True)
    return counts[inverse] > 1


def hash_shares(keys: np.ndarray, rows: int, seed: int) -> tuple[float, float]:
    """(distinct share on shared rows, lookup share on shared rows) under the hash."""
    distinct, inverse = np.unique(keys, return_inverse=True)
    shared = _shared(embedding_rows(distinct, seed, rows))
    return float(shared.mean()), float(shared[inverse].mean())


def zch_shares(
    batches: list[np.ndarray], rows: int, seed: int, options: ZchOptions, batch_size: int
) -> tuple[float, float]:
    """(distinct share without a row at the end, lookup share on the default row)."""
    from torchrec.modules.mc_modules import LFU_EvictionPolicy, LRU_EvictionPolicy, MCHManagedCollisionModule
    from torchrec.sparse.jagged_tensor import JaggedTensor

    module = MCHManagedCollisionModule(
        zch_size=rows,
        device=torch.device("cpu"),
        eviction_policy=LFU_EvictionPolicy() if options.eviction_policy == "lfu" else LRU_EvictionPolicy(),
        eviction_interval=options.eviction_interval,
    )
    module.train()
    reserve_history(_Holder(module), max(len(b) for b in batches))
    default = rows - 1
    lookups = on_default = 0
    for keys in batches:
        ids = torch.from_numpy(zch_ids(keys, seed))
        out = module({"f": JaggedTensor(values=ids, lengths=torch.tensor([len(ids)]))})["f"].values()
        lookups += len(ids)
        on_default += int((out == default).sum())
    module.eval()
    distinct = torch.from_numpy(np.unique(zch_ids(np.concatenate(batches), seed)))
    out = module({"f": JaggedTensor(values=distinct, lengths=torch.tensor([len(distinct)]))})["f"].values()
    return float((out == default).float().mean()), on_default / lookups


class _Holder:
    """What `reserve_history` reads: a collection holding one module."""

    def __init__(self, module: torch.nn.Module) -> None:
        self._managed_collision_collection = self
        self._managed_collision_modules = {"f": module}


@dataclass
class ZchCollisionFlags:
    """The flags of ``python bench/zch_collisions.py``."""

    parquet_path: str = flag(help="the lake (Hive partitions become columns)")
    time_column: str = flag("date", help="its last value's rows (the test split) are left out")
    sparse_columns: str = flag("C*", help="comma list of the columns compared (a trailing * is a prefix)")
    table_fraction: float = flag(0.5, help="each table's rows: this times the column's distinct ids (at least 2)")
    batch_size: int = flag(1024, help="rows per training step")
    zch_eviction_policy: str = flag("lfu", choices=("lfu", "lru"), help="zch: lfu or lru")
    zch_eviction_interval: int = flag(10, help="zch: steps between admissions")
    hash_seed: int = flag(0, help="the seed of the hash")
    train_epochs: int = flag(0, help="train hash and zch models this many epochs and compare test AUROC (0: none)")
    dense_columns: str = flag("I*", help="the numerical columns of the trained models")
    work_dir: str = flag("data_cache/zch_collisions", help="where the trained runs' logs and checkpoints go")


def train_and_test(args: "ZchCollisionFlags", names: list[str], rows: list[int], mode: str) -> float:
    """The test AUROC of ``dlrm_main.py`` trained with ``--id_hashing mode`` at table sizes ``rows``."""
    import os

    from harness.launch import eval_record

    os.makedirs(args.work_dir, exist_ok=True)
    argv = [
        *("--parquet_path", args.parquet_path, "--time_column", args.time_column),
        *("--dense_columns", args.dense_columns, "--sparse_columns", ",".join(names), "--id_hashing", mode),
        *("--num_embeddings_per_feature", ",".join(map(str, rows)), "--hash_seed", str(args.hash_seed)),
        *("--batch_size", str(args.batch_size), "--epochs", str(args.train_epochs), "--allow_divergence"),
        *("--zch_eviction_policy", args.zch_eviction_policy),
        *("--zch_eviction_interval", str(args.zch_eviction_interval)),
    ]
    records = train_small_model("bench/zch_collisions.py", mode, argv, os.path.join(args.work_dir, f"{mode}.jsonl"))
    return float(eval_record(records, "test")["auroc"])


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), ZchCollisionFlags, argv)
    options = ZchOptions(args.zch_eviction_policy, args.zch_eviction_interval)
    options.check()
    table = ds.dataset(args.parquet_path, partitioning="hive").to_table()
    last = max(table.column(args.time_column).to_pylist())
    table = table.filter(ds.field(args.time_column) != last)
    patterns = args.sparse_columns.split(",")
    names = [
        c for c in table.column_names if any(c == p or (p.endswith("*") and c.startswith(p[:-1])) for p in patterns)
    ]
    all_keys, all_lengths = column_keys(table, names)
    result: dict = {"columns": {}}
    print(f"{'column':>8} {'distinct':>9} {'rows':>8}  hash ids/lookups  zch ids/lookups")
    for name, keys, lengths in zip(names, all_keys, all_lengths):
        distinct = len(np.unique(keys))
        rows = max(2, round(args.table_fraction * distinct))
        bounds = np.concatenate([[0], np.cumsum(lengths)])[:: args.batch_size]
        bounds = np.append(bounds, len(keys)) if bounds[-1] != len(keys) else bounds
        batches = [keys[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        hash_ids, hash_lookups = hash_shares(keys, rows, args.hash_seed)
        zch_ids_share, zch_lookups = zch_shares(batches, rows, args.hash_seed, options, args.batch_size)
        result["columns"][name] = {
            "distinct": distinct,
            "rows": rows,
            "hash": [hash_ids, hash_lookups],
            "zch": [zch_ids_share, zch_lookups],
        }
        print(
            f"{name:>8} {distinct:>9} {rows:>8}  {hash_ids:6.1%} {hash_lookups:6.1%}    {zch_ids_share:6.1%} "
            f"{zch_lookups:6.1%}"
        )
    figures = result["columns"].values()
    for mode in ("hash", "zch"):
        result[f"{mode}_median_ids"] = statistics.median(f[mode][0] for f in figures)
        result[f"{mode}_median_lookups"] = statistics.median(f[mode][1] for f in figures)
    if args.train_epochs > 0:
        sizes = [result["columns"][n]["rows"] for n in names]
        for mode in ("hash", "zch"):
            result[f"{mode}_test_auroc"] = train_and_test(args, names, sizes, mode)
        print(
            f"test AUROC at the same table sizes: hash {result['hash_test_auroc']:.4f}, zch {result['zch_test_auroc']:.4f}"
        )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
