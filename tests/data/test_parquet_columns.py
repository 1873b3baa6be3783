"""Raw Parquet values to model inputs (data/parquet/columns.py, data/parquet/id_hashing.py),
against a row-by-row reference written from the documented recipe (docs/data.md):
what a user reimplements in their own pipeline must give the same rows."""

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import BadInput
from data.parquet.columns import ColumnValueError, ParquetColumns, resolve_column_patterns
from data.parquet.id_hashing import embedding_rows, integer_keys

MASK = 2**64 - 1


def _mix(z: int) -> int:
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & MASK
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def reference_row(value, seed: int, table_size: int) -> int:
    """The recipe, one value at a time in plain Python integers."""
    if isinstance(value, int):
        key = value & MASK
    else:
        key = 0xCBF29CE484222325
        for byte in value.encode() if isinstance(value, str) else value:
            key = ((key ^ byte) * 0x100000001B3) & MASK
    return _mix(key ^ _mix(seed & MASK)) % table_size


ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
texts = st.text(max_size=12)
seeds = st.integers(min_value=0, max_value=2**64 - 1)
sizes = st.integers(min_value=1, max_value=2**40)


@settings(max_examples=50, deadline=None)
@given(st.lists(ints, max_size=20), seeds, sizes)
def test_integer_ids_follow_the_recipe(values, seed, size):
    rows = embedding_rows(integer_keys(np.array(values, dtype=np.int64)), seed, size)
    assert rows.tolist() == [reference_row(v, seed, size) for v in values]


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "uint8", "uint32"])
def test_an_integer_hashes_alike_in_every_width(dtype):
    values = np.array([0, 1, 7, 100], dtype=dtype)
    assert (
        embedding_rows(integer_keys(values), 3, 97) == embedding_rows(integer_keys(values.astype(np.int64)), 3, 97)
    ).all()


def _bags(rows):
    """The reference conversion of a column's Python values: a null is an empty bag, a
    list's nulls are left out, a scalar is a bag of one."""
    bags = []
    for value in rows:
        if value is None:
            bags.append([])
        elif isinstance(value, list):
            bags.append([v for v in value if v is not None])
        else:
            bags.append([value])
    return bags


columns_of_ids = st.one_of(
    st.lists(st.one_of(st.none(), ints), min_size=1, max_size=8).map(lambda v: pa.array(v, pa.int64())),
    st.lists(st.one_of(st.none(), texts), min_size=1, max_size=8).map(lambda v: pa.array(v, pa.string())),
    st.lists(st.one_of(st.none(), texts), min_size=1, max_size=8).map(
        lambda v: pa.array(v, pa.string()).dictionary_encode()
    ),
    st.lists(st.one_of(st.none(), st.lists(st.one_of(st.none(), ints), max_size=4)), min_size=1, max_size=8).map(
        lambda v: pa.array(v, pa.list_(pa.int64()))
    ),
    st.lists(st.one_of(st.none(), st.lists(texts, max_size=4)), min_size=1, max_size=8).map(
        lambda v: pa.array(v, pa.large_list(pa.large_string()))
    ),
)


@settings(max_examples=60, deadline=None)
@given(columns_of_ids, seeds, st.integers(min_value=1, max_value=1000), st.integers(min_value=0, max_value=3))
def test_sparse_columns_become_the_recipes_bags(column, seed, size, split):
    """Every accepted id type, nulls, empty and null lists, a sliced and chunked column."""
    values = column.to_pylist()
    chunked = pa.chunked_array([column.slice(0, min(split, len(column))), column.slice(min(split, len(column)))])
    table = pa.table({"label": pa.array([0] * len(column), pa.int8()), "ids": chunked})
    spec = ParquetColumns(label="label", dense=(), sparse=("ids",), table_sizes=(size,), hash_seed=seed)
    spec.check_schema(table.schema, "t.parquet")
    converted = spec.convert(table)
    bags = _bags(values)
    assert converted.lengths[0].tolist() == [len(b) for b in bags]
    assert converted.ids[0].tolist() == [reference_row(v, seed, size) for b in bags for v in b]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.one_of(st.none(), st.floats(min_value=-1e6, max_value=1e6), st.integers(-1000, 10**6)),
        min_size=1,
        max_size=10,
    ),
    st.sampled_from(["log1p", "none"]),
)
def test_dense_values_nulls_and_transform(values, transform):
    column = pa.array([None if v is None else float(v) for v in values], pa.float64())
    table = pa.table({"label": pa.array([1] * len(values), pa.int64()), "x": column})
    spec = ParquetColumns(label="label", dense=("x",), sparse=(), table_sizes=(), dense_transform=transform)
    converted = spec.convert(table)
    expected = [0.0 if v is None else float(v) for v in values]
    if transform == "log1p":
        expected = [math.log1p(max(v, 0.0)) for v in expected]
    assert converted.dense[:, 0].tolist() == pytest.approx(expected, rel=1e-6, abs=1e-6)
    assert converted.dense_nulls.tolist() == [sum(v is None for v in values)]


