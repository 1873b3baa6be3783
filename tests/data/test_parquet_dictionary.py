"""String ids read dictionary-encoded (data/parquet/loader.py DICTIONARY_SHARE): the batches,
the seen-id filters and the collision counts are those of the plain read, bit for bit, on
dictionary pages, pages fallen back to plain encoding, nulls and lists with nulls. A chunk
whose footer shows it written plain or fallen back to plain pages is read plain from the
first (loader.plain_chunks); a column the footer could not tell, once a chunk shows it
mostly distinct."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.parquet import kernel
from data.parquet.columns import ParquetColumns
from data.parquet.id_collisions import CollisionCounter
from data.parquet.id_sketch import SeenIds, seen_ids_counter
from data.parquet.loader import ParquetDataset, ParquetLoader
from data.parquet.windows import parse_window

ROWS, GROUP = 1200, 300
SPARSE = ("few", "many", "nullable", "binary", "number", "listed")
SIZES = (97, 1000, 50, 31, 89, 64)


def _write(path: str, seed: int = 0, fall_back: bool = False) -> None:
    """Row groups of GROUP rows: ``few`` of 20 values (dictionary pages), ``many`` nearly
    distinct, ``nullable`` with nulls, ``binary``, int ids, and lists of strings with
    null lists and null elements. The writer checks its dictionary page limit after each
    batch of values it takes: by default one batch holds a row group, and every chunk is
    dictionary-encoded (``many``'s dictionary past the limit); with ``fall_back``, batches
    of 16 values make ``many`` fall back to plain pages after its first, and ``nullable``
    is written plain."""
    rng = np.random.default_rng(seed)
    few = [f"v{i}" for i in rng.integers(0, 20, ROWS)]
    many = [f"id-{i:012d}" for i in rng.integers(0, 2**40, ROWS)]
    nullable = pa.array([f"n{i}" for i in rng.integers(0, 7, ROWS)], mask=rng.random(ROWS) < 0.3)
    binary = pa.array([bytes([i, 0, 255]) for i in rng.integers(0, 5, ROWS)], pa.binary())
    lengths = rng.integers(0, 4, ROWS)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    elements = pa.array([f"e{i}" for i in rng.integers(0, 9, int(offsets[-1]))], mask=rng.random(offsets[-1]) < 0.2)
    listed = pa.ListArray.from_arrays(pa.array(offsets), elements, mask=pa.array(rng.random(ROWS) < 0.1))
    table = pa.table(
        {
            "label": pa.array(rng.integers(0, 2, ROWS), pa.int8()),
            "d": pa.array(rng.exponential(3, ROWS)),
            "few": few,
            "many": many,
            "nullable": nullable,
            "binary": binary,
            "number": pa.array(rng.integers(-5, 5, ROWS), pa.int32()),
            "listed": listed,
        }
    )
    options = {"write_batch_size": 16, "use_dictionary": [n for n in table.column_names if n != "nullable"]}
    pq.write_table(
        table,
        path,
        row_group_size=GROUP,
        dictionary_pagesize_limit=256,
        data_page_size=128,
        **(options if fall_back else {}),
    )


def _epoch(path: str, read_dictionary: bool, shuffle: bool, workers: int, reads: list | None = None):
    """(loader, its batches, the seen-id filters, the counts) of an epoch; ``reads``: gets
    the columns each row group read was asked for dictionary-encoded."""
    columns = ParquetColumns(label="label", dense=("d",), sparse=SPARSE, table_sizes=SIZES, hash_seed=3)
    half = parse_window("0.01", "--validation_window")
    dataset = ParquetDataset(path, columns, None, half, half)
    if reads is not None:
        read = dataset.read_row_group

        def recorded(file, row_group, names, use_threads=True, dictionary=()):
            reads.append((row_group, set(dictionary)))
            return read(file, row_group, names, use_threads, dictionary)

        dataset.read_row_group = recorded  # type: ignore[method-assign]
    seen = SeenIds(SPARSE, SIZES)
    counter = seen_ids_counter(seen, SPARSE, SIZES, "hash", 3, 40)  # a cap the sample passes
    loader = ParquetLoader(
        dataset,
        dataset.splits["train"],
        columns,
        batch_size=128,
        rank=0,
        world_size=1,
        shuffle_seed=5 if shuffle else None,
        max_buffered_row_groups=2,
        collisions=counter,
        workers=workers,
        read_dictionary=read_dictionary,
    )
    batches = list(loader)
    return loader, batches, seen.packed(), counter.statistics()


@pytest.mark.parametrize("shuffle,workers,fall_back", [(False, 1, False), (True, 2, False), (True, 2, True)])
def test_dictionary_reads_give_the_plain_reads_batches_filters_and_counts(
    monkeypatch, tmp_path, shuffle, workers, fall_back
):
    """The kernels (where built) on the dictionary reads against the numpy reference on the
    plain read, on both sides of the footer's decision."""
    path = str(tmp_path / "part-0.parquet")
    _write(path, fall_back=fall_back)
    with monkeypatch.context() as reference:
        reference.setenv(kernel.ENVIRONMENT, "numpy")
        plain_loader, plain, plain_bits, plain_counts = _epoch(path, False, shuffle, workers)
    reads: list = []
    loader, encoded, bits, counts = _epoch(path, True, shuffle, workers, reads)
    assert len(encoded) == len(plain) >= 9
    for mine, theirs in zip(encoded, plain, strict=True):
        assert (mine.dense_features == theirs.dense_features).all()
        assert (mine.labels == theirs.labels).all()
        assert mine.sparse_features.keys() == theirs.sparse_features.keys()
        assert (mine.sparse_features.values() == theirs.sparse_features.values()).all()
        assert (mine.sparse_features.lengths() == theirs.sparse_features.lengths()).all()
    for own, other in zip(bits, plain_bits, strict=True):
        assert own.any() and (own == other).all()
    assert counts == plain_counts
    assert not counts["many"]["exact"] and counts["few"]["exact"]  # both of the counter's ways
    assert loader._dictionary == {"few", "many", "nullable", "binary"}
    groups = range(ROWS // GROUP)
    if fall_back:
        # The footer tells: the chunks fallen back or written plain are read plain from the first.
        assert loader._dataset.plain_chunks == {(0, g): {"many", "nullable"} for g in groups}
        assert not any({"many", "nullable"} & asked for _, asked in reads)
        assert {g for g, asked in reads if "few" in asked} == set(groups)  # one worker's part of each
        assert loader._plain == set()
    else:
        # Every chunk dictionary-encoded: the nearly distinct column went plain after the
        # first row group read (a worker's; two may read one each), the others stayed.
        assert loader._dataset.plain_chunks == {}
        assert sum("many" in asked for _, asked in reads) <= workers
        assert loader._plain == {"many"} and plain_loader._plain == set()


def test_a_dictionary_read_gives_dictionary_arrays_of_the_schemas_values(tmp_path):
    path = str(tmp_path / "part-0.parquet")
    _write(path)
    columns = ParquetColumns(label="label", dense=("d",), sparse=SPARSE, table_sizes=SIZES)
    half = parse_window("0.01", "--validation_window")
    dataset = ParquetDataset(path, columns, None, half, half)
    table = dataset.read_row_group(0, 1, ["few", "binary", "number"], False, ["few", "binary", "number"])
    assert table.schema.field("few").type == pa.dictionary(pa.int32(), pa.string())
    assert table.schema.field("binary").type == pa.dictionary(pa.int32(), pa.binary())
    assert table.schema.field("number").type == pa.int32()  # pyarrow reads only byte arrays so
    assert table.column("few").to_pylist() == pq.read_table(path).column("few").to_pylist()[GROUP : 2 * GROUP]


def test_the_kernels_list_each_dictionary_entry_once_and_reuse_a_dictionarys_rows(monkeypatch):
    entries = pa.array(["a", "b", None, "a", "c", "b"] * 50).dictionary_encode()
    listed = pa.ListArray.from_arrays(pa.array(np.arange(0, 301, 3), pa.int32()), entries)
    columns = ParquetColumns(label="l", dense=(), sparse=("s", "t"), table_sizes=(7, 11))
    rows = pa.table({"l": pa.array([0] * 100, pa.int8()), "s": entries.slice(0, 100), "t": listed})
    lib = kernel.library()
    if lib is None:
        pytest.skip("the kernels are not built")
    kernel.clear_lookups()
    first = columns.convert(rows)
    assert len(kernel._LOOKUPS) == 2  # one a dictionary and table size
    again = columns.convert(rows.slice(10, 50))
    assert len(kernel._LOOKUPS) == 2  # a slice shares its dictionary: computed once
    for converted in (first, again):
        assert converted.distinct_keys is not None
        for keys, distinct in zip(converted.keys, converted.distinct_keys, strict=True):
            assert sorted(set(keys.tolist())) == sorted(distinct.tolist())  # each once
    monkeypatch.setenv(kernel.ENVIRONMENT, "numpy")
    reference = columns.convert(rows)
    for mine, theirs in zip(first.ids, reference.ids, strict=True):
        assert (mine == theirs).all()
    assert (first.lengths == reference.lengths).all()


def test_a_cached_dictionary_stays_held_while_cached():
    """The cache's key is the dictionary's buffer addresses: its entry holds the array, so
    that no other dictionary can be allocated at them while the entry lives."""
    lib = kernel.library()
    if lib is None:
        pytest.skip("the kernels are not built")
    kernel.clear_lookups()
    for i in range(kernel._LOOKUPS_HELD + 5):
        dictionary = pa.array([f"x{i}", f"y{i}"])
        kernel._dictionary_lookup(lib, dictionary, 10, False, 0)
    assert len(kernel._LOOKUPS) == kernel._LOOKUPS_HELD
    kernel.clear_lookups()
    big = pa.array([f"{i:09d}" for i in range(3_000_000)])  # 45 MiB of entries and strings
    kernel._dictionary_lookup(lib, big, 1000, False, 0)
    kernel._dictionary_lookup(lib, pa.array([f"{i:09d}" for i in range(1_000_000)]), 1000, False, 0)
    assert len(kernel._LOOKUPS) == 1  # the older one went: over the size
    assert kernel._lookups_size <= kernel._LOOKUPS_BYTES
    kernel.clear_lookups()
    held = pa.array(["p", "q", "r"])
    entries, _ = kernel._dictionary_lookup(lib, held, 1000, False, 0)
    del held
    fresh = pa.array(["s", "t", "u"])  # may not reuse the held one's memory
    other, _ = kernel._dictionary_lookup(lib, fresh, 1000, False, 0)
    assert not (entries == other).all()
    kernel.clear_lookups()


def test_a_counter_is_told_the_same_set_whichever_way_the_keys_come():
    keys = np.array([5, 9, 5, 5, 12, 9], dtype=np.uint64)
    all_keys, each_once = CollisionCounter(["f"], [3], "hash", 0), CollisionCounter(["f"], [3], "hash", 0)
    all_keys.add([keys])
    each_once.add([np.unique(keys)])
    assert all_keys.statistics() == each_once.statistics()
