"""The compiled column kernels (data/parquet/kernel.py, data/parquet/native/columns.c) against
the numpy reference they replace (DLRM_PARQUET_KERNEL=numpy), bit for bit: keys, embedding
rows, bag lengths, dense values and nulls, and the same refusals with the same message,
on random strings, ints of every width, nulls, lists with null entries, sliced and
chunked arrays, several seeds and table sizes; and the numpy fallback without the library."""

import shutil

import numpy as np
import pyarrow as pa
import pytest

from data.parquet import kernel
from data.parquet.columns import ColumnValueError, ParquetColumns
from data.parquet.id_collisions import CollisionCounter

INTEGER_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
STRING_TYPES = [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()]


@pytest.fixture(autouse=True)
def built(monkeypatch):
    """The kernels must be built where a C compiler is (make install builds them)."""
    monkeypatch.delenv(kernel.ENVIRONMENT, raising=False)
    if kernel.library() is None:
        if shutil.which("cc") is None:
            pytest.skip("no C compiler: the kernels cannot be built here")
        pytest.fail("the Parquet column kernels are not built: run `make native-data`")


def _both(monkeypatch, convert):
    """convert() with the kernels, then with the numpy reference."""
    fast = convert()
    monkeypatch.setenv(kernel.ENVIRONMENT, "numpy")
    assert kernel.library() is None
    slow = convert()
    monkeypatch.delenv(kernel.ENVIRONMENT)
    return fast, slow


def _same(fast, slow) -> None:
    assert fast.dense.dtype == slow.dense.dtype == np.float32
    assert fast.dense.shape == slow.dense.shape
    assert (fast.dense.view(np.uint32) == slow.dense.view(np.uint32)).all()  # bit for bit, -0.0 too
    assert fast.dense_nulls.tolist() == slow.dense_nulls.tolist()
    assert (fast.lengths == slow.lengths).all()
    for mine, theirs in zip(fast.ids, slow.ids, strict=True):
        assert mine.dtype == theirs.dtype == np.int64 and (mine == theirs).all()
    assert slow.flat_ids is None
    if fast.flat_ids is not None:  # every feature through the kernels: their ids back to back
        assert (fast.flat_ids == np.concatenate(slow.ids if slow.ids else [np.zeros(0, np.int64)])).all()
    for mine, theirs in zip(fast.keys, slow.keys, strict=True):
        assert mine.dtype == theirs.dtype == np.uint64 and (mine == theirs).all()
    for keys, listed in zip(fast.keys, fast.distinct_keys or fast.keys, strict=True):
        assert set(keys.tolist()) == set(listed.tolist())  # what the id counters take: the same set
    if slow.labels is not None:
        assert (fast.labels == slow.labels).all()


def _strings(rng, n: int, binary: bool) -> list:
    """Empty, ASCII, non-ASCII and long values."""
    alphabet = list("abcXYZ019 _-") + ["é", "ß", "日本", "🙂", "\x00"]
    values = []
    for _ in range(n):
        length = int(rng.choice([0, 1, 8, 8, 8, 13, 300]))
        text = "".join(rng.choice(alphabet, size=length))
        values.append(text.encode() if binary else text)
    return values


def _integers(rng, t: pa.DataType, n: int) -> np.ndarray:
    info = np.iinfo(t.to_pandas_dtype())
    extremes = np.array([info.min, info.max, 0, 1, info.max - 1] + ([-1] if info.min < 0 else []), dtype=info.dtype)
    values = rng.integers(info.min, info.max, n, dtype=info.dtype, endpoint=True)
    values[: len(extremes)] = extremes
    return values


def _nulls(rng, n: int, share: float) -> np.ndarray:
    return rng.random(n) < share


def _flat(rng, t: pa.DataType, n: int, null_share: float) -> pa.Array:
    mask = _nulls(rng, n, null_share)
    if t in STRING_TYPES:
        return pa.array(_strings(rng, n, pa.types.is_binary(t) or pa.types.is_large_binary(t)), t, mask=mask)
    return pa.array(_integers(rng, t, n), t, mask=mask)


