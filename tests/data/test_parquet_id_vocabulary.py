"""The id vocabulary (--id_hashing vocabulary): counts exact against a pure-Python count,
the kept ids and their rows, row 0 for the rest, unseen ids exact, its bytes read back
checked, and rows converted through it alike with and without the compiled kernels."""

import collections
import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from data.parquet import kernel
from data.parquet.columns import ParquetColumns
from data.parquet.id_hashing import integer_keys, string_keys
from data.parquet.id_vocabulary import OOV_ROW, IdCounts, IdVocabulary, VocabularyError, check_facts, count_ids


def _python_keys(values):
    """The 64-bit key of each value, one value at a time (the reference of the counts)."""
    keys = []
    for v in values:
        if isinstance(v, str):
            data = np.frombuffer(v.encode(), np.uint8)
            keys.append(int(string_keys(data, np.array([0, len(data)]))[0]))
        else:
            keys.append(int(integer_keys(np.array([v], np.int64))[0]))
    return keys


def _blocks(rng, rows, blocks):
    """Random blocks: a Zipf-ish integer column with nulls, a string list column with null
    lists and null elements."""
    out = []
    for _ in range(blocks):
        ints = [None if rng.random() < 0.1 else int(rng.zipf(1.3) % 500) - 100 for _ in range(rows)]
        lists = [
            None
            if rng.random() < 0.1
            else [None if rng.random() < 0.1 else f"s{rng.zipf(1.5) % 80}" for _ in range(rng.integers(0, 4))]
            for _ in range(rows)
        ]
        out.append(pa.table({"A": pa.array(ints, pa.int64()), "B": pa.array(lists, pa.list_(pa.string()))}))
    return out


def _reference(blocks):
    counts = [collections.Counter(), collections.Counter()]
    for table in blocks:
        for v in table.column("A").to_pylist():
            if v is not None:
                counts[0].update(_python_keys([v]))
        for bag in table.column("B").to_pylist():
            counts[1].update(_python_keys([v for v in bag or [] if v is not None]))
    return counts


def test_counts_are_exact_against_a_python_count():
    rng = np.random.default_rng(3)
    blocks = _blocks(rng, 400, 6)
    counts = count_ids(["A", "B"], blocks, merge_every=97)  # many merges
    for f, truth in enumerate(_reference(blocks)):
        keys, times = counts.counts(f)
        assert keys.tolist() == sorted(truth)
        assert times.tolist() == [truth[k] for k in sorted(truth)]


@pytest.mark.parametrize("min_id_count", [1, 3, 10])
def test_kept_ids_get_rows_by_key_and_every_other_id_row_0(min_id_count):
    rng = np.random.default_rng(min_id_count)
    blocks = _blocks(rng, 300, 4)
    vocabulary = IdVocabulary.of(["A", "B"], count_ids(["A", "B"], blocks), min_id_count)
    for f, truth in enumerate(_reference(blocks)):
        kept = sorted(k for k, n in truth.items() if n >= min_id_count)
        assert vocabulary.kept[f].tolist() == kept
        assert vocabulary.rare[f].tolist() == sorted(k for k, n in truth.items() if n < min_id_count)
        assert vocabulary.table_sizes[f] == len(kept) + 1
        new = np.array([k + 1 for k in kept if k + 1 not in truth][:5], np.uint64)
        keys = np.concatenate([np.array(sorted(truth), np.uint64), new])
        expected = [kept.index(k) + 1 if k in kept else OOV_ROW for k in keys.tolist()]
        assert vocabulary.rows(f, keys).tolist() == expected
    # Unseen: exactly the keys neither kept nor rare.
    a_new = np.array([2**63 + 5, 2**63 + 6], np.uint64)
    a_seen = vocabulary.rare[0][:3] if len(vocabulary.rare[0]) else vocabulary.kept[0][:3]
    assert vocabulary.unseen([np.concatenate([a_seen, a_new]), np.zeros(0, np.uint64)]) == [2, 0]


def test_a_row_cap_keeps_the_most_frequent_ids():
    counts = IdCounts(1)
    counts.add([integer_keys(np.array([7] * 5 + [3] * 5 + [9] * 4 + [1] * 2 + [2]))])
    vocabulary = IdVocabulary.of(["A"], counts, 2, max_rows=[3])  # 2 rows of ids: 3 and 7 (5 each), not 9
    assert vocabulary.kept[0].tolist() == [3, 7] and vocabulary.rare[0].tolist() == [1, 2, 9]
    assert vocabulary.rows(0, integer_keys(np.array([3, 7, 9, 4]))).tolist() == [1, 2, 0, 0]


