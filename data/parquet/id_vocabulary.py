"""Raw ids to rows through a vocabulary (``--id_hashing vocabulary --min_id_count N``).

One streaming pass over the training split counts every sparse feature's ids exactly
(`IdCounts`): the ids seen at least N times get rows 1..K, in the order of their 64-bit
key (data/parquet/id_hashing.py's ``integer_keys`` / ``string_keys``: an integer id is its
own key, a string's key its FNV-1a hash); every other id, rare or never seen, reads row 0,
the out-of-vocabulary row, trained on all of them. A warm start grows its checkpoint's
vocabulary (`IdVocabulary.grown`): every kept id keeps its row, and the ids the new
training split reads at least N times that it lacks get the rows after them (in key
order among themselves), so a grown vocabulary's kept keys are in row order, ascending
within each day's block. The vocabulary also keeps the keys of
the rare ids it read, so that serving counts an id never seen in training as unseen
exactly (no Bloom filter): an id is seen when it is among the kept or the rare keys.

Memory: the counts are two sorted arrays per feature (8-byte key, 8-byte count: 16 bytes
a distinct id), and the keys of a block are buffered (8 bytes each) until they number
as many as the distinct ids (at least `MERGE_EVERY`), then merged in: at most about 32
bytes a distinct id (twice that while a merge sorts), whatever the rows. The vocabulary
itself is 8 bytes an id seen.

The vocabulary travels as tensors in each checkpoint (state ``id_vocabulary``: per
feature the kept keys then the rare keys, int64 of the same bits) and as the model
directory's `VOCABULARY_FILE` (the same keys back to back, little-endian); meta.json's
``serving_facts.id_vocabulary`` and inputs.json record what they hold (`facts`):
``version``, ``min_id_count``, per feature ``kept`` (K) and ``rare`` counts, and the
``sha256`` of the file's bytes, which every reader checks (`IdVocabulary.from_bytes`).
"""

import dataclasses
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.errors import BadInput
from common.json_fields import INTEGER, SHA256, feature_keys_error

VOCABULARY_VERSION = 1
# The file of an exported model directory that holds every feature's keys.
VOCABULARY_FILE = "id_vocabulary.bin"
MERGE_EVERY = 1 << 20  # keys buffered (at least) before a merge: 8 MiB a feature
OOV_ROW = 0  # the row of every id outside the vocabulary


class VocabularyError(BadInput):
    """Keys or facts that are not a vocabulary this code writes (one line, naming what)."""


class IdCounts:
    """Exact counts of each feature's keys (uint64), fed block by block.

    Example::

        counts = IdCounts(1)
        counts.add([integer_keys(np.array([5, 5, 7]))])
        counts.counts(0)  # (array([5, 7], uint64), array([2, 1]))
    """

    def __init__(self, features: int, merge_every: int = MERGE_EVERY) -> None:
        self._keys = [np.zeros(0, np.uint64) for _ in range(features)]
        self._counts = [np.zeros(0, np.int64) for _ in range(features)]
        self._pending: list[list[np.ndarray]] = [[] for _ in range(features)]
        self._pending_count = [0] * features
        self._merge_every = merge_every

    def add(self, keys: Sequence[np.ndarray]) -> None:
        """One block's keys, one array per feature."""
        for f, values in enumerate(keys):
            if not len(values):
                continue
            self._pending[f].append(np.asarray(values, np.uint64))
            self._pending_count[f] += len(values)
            # Merging costs a pass over the distinct ids: buffer as many keys first.
            if self._pending_count[f] >= max(self._merge_every, len(self._keys[f])):
                self._merge(f)

    def _merge(self, f: int) -> None:
        if not self._pending[f]:
            return
        fresh, fresh_counts = np.unique(np.concatenate(self._pending[f]), return_counts=True)
        self._pending[f], self._pending_count[f] = [], 0
        keys = np.concatenate([self._keys[f], fresh])
        counts = np.concatenate([self._counts[f], fresh_counts.astype(np.int64)])
        order = np.argsort(keys, kind="stable")
        keys, counts = keys[order], counts[order]
        starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1]))) if len(keys) else np.zeros(0, int)
        self._keys[f], self._counts[f] = keys[starts], np.add.reduceat(counts, starts) if len(keys) else counts

    def counts(self, f: int) -> tuple[np.ndarray, np.ndarray]:
        """(distinct keys sorted, uint64; how often each was read, int64) of feature ``f``."""
        self._merge(f)
        return self._keys[f], self._counts[f]