def _lists(rng, t: pa.DataType, n: int, large: bool) -> pa.Array:
    """Lists of 0-5 ids, some lists null, some elements null."""
    lengths = rng.integers(0, 6, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = _flat(rng, t, int(offsets[-1]), 0.2)
    mask = pa.array(_nulls(rng, n, 0.15))
    cls = pa.LargeListArray if large else pa.ListArray
    return cls.from_arrays(pa.array(offsets, pa.int64() if large else pa.int32()), values, mask=mask)


def _dense(rng, t: pa.DataType, n: int) -> pa.Array:
    mask = _nulls(rng, n, 0.1)
    if pa.types.is_floating(t):
        values = np.concatenate(
            [[-0.0, 0.0, -1e30, 1e30, 1e-40, -5.0], rng.exponential(10, n) * rng.choice([-1, 1], n)]
        )
        if t == pa.float16():
            values = np.clip(values, -6e4, 6e4)
        return pa.array(values[:n].astype(t.to_pandas_dtype()), t, mask=mask)
    return pa.array(_integers(rng, t, n), t, mask=mask)


def _table(seed: int, n: int = 300) -> tuple[pa.Table, list[str], list[str]]:
    rng = np.random.default_rng(seed)
    columns = {"label": pa.array(rng.integers(0, 2, n), pa.int8())}
    dense, sparse = [], []
    for t in [pa.float32(), pa.float64(), pa.float16()] + INTEGER_TYPES:
        dense.append(f"d_{t}")
        columns[dense[-1]] = _dense(rng, t, n)
    for t in STRING_TYPES + INTEGER_TYPES:
        sparse.append(f"s_{t}")
        columns[sparse[-1]] = _flat(rng, t, n, 0.1)
    for t, large in [(pa.int64(), False), (pa.string(), True), (pa.uint16(), True), (pa.large_binary(), False)]:
        sparse.append(f"l_{t}_{large}")
        columns[sparse[-1]] = _lists(rng, t, n, large)
    sparse.append("dictionary")
    columns["dictionary"] = _flat(rng, pa.string(), n, 0.1).dictionary_encode()
    sparse.append("dictionary_list")
    inner = _flat(rng, pa.int32(), 3 * n, 0.1).dictionary_encode()
    columns["dictionary_list"] = pa.ListArray.from_arrays(pa.array(np.arange(0, 3 * n + 1, 3), pa.int32()), inner)
    return pa.table(columns), dense, sparse


def _chunked(table: pa.Table, cuts: list[int]) -> pa.Table:
    """The table as chunks cut at ``cuts``, each chunk itself a slice (a non-zero offset)."""
    bounds = [0, *cuts, table.num_rows]
    return pa.concat_tables([table.slice(a, b - a) for a, b in zip(bounds, bounds[1:])])


# Every seed and every table size, each transform (a case costs most of a second).
CASES = [
    (0, 1, "log1p"),
    (7, 1000, "none"),
    (2**64 - 1, 2**33 + 7, "log1p"),
    (7, 2**63 - 1, "none"),
]


@pytest.mark.parametrize("seed,table_size,transform", CASES)
def test_the_kernels_convert_as_the_reference_bit_for_bit(monkeypatch, seed, table_size, transform):
    table, dense, sparse = _table(seed % 1000 + table_size % 97)
    columns = ParquetColumns(
        "label", tuple(dense), tuple(sparse), (table_size,) * len(sparse), None, transform, "hash", seed
    )
    for rows in (table, table.slice(37, 200), _chunked(table, [1, 50, 51, 190]), table.slice(5, 0)):
        _same(*_both(monkeypatch, lambda rows=rows: columns.convert(rows)))


@pytest.mark.parametrize("table_size", [1, 1000, 2**40])
def test_modulo_ids_as_the_reference(monkeypatch, table_size):
    rng = np.random.default_rng(table_size)
    n = 200
    data = {"label": pa.array(np.zeros(n, np.int8))}
    for t in INTEGER_TYPES:
        top = min(int(np.iinfo(t.to_pandas_dtype()).max), 2**63 - 1)  # not negative, as int64 too
        values = rng.integers(0, top, n, dtype=t.to_pandas_dtype(), endpoint=True)
        values[:2] = [0, top]
        data[f"s_{t}"] = pa.array(values, t, mask=_nulls(rng, n, 0.1))
    data["list"] = _lists(rng, pa.uint32(), n, False)
    sparse = tuple(name for name in data if name != "label")
    columns = ParquetColumns("label", (), sparse, (table_size,) * len(sparse), id_hashing="modulo")
    table = pa.table(data)
    for rows in (table, _chunked(table, [3, 120])):
        _same(*_both(monkeypatch, lambda rows=rows: columns.convert(rows)))


def _refusal(convert) -> str:
    with pytest.raises(ColumnValueError) as caught:
        convert()
    return f"{caught.value.column}|{caught.value.row}|{caught.value}"


@pytest.mark.parametrize("kind", ["nan", "inf", "-inf", "negative id", "uint64 past int64", "negative in a list"])
def test_the_same_value_is_refused_with_the_same_line(monkeypatch, kind):
    """Convert and check_values refuse the first bad value of a chunked block as the
    reference does: same column, same row, same message."""
    n = 40
    dense = np.arange(n, dtype=np.float64)
    ids = np.arange(n, dtype=np.int64)
    lists = pa.array([[1, 2]] * n, pa.list_(pa.int64()))
    if kind in ("nan", "inf", "-inf"):
        dense[23] = float(kind)
        dense[31] = np.nan
    elif kind == "negative id":
        ids[29], ids[33] = -5, -1
    elif kind == "uint64 past int64":
        ids = ids.astype(np.uint64)
        ids[17] = 2**63 + 9
    else:
        lists = pa.array([[1, 2]] * 20 + [[None, 3, -4]] + [[1]] * 19, pa.list_(pa.int64()))
    table = pa.table({"label": pa.array(np.ones(n, np.int8)), "d": dense, "i": ids, "l": lists})
    table = _chunked(table, [10, 22])
    columns = ParquetColumns("label", ("d",), ("i", "l"), (100, 100), id_hashing="modulo")
    for convert in (lambda: columns.convert(table), lambda: columns.check_values(table)):
        fast, slow = _both(monkeypatch, lambda convert=convert: _refusal(convert))
        assert fast == slow


@pytest.mark.parametrize("cap", [500, 2**16])
def test_the_collision_counts_are_the_references(monkeypatch, cap):
    """The kernels' hash set per feature against the reference's sorted array: exact under
    the cap, sampled past it, with repeated keys and the key 2**64 - 1 (the empty slot's value)."""
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 2**64 - 1, 30_000, dtype=np.uint64, endpoint=True)
    keys = np.concatenate([keys, keys[:5000], np.array([2**64 - 1, 0, 2**64 - 1], dtype=np.uint64)])

    def statistics():
        counter = CollisionCounter(["f", "g"], [3000, 70_000], "hash", 7, exact_cap=cap)
        for part in np.array_split(keys, 7):
            counter.add([part, part[::3]])
        return counter.statistics()

    fast, slow = _both(monkeypatch, statistics)
    assert fast == slow and fast["f"]["exact"] == (cap > 30_000)


