"""A tiny click log with a history column, as a user makes one: python -m
data.synthetic_histories, then python -m data.histories (both called in-process).

Day-partitioned (Hive ``date=``), two files a day of uneven row groups, timestamp ``ts``,
``label``, ``user_id``, ``item_id``, ``category`` and ``item_id_history`` (the user's earlier
clicked items, newest last, at most ``max_history``)."""

import os

from data.histories import HistoryFlags, build_histories
from data.synthetic_histories import SyntheticHistoriesSpec, generate_synthetic_histories

HISTORY, ITEM, USER, TIME = "item_id_history", "item_id", "user_id", "ts"


def write_history_log(root: str, days: int = 4, rows_per_day: int = 100, max_history: int = 8, seed: int = 0) -> str:
    """Writes the raw log under ``root``/raw and the log with histories under
    ``root``/log; returns the latter."""
    raw, log = os.path.join(root, "raw"), os.path.join(root, "log")
    spec = SyntheticHistoriesSpec(
        days=days,
        rows_per_day=rows_per_day,
        files_per_day=2,
        row_group_rows=23,
        users=12,
        items=40,
        categories=4,
        seed=seed,
    )
    generate_synthetic_histories(spec, raw)
    build_histories(HistoryFlags(raw, log, USER, ITEM, TIME, "label", max_history=max_history))
    return log