@dataclass(eq=False)
class IdVocabulary:
    """Per feature, the kept keys (key i reads row i + 1: sorted when built from one
    training split, each warm start's new ones appended) and the rare keys (sorted:
    seen in training, read as row 0 like a new id).

    Example::

        vocabulary = IdVocabulary.of(["C1"], counts, min_id_count=2)
        vocabulary.rows(0, integer_keys(np.array([5, 7, 9])))  # [1, 0, 0]
        vocabulary.unseen([integer_keys(np.array([5, 7, 9]))])  # [1]: 9 was never read
    """

    names: list[str]
    kept: list[np.ndarray]  # uint64, distinct, in row order
    rare: list[np.ndarray]  # uint64, strictly increasing, none of them kept
    min_id_count: int
    # Per feature (the kept keys sorted, the row of each): the lookup of a grown vocabulary.
    _index: list[tuple[np.ndarray, np.ndarray]] | None = dataclasses.field(default=None, init=False, repr=False)

    @classmethod
    def of(
        cls, names: Sequence[str], counts: IdCounts, min_id_count: int, max_rows: Sequence[int] | None = None
    ) -> "IdVocabulary":
        """The ids of each feature read at least ``min_id_count`` times; with ``max_rows``
        (the table's rows at most, the OOV row included) only the ``max_rows - 1`` most
        frequent of them (ties: the smaller key)."""
        kept, rare = [], []
        for f in range(len(names)):
            keys, times = counts.counts(f)
            chosen = np.flatnonzero(times >= min_id_count)
            if max_rows is not None and len(chosen) > max_rows[f] - 1:
                # lexsort: the last key is the primary one; keys are sorted, so ties keep key order
                by_count = np.lexsort((keys[chosen], -times[chosen]))
                chosen = np.sort(chosen[by_count[: max(max_rows[f] - 1, 0)]])
            keep = np.zeros(len(keys), bool)
            keep[chosen] = True
            kept.append(keys[keep])
            rare.append(keys[~keep])
        return cls(list(names), kept, rare, min_id_count)

    @property
    def table_sizes(self) -> list[int]:
        """Rows of each feature's table: the kept ids and the OOV row."""
        return [len(k) + 1 for k in self.kept]

    def rows(self, f: int, keys: np.ndarray) -> np.ndarray:
        """The row (int64) of each key (uint64) of feature ``f``: 1 + its place among the
        kept keys, or `OOV_ROW`."""
        kept, rows = self._sorted(f)
        if not len(kept):
            return np.zeros(len(keys), np.int64)
        place = np.minimum(np.searchsorted(kept, keys), len(kept) - 1)
        return np.where(kept[place] == keys, rows[place], OOV_ROW).astype(np.int64)

    def _sorted(self, f: int) -> tuple[np.ndarray, np.ndarray]:
        """Feature ``f``'s kept keys sorted, and the row of each."""
        if self._index is None:  # built whole, then set: the loader's threads read it
            index = []
            for kept in self.kept:
                order = np.argsort(kept, kind="stable")
                index.append((kept[order], order.astype(np.int64) + 1))
            self._index = index
        return self._index[f]

    def grown(self, counts: IdCounts, min_id_count: int, max_rows: Sequence[int] | None = None) -> "IdVocabulary":
        """This vocabulary with the ids of ``counts`` (a warm start's training split) read
        at least ``min_id_count`` times that it does not keep, appended as new rows in key
        order (with ``max_rows``, a table's rows at most, only the most frequent that fit;
        ties: the smaller key). Every kept id keeps its row; the ids read fewer times join
        the rare ones (unless kept)."""
        kept, rare = [], []
        for f in range(len(self.names)):
            keys, times = counts.counts(f)
            new = (times >= min_id_count) & ~_members(self._sorted(f)[0], keys)
            chosen = np.flatnonzero(new)
            room = None if max_rows is None else max(max_rows[f] - 1 - len(self.kept[f]), 0)
            if room is not None and len(chosen) > room:
                by_count = np.lexsort((keys[chosen], -times[chosen]))
                chosen = np.sort(chosen[by_count[:room]])
            kept.append(np.concatenate([self.kept[f], keys[chosen]]))
            seen = np.union1d(self.rare[f], keys)
            rare.append(seen[~_members(np.sort(kept[-1]), seen)])
        return IdVocabulary(list(self.names), kept, rare, min_id_count)

    def unseen(self, keys: Sequence[np.ndarray], features: Sequence[int] | None = None) -> list[int]:
        """Per array of ``keys`` (uint64), how many training never read (neither kept nor
        rare): exact. ``features``: the feature whose vocabulary each array is checked
        against (a history's is its item's); default: the i-th array, the i-th feature."""
        order = range(len(keys)) if features is None else features
        return [
            int(len(k) - _members(self._sorted(f)[0], k).sum() - _members(self.rare[f], k).sum())
            for f, k in zip(order, keys)
        ]

    def holds_any(self) -> bool:
        """Whether training read any id (as `data.parquet.id_sketch.SeenIds.holds_any`)."""
        return any(len(k) or len(r) for k, r in zip(self.kept, self.rare))

    def packed(self) -> list[np.ndarray]:
        """Nothing to OR over the ranks (`SeenIds.packed`): every rank holds the same vocabulary."""
        return []

    def merge(self, packed: Sequence[np.ndarray]) -> None:
        """Nothing to merge (`SeenIds.merge`): the vocabulary is built before training reads."""

    def to_bytes(self) -> bytes:
        """`VOCABULARY_FILE`'s content: per feature its kept then its rare keys, uint64
        little-endian, in feature order."""
        return b"".join(np.concatenate([k, r]).astype("<u8").tobytes() for k, r in zip(self.kept, self.rare))

    def state(self) -> dict[str, np.ndarray]:
        """Per feature the keys of `to_bytes` as int64 (the same bits): checkpoint tensors."""
        return {n: np.concatenate([k, r]).view(np.int64) for n, k, r in zip(self.names, self.kept, self.rare)}

    def facts(self) -> dict[str, Any]:
        """What meta.json's ``serving_facts.id_vocabulary`` and inputs.json record."""
        return {
            "version": VOCABULARY_VERSION,
            "min_id_count": self.min_id_count,
            "kept": {n: len(k) for n, k in zip(self.names, self.kept)},
            "rare": {n: len(r) for n, r in zip(self.names, self.rare)},
            "sha256": hashlib.sha256(self.to_bytes()).hexdigest(),
        }

    @classmethod
    def from_state(cls, names: Sequence[str], state: dict[str, np.ndarray], facts: dict[str, Any]) -> "IdVocabulary":
        """The vocabulary of checkpoint tensors (`state`), checked against ``facts``."""
        data = b"".join(np.asarray(state[n]).astype("<i8").tobytes() for n in names)
        return cls.from_bytes(data, names, facts)

    @classmethod
    def from_bytes(cls, data: bytes, names: Sequence[str], facts: dict[str, Any]) -> "IdVocabulary":
        """The vocabulary of `to_bytes` given its ``facts`` (checked by `check_facts`).

        Raises:
            VocabularyError: bytes of another vocabulary (length, digest), keys out of order.
        """
        check_facts(facts, names)
        sizes = [facts["kept"][n] + facts["rare"][n] for n in names]
        if len(data) != 8 * sum(sizes):
            raise VocabularyError(f"{len(data)} bytes, not the {8 * sum(sizes)} of the {sum(sizes)} ids it records")
        digest = hashlib.sha256(data).hexdigest()
        if digest != facts["sha256"]:
            raise VocabularyError(f"sha256 {digest[:12]}..., not the model's {str(facts['sha256'])[:12]}...")
        keys = np.frombuffer(data, "<u8").astype(np.uint64)
        kept, rare, start = [], [], 0
        for n, size in zip(names, sizes):
            k = facts["kept"][n]
            kept.append(keys[start : start + k])
            rare.append(keys[start + k : start + size])
            start += size
            if len(rare[-1]) > 1 and not (rare[-1][1:] > rare[-1][:-1]).all():
                raise VocabularyError(f"feature {n}: its rare ids are not in increasing order")
            ordered = np.sort(kept[-1])  # in row order (a grown vocabulary's are not sorted)
            if len(ordered) > 1 and not (ordered[1:] > ordered[:-1]).all():
                raise VocabularyError(f"feature {n}: an id is kept twice")
            if _members(ordered, rare[-1]).any():
                raise VocabularyError(f"feature {n}: an id is both kept and rare")
        return cls(list(names), kept, rare, int(facts["min_id_count"]))


