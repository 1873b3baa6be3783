"""History columns (--sequence_columns HIST:ITEM) as data/parquet/columns.py converts them:
each history id becomes the row of ITEM's table that the same value as a candidate gets
(same hash, seed and table size; the kernels and the numpy reference alike), a row keeps
its newest max_history ids in order, nulls are empty or left out; and a history column
that is not a list, or holds another kind of id than ITEM, is refused naming the file
and the column."""

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from common.errors import BadInput
from data.parquet import kernel
from data.parquet.columns import ColumnValueError, ParquetColumns

HISTORIES = [[3, 9, 4], None, [], [7, None, 8, 1, 2, 5], [11]]


def _columns(**changes) -> ParquetColumns:
    settings = {
        "label": "label",
        "dense": (),
        "sparse": ("user", "item"),
        "table_sizes": (13, 97),
        "sequences": (("item_history", "item"),),
        "max_history": 4,
        "hash_seed": 5,
    }
    return ParquetColumns(**{**settings, **changes})


def _table(histories=HISTORIES) -> pa.Table:
    n = len(histories)
    return pa.table(
        {
            "label": pa.array([0, 1] * (n // 2) + [0] * (n % 2), pa.int8()),
            "user": pa.array(range(n), pa.int64()),
            "item": pa.array(range(100, 100 + n), pa.int64()),
            "item_history": pa.array(histories, pa.list_(pa.int32())),
        }
    )


def _rows_of(values, columns: ParquetColumns) -> list[int]:
    """The rows of ``values`` as the item column's own values (one a row)."""
    table = pa.table({"label": pa.array([0] * len(values), pa.int8()), "user": [0] * len(values), "item": values})
    return _without_histories(columns).convert(table).ids[1].tolist()


def _without_histories(columns: ParquetColumns) -> ParquetColumns:
    return dataclasses.replace(columns, sequences=(), max_history=0)


@pytest.fixture(params=["kernels", "numpy"])
def implementation(request, monkeypatch):
    if request.param == "numpy":
        monkeypatch.setenv(kernel.ENVIRONMENT, "numpy")
    else:
        monkeypatch.delenv(kernel.ENVIRONMENT, raising=False)
        if kernel.library() is None:
            pytest.skip("the column kernels are not built (make native-data)")
    return request.param


def test_history_ids_are_the_items_rows_newest_kept_in_order(implementation):
    columns = _columns()
    rows = columns.convert(_table())
    assert columns.kjt_keys == ["user", "item", "item_history"]
    assert rows.lengths.shape == (3, 5)
    # Null history and empty history: 0; a null element left out, then the newest 4 of 5.
    assert rows.lengths[2].tolist() == [3, 0, 0, 4, 1]
    kept = [3, 9, 4, 8, 1, 2, 5, 11]
    assert rows.ids[2].tolist() == _rows_of(kept, columns)
    assert (
        rows.keys[2].tolist()
        == _without_histories(columns)
        .convert(pa.table({"label": pa.array([0] * 8, pa.int8()), "user": [0] * 8, "item": kept}))
        .keys[1]
        .tolist()
    )
    if rows.flat_ids is not None:  # cut: the batch builder concatenates the features again
        assert rows.flat_ids.tolist() == np.concatenate(rows.ids).tolist()


def test_untruncated_histories_keep_the_kernels_flat_ids(implementation):
    columns = _columns(max_history=6)
    rows = columns.convert(_table())
    assert rows.lengths[2].tolist() == [3, 0, 0, 5, 1]
    if implementation == "kernels":
        assert rows.flat_ids is not None and rows.flat_ids.tolist() == np.concatenate(rows.ids).tolist()


def test_string_histories_hash_as_the_item_strings_do_dictionary_or_not(implementation):
    histories = [["a", "b"], ["c"], None]
    columns = _columns(sparse=("item",), table_sizes=(1009,), max_history=2)
    table = pa.table(
        {
            "label": pa.array([0, 1, 0], pa.int8()),
            "item": pa.array(["x", "y", "z"]).dictionary_encode(),
            "item_history": pa.array(histories, pa.list_(pa.large_string())),
        }
    )
    columns.check_schema(table.schema, "t.parquet")
    rows = columns.convert(table)
    alone = pa.table({"label": pa.array([0] * 3, pa.int8()), "item": pa.array(["a", "b", "c"], pa.binary())})
    assert rows.ids[1].tolist() == _without_histories(columns).convert(alone).ids[0].tolist()


def test_table_keys_put_a_history_with_its_item():
    columns = _columns(sequences=(("item_history", "item"), ("other", "item")))
    keys = [np.array([1], np.uint64), np.array([2], np.uint64), np.array([3, 4], np.uint64), np.array([5], np.uint64)]
    assert [k.tolist() for k in columns.table_keys(keys)] == [[1], [2, 3, 4, 5]]
    assert "item_history" in columns.names and "other" in columns.names


def test_modulo_histories_are_ids_modulo_the_items_table_and_not_negative():
    columns = _columns(id_hashing="modulo", max_history=3)
    rows = columns.convert(_table([[96, 97, 200], [1]]))
    assert rows.ids[2].tolist() == [96, 0, 200 % 97, 1]
    with pytest.raises(ColumnValueError) as bad:
        columns.convert(_table([[1], [2, -3]]))
    assert (bad.value.row, bad.value.column) == (1, "item_history") and "-3 is negative" in bad.value.what


@pytest.mark.parametrize(
    "item_type, history_type, expected",
    [
        (pa.int64(), pa.int64(), "column item_history is int64, but a history column is a list of item's ids"),
        (pa.string(), pa.list_(pa.int64()), "column item_history holds int64, but item, whose embedding table"),
        (pa.int64(), pa.list_(pa.string()), "column item_history holds string, but item, whose embedding table"),
        (pa.int64(), pa.list_(pa.float64()), "column item_history holds double, but item"),
    ],
)
def test_a_history_column_of_the_wrong_type_is_refused_naming_the_file(item_type, history_type, expected):
    schema = pa.schema(
        [("label", pa.int8()), ("user", pa.int64()), ("item", item_type), ("item_history", history_type)]
    )
    with pytest.raises(BadInput) as bad:
        _columns().check_schema(schema, "day/part-0.parquet")
    message = str(bad.value)
    assert message.startswith(f"day/part-0.parquet: {expected}"), message
    assert "\n" not in message


def test_a_missing_history_column_is_refused():
    schema = pa.schema([("label", pa.int8()), ("user", pa.int64()), ("item", pa.int64())])
    with pytest.raises(BadInput, match=r"^f.parquet: no column item_history \(the history column of"):
        _columns().check_schema(schema, "f.parquet")


def test_widths_and_binary_do_not_matter():
    schema = pa.schema(
        [("label", pa.int8()), ("user", pa.int64()), ("item", pa.uint16()), ("item_history", pa.list_(pa.int64()))]
    )
    _columns().check_schema(schema, "f.parquet")
    schema = pa.schema(
        [("label", pa.int8()), ("user", pa.int64()), ("item", pa.string()), ("item_history", pa.list_(pa.binary()))]
    )
    _columns().check_schema(schema, "f.parquet")