def test_without_the_library_numpy_converts_and_says_so_once(monkeypatch, tmp_path, capsys):
    table, dense, sparse = _table(1, 50)
    columns = ParquetColumns("label", tuple(dense), tuple(sparse), (97,) * len(sparse))
    built = columns.convert(table)
    monkeypatch.setattr(kernel, "LIBRARY", str(tmp_path / "libdlrm_columns.so"))
    monkeypatch.setattr(kernel, "_library", None)
    monkeypatch.setattr(kernel, "_missing", None)
    capsys.readouterr()
    for _ in range(2):
        _same(built, columns.convert(table))
    assert kernel.library() is None
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "converting with numpy" in lines[0] and "make native-data" in lines[0], lines


def test_the_seen_id_filters_set_the_references_bits(monkeypatch):
    """columns.c's dlrm_bloom_add sets exactly the bits data/parquet/id_sketch.py's numpy
    `_positions` places, for filters of one block to millions of bits."""
    from data.parquet.id_sketch import SeenIds

    rng = np.random.default_rng(3)
    sizes = [1, 1000, 70_000, 3_000_000]
    keys = [rng.integers(0, 2**64, 20_000, dtype=np.uint64) for _ in sizes]
    compiled, reference = _both(monkeypatch, lambda: _filled(SeenIds([f"f{i}" for i in sizes], sizes), keys))
    assert all((a == b).all() for a, b in zip(compiled, reference)) and all(a.any() for a in compiled)


def test_the_seen_id_filters_set_the_references_bits_in_short_and_repeated_adds(monkeypatch):
    """Fewer keys than the kernel prefetches ahead, keys added again (they write nothing)
    and repeated within a call: the same bits as the reference."""
    from data.parquet.id_sketch import SeenIds

    rng = np.random.default_rng(4)
    sizes = [1000, 3_000_000]
    keys = [rng.integers(0, 2**64, 100, dtype=np.uint64) for _ in sizes]

    def adds(seen):
        for part in ([k[:1] for k in keys], [k[:31] for k in keys], [np.repeat(k[20:90], 3) for k in keys], keys):
            seen.add(part)
        return seen.packed()

    compiled, reference = _both(monkeypatch, lambda: adds(SeenIds([f"f{i}" for i in sizes], sizes)))
    assert all((a == b).all() for a, b in zip(compiled, reference)) and all(a.any() for a in compiled)


def _filled(seen, keys):
    seen.add(keys)
    return seen.packed()
