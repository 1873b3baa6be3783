"""data.parquet.history_checks: a history column of the wrong type, and a history holding the
row's own future, refused in one line; what data.histories writes passes."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.errors import BadInput
from data.histories import HistoryFlags, build_histories
from data.parquet.files import list_files, read_footers, read_row_group
from data.parquet.history_checks import FirstEventTimes, check_history_row_group, check_history_type


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    """A day-partitioned log of 3 users and 5 items at whole seconds (ties), labels 0/1,
    and its histories."""
    root = tmp_path_factory.mktemp("log")
    rng = np.random.default_rng(3)
    for day in range(2):
        n = 40
        seconds = np.sort(rng.integers(0, 20, n)) + day * 86_400
        folder = root / "in" / f"date=2026-11-0{day + 1}"
        folder.mkdir(parents=True)
        table = pa.table(
            {
                "ts": pa.array(seconds * 1000, pa.timestamp("ms")),
                "user": pa.array(rng.integers(0, 3, n)),
                "item": pa.array([f"film{i}" for i in rng.integers(0, 5, n)]),
                "label": pa.array(rng.integers(0, 2, n), pa.int8()),
            }
        )
        pq.write_table(table, folder / "part-0.parquet", row_group_size=15)
    build_histories(HistoryFlags(str(root / "in"), str(root / "out"), "user", "item", "ts", "label", max_history=5))
    first = FirstEventTimes.from_parquet(str(root / "in"), "user", "item", "ts", "label")
    return str(root / "out"), first


def row_groups(path):
    filesystem, root, files = list_files(path)
    footers, _, schema = read_footers(filesystem, root, files)
    for footer in footers:
        for g in range(len(footer.row_group_rows)):
            yield footer, g, read_row_group(filesystem, footer, schema, g, schema.names)


def test_histories_data_histories_writes_pass(log):
    path, first = log
    checked = 0
    for footer, g, table in row_groups(path):
        check_history_type(table.schema, "item_history", "item", footer.path)
        check_history_row_group(footer, g, table, "item_history", "user", "ts", first)
        checked += table.num_rows
    assert checked == 80


def with_own_item(table: pa.Table) -> pa.Table:
    """Each row's history with the row's own item added last: the classic leak."""
    histories = [h + [i] for h, i in zip(table.column("item_history").to_pylist(), table.column("item").to_pylist())]
    index = table.schema.get_field_index("item_history")
    return table.set_column(index, "item_history", pa.array(histories, pa.list_(pa.string())))


def test_a_history_holding_the_rows_own_event_names_file_row_group_row_and_column(log):
    path, first = log
    found = None
    for footer, g, table in row_groups(path):
        try:
            check_history_row_group(footer, g, with_own_item(table), "item_history", "user", "ts", first)
        except BadInput as e:
            found = (footer, g, table, str(e))
            break
    assert found is not None
    footer, g, table, line = found
    # the first leaking row by brute force: the user's first positive event of its item is not earlier
    source = pq.read_table(os.path.join(os.path.dirname(path), "in")).to_pylist()
    firsts: dict = {}
    for event in source:
        if event["label"] == 1:
            key = (event["user"], event["item"])
            firsts[key] = min(firsts.get(key, event["ts"]), event["ts"])
    rows = table.to_pylist()
    leaking = [r for r, row in enumerate(rows) if firsts.get((row["user"], row["item"]), row["ts"]) >= row["ts"]]
    leaking = [r for r in leaking if (rows[r]["user"], rows[r]["item"]) in firsts]
    assert leaking, rows
    row = leaking[0]
    expected = f"{footer.path}: row group {g}, row {footer.first_row(g) + row}, column item_history: item 'film"
    assert line.startswith(expected), line
    assert "not before the row's time" in line and "\n" not in line


def test_a_pair_the_log_does_not_hold_passes(log):
    path, first = log
    footer, g, table = next(row_groups(path))
    index = table.schema.get_field_index("item_history")
    older = table.set_column(index, "item_history", pa.array([["from_last_year"]] * table.num_rows))
    check_history_row_group(footer, g, older, "item_history", "user", "ts", first)


@pytest.mark.parametrize(
    "history, item, message",
    [
        (pa.int64(), pa.int64(), "column item_history is int64, but a history column is a list of item's ids"),
        (pa.list_(pa.string()), pa.int64(), "column item_history holds string, but item, whose embedding"),
        (pa.large_list(pa.int64()), pa.string(), "holds int64, but item, whose embedding table it shares, is string"),
    ],
)
def test_wrong_history_types_are_one_line(history, item, message):
    schema = pa.schema([("item", item), ("item_history", history)])
    with pytest.raises(BadInput) as e:
        check_history_type(schema, "item_history", "item", "lake/part-0.parquet")
    assert str(e.value).startswith("lake/part-0.parquet: ") and message in str(e.value)


def test_integer_widths_and_large_lists_are_the_same_ids():
    schema = pa.schema([("item", pa.int32()), ("item_history", pa.large_list(pa.int64()))])
    check_history_type(schema, "item_history", "item", "x.parquet")


def test_first_event_times_counts_only_positives(tmp_path):
    table = pa.table({"u": [1, 1, 1], "i": [5, 5, 6], "t": [3, 1, 2], "ok": [True, False, None]})
    pq.write_table(table, tmp_path / "a.parquet")
    first = FirstEventTimes.from_parquet(str(tmp_path), "u", "i", "t", "ok")
    assert first.lookup(pa.array([1, 1, 2]), pa.array([5, 6, 5])).tolist()[0] == 3
    every = FirstEventTimes.from_parquet(os.path.join(tmp_path, "a.parquet"), "u", "i", "t")
    assert every.lookup(pa.array([1, 1]), pa.array([5, 6])).tolist() == [1, 2]
