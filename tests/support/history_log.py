"""A tiny click log with a history column, as a user makes one: python -m
data.synthetic_histories, then python -m data.histories (both called in-process).

Day-partitioned (Hive ``date=``), two files a day of uneven row groups, timestamp ``ts``,
``label``, ``user_id``, ``item_id``, ``category`` and ``item_id_history`` (the user's earlier
clicked items, newest last, at most ``max_history``)."""

import glob
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq

from data.histories import HistoryFlags, build_histories
from data.synthetic_histories import SyntheticHistoriesSpec, generate_synthetic_histories

HISTORY, ITEM, USER, TIME = "item_id_history", "item_id", "user_id", "ts"
ROW_GROUP_ROWS = 23


def write_history_log(root: str, days: int = 4, rows_per_day: int = 100, max_history: int = 8, seed: int = 0) -> str:
    """Writes the raw log under ``root``/raw and the log with histories under
    ``root``/log; returns the latter."""
    raw, log = os.path.join(root, "raw"), os.path.join(root, "log")
    spec = SyntheticHistoriesSpec(
        days=days,
        rows_per_day=rows_per_day,
        files_per_day=2,
        row_group_rows=ROW_GROUP_ROWS,
        users=12,
        items=40,
        categories=4,
        seed=seed,
    )
    generate_synthetic_histories(spec, raw)
    build_histories(HistoryFlags(raw, log, USER, ITEM, TIME, "label", max_history=max_history))
    return log


def leaking_copy(log: str, copy: str, file: int = 3) -> tuple[str, int, int]:
    """Copies the log to ``copy`` and adds to every history of its ``file``-th file the row's
    own item (the classic leak). Returns (that file, the row group and row of its first row
    whose user first had its item at the row's own time: the first one a check refuses)."""
    shutil.copytree(log, copy)
    path = sorted(glob.glob(os.path.join(copy, "*", "*.parquet")))[file]
    table = pq.read_table(path, partitioning=None)
    histories = [h + [i] for h, i in zip(table.column(HISTORY).to_pylist(), table.column(ITEM).to_pylist())]
    index = table.schema.get_field_index(HISTORY)
    pq.write_table(
        table.set_column(index, HISTORY, pa.array(histories, pa.list_(pa.int64()))), path, row_group_size=ROW_GROUP_ROWS
    )
    first: dict = {}
    for event in pq.read_table(copy, columns=[USER, ITEM, TIME]).to_pylist():
        key = (event[USER], event[ITEM])
        first[key] = min(first.get(key, event[TIME]), event[TIME])
    rows = table.to_pylist()
    row = next(r for r, e in enumerate(rows) if first[(e[USER], e[ITEM])] >= e[TIME])
    return path, row // ROW_GROUP_ROWS, row