@pytest.mark.parametrize(
    "column, values, message",
    [
        ("label", [0, 2, 1], "row 1 column label: label 2 is not 0 or 1"),
        ("label", [0, None, 1], "row 1 column label: label is null"),
        ("x", [1.0, 2.0, float("nan")], "row 2 column x: dense value nan is not finite"),
        ("x", [float("inf"), 2.0, 1.0], "row 0 column x: dense value inf is not finite"),
        ("w", [1.0, -1.0, 1.0], "row 1 column w: weight -1.0 is not finite and >= 0"),
    ],
)
def test_bad_values_name_the_row_and_column(column, values, message):
    data = {"label": [0, 1, 1], "x": [1.0, 2.0, 3.0], "w": [1.0, 1.0, 1.0], "c": ["a", "b", "c"]}
    data[column] = values
    spec = ParquetColumns(label="label", dense=("x",), sparse=("c",), table_sizes=(10,), weight="w")
    with pytest.raises(ColumnValueError, match=f"^{message}"):
        spec.convert(pa.table(data))


def test_negative_ids_refused_when_taken_modulo():
    table = pa.table({"label": [0, 1], "c": pa.array([[3], [5, -2]], pa.list_(pa.int64()))})
    spec = ParquetColumns(label="label", dense=(), sparse=("c",), table_sizes=(4,), id_hashing="modulo")
    with pytest.raises(ColumnValueError, match="^row 1 column c: id -2 is negative"):
        spec.convert(table)
    ok = pa.table({"label": [0, 1], "c": pa.array([[3], [5, 6]], pa.list_(pa.int64()))})
    assert spec.convert(ok).ids[0].tolist() == [3, 1, 2]


@pytest.mark.parametrize(
    "kind, role, message",
    [
        (pa.float64(), "sparse", "column c is double, but a sparse column holds integer or string ids"),
        (pa.string(), "dense", "column x is string, but a dense column holds integers or floats"),
        (pa.string(), "label", "column label is string, but a label column holds"),
    ],
)
def test_schemas_with_a_wrong_type_are_refused(kind, role, message):
    fields = {"label": pa.int64(), "x": pa.float32(), "c": pa.string()}
    fields[{"sparse": "c", "dense": "x", "label": "label"}[role]] = kind
    spec = ParquetColumns(label="label", dense=("x",), sparse=("c",), table_sizes=(10,))
    with pytest.raises(BadInput, match=f"^day.parquet: {message}"):
        spec.check_schema(pa.schema(fields), "day.parquet")


def test_a_missing_column_is_named():
    spec = ParquetColumns(label="label", dense=("x",), sparse=("c",), table_sizes=(10,))
    with pytest.raises(BadInput, match="^day.parquet: no column c \\(the sparse column; the file has label, x\\)"):
        spec.check_schema(pa.schema({"label": pa.int64(), "x": pa.float32()}), "day.parquet")


def test_column_patterns():
    names = ["label", "I1", "I2", "I10", "C1", "ts"]
    assert resolve_column_patterns(["I*"], names, "--dense_columns") == ("I1", "I2", "I10")
    assert resolve_column_patterns(["C1", "I2"], names, "--dense_columns") == ("C1", "I2")
    with pytest.raises(BadInput, match="^--sparse_columns D\\*: no such column"):
        resolve_column_patterns(["D*"], names, "--sparse_columns")
    with pytest.raises(BadInput, match="^--dense_columns: column I1 given twice"):
        resolve_column_patterns(["I*", "I1"], names, "--dense_columns")