def _vocabulary():
    counts = IdCounts(2)
    counts.add([integer_keys(np.array([5, 5, 7, 9])), integer_keys(np.array([1, 1, 1, 2]))])
    return IdVocabulary.of(["A", "B"], counts, 2)


def test_bytes_read_back_and_lies_refused():
    vocabulary = _vocabulary()
    data, facts = vocabulary.to_bytes(), vocabulary.facts()
    back = IdVocabulary.from_bytes(data, ["A", "B"], facts)
    assert [k.tolist() for k in back.kept] == [[5], [1]] and [r.tolist() for r in back.rare] == [[7, 9], [2]]
    with pytest.raises(VocabularyError, match="bytes, not the 40"):
        IdVocabulary.from_bytes(data[:-8], ["A", "B"], facts)
    with pytest.raises(VocabularyError, match="sha256 .* not the model's"):
        IdVocabulary.from_bytes(data[8:] + data[:8], ["A", "B"], facts)  # another vocabulary's bytes
    with pytest.raises(VocabularyError, match="of features A,B, not the model's A,C: another model's"):
        check_facts(facts, ["A", "C"])
    with pytest.raises(VocabularyError, match="kept.B is 1, but the model's table has 5 rows"):
        check_facts(facts, ["A", "B"], [2, 5])
    with pytest.raises(VocabularyError, match="version"):
        check_facts({**facts, "version": 99}, ["A", "B"])
    with pytest.raises(VocabularyError, match="not a count"):
        check_facts({**facts, "kept": {"A": -1, "B": 1}}, ["A", "B"])
    import hashlib

    for keys, kept, message in (
        ([5, 5, 9, 1, 2], 2, "an id is kept twice"),
        ([5, 9, 7, 1, 2], 1, "its rare ids are not in increasing order"),
    ):
        data = np.array(keys, "<u8").tobytes()  # the digest of these bytes, but not a vocabulary
        lying = {**facts, "kept": {"A": kept, "B": 1}, "rare": {"A": 3 - kept, "B": 1}}
        with pytest.raises(VocabularyError, match=message):
            IdVocabulary.from_bytes(data, ["A", "B"], {**lying, "sha256": hashlib.sha256(data).hexdigest()})


def test_a_warm_start_grows_the_vocabulary_every_kept_id_keeping_its_row():
    vocabulary = _vocabulary()  # A: 5 kept, 7 and 9 rare; B: 1 kept, 2 rare
    day = IdCounts(2)
    day.add([integer_keys(np.array([9, 9, 3, 3, 3, 8, 5, 4, 4])), integer_keys(np.array([2, 6]))])
    grown = vocabulary.grown(day, 2)
    assert [k.tolist() for k in grown.kept] == [[5, 3, 4, 9], [1]]  # new ids after the old, in key order
    assert [r.tolist() for r in grown.rare] == [[7, 8], [2, 6]]
    assert grown.rows(0, integer_keys(np.array([5, 3, 4, 9, 7, 8, 11]))).tolist() == [1, 2, 3, 4, 0, 0, 0]
    assert grown.unseen([integer_keys(np.array([5, 9, 7, 8, 11])), integer_keys(np.array([6, 7]))]) == [1, 1]
    back = IdVocabulary.from_bytes(grown.to_bytes(), ["A", "B"], grown.facts())
    assert back.rows(0, integer_keys(np.array([9, 3]))).tolist() == [4, 2]
    capped = vocabulary.grown(day, 2, max_rows=[4, 4])  # room for 2 new ids in A: 3 (3 reads), then 4 (2, < 9)
    assert capped.kept[0].tolist() == [5, 3, 4] and capped.rare[0].tolist() == [7, 8, 9]


@pytest.mark.parametrize("kernels", ["built", "numpy"])
def test_rows_convert_through_the_vocabulary_with_and_without_the_kernels(kernels, monkeypatch):
    if kernels == "numpy":
        monkeypatch.setenv(kernel.ENVIRONMENT, "numpy")
    elif kernel.library() is None:
        pytest.skip("the kernels are not built")
    table = pa.table({"label": [0, 1, 0], "A": [5, 7, None], "B": [[1, 2], [], [3, 1]]})
    vocabulary = _vocabulary()
    columns = ParquetColumns("label", (), ("A", "B"), tuple(vocabulary.table_sizes), id_hashing="vocabulary")
    converted = dataclasses.replace(columns, vocabulary=vocabulary).convert(table)
    assert converted.ids[0].tolist() == [1, 0] and converted.ids[1].tolist() == [1, 0, 0, 1]
    assert converted.lengths.tolist() == [[1, 1, 0], [2, 0, 2]]
    assert vocabulary.unseen(converted.keys) == [0, 1]  # B's 3 was never read
    with pytest.raises(ValueError, match="none was given"):
        columns.convert(table)