def check_facts(facts: Any, names: Sequence[str], table_sizes: Sequence[int] | None = None) -> None:
    """Refuses vocabulary facts this code did not write for these features (and, given
    ``table_sizes``, for tables of other sizes than its kept ids + 1).

    Raises:
        VocabularyError: one line naming the field.
    """
    if not isinstance(facts, dict):
        raise VocabularyError("id_vocabulary is not an object")
    if facts.get("version") != VOCABULARY_VERSION:
        raise VocabularyError(f"id_vocabulary.version is {facts.get('version')!r}, not {VOCABULARY_VERSION}")
    count = facts.get("min_id_count")
    if not (isinstance(count, int) and not isinstance(count, bool) and count >= 1):
        raise VocabularyError(f"id_vocabulary.min_id_count is {count!r}, not a count of at least 1")
    digest = facts.get("sha256")
    if not SHA256.accepts(digest):
        raise VocabularyError("id_vocabulary.sha256 is not a sha256 hex digest")
    for field in ("kept", "rare"):
        error = feature_keys_error(facts, field, names, "id_vocabulary")
        if error:
            raise VocabularyError(error)
        values = facts[field]
        for n in names:
            if not INTEGER.accepts(values[n]):
                raise VocabularyError(f"id_vocabulary.{field}.{n} is {values[n]!r}, not a count")
    if table_sizes is not None:
        for n, rows in zip(names, table_sizes):
            if facts["kept"][n] + 1 != rows:
                raise VocabularyError(
                    f"id_vocabulary.kept.{n} is {facts['kept'][n]}, but the model's table has {rows} rows "
                    "(kept ids + 1, the out-of-vocabulary row)"
                )


def count_ids(names: Sequence[str], blocks: Iterable[Any], merge_every: int = MERGE_EVERY) -> IdCounts:
    """The exact counts of the ids of ``blocks`` (pyarrow Tables holding the ``names``
    columns), read as training reads them (a null is no id, a list's nulls are left out)."""
    from data.parquet.columns import ParquetColumns

    counts = IdCounts(len(names), merge_every)
    for table in blocks:
        counts.add([ParquetColumns._bags(table.column(n))[0] for n in names])
    return counts


def _members(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Whether each of ``keys`` is in ``sorted_keys`` (bool)."""
    if not len(sorted_keys):
        return np.zeros(len(keys), bool)
    place = np.searchsorted(sorted_keys, keys)
    return sorted_keys[np.minimum(place, len(sorted_keys) - 1)] == keys
