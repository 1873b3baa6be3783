"""Which ids training read: a Bloom filter per sparse feature (``--id_hashing hash``).

A hashed model gives every id a row, so serving cannot tell a new id from a trained one
by its row. The training loader adds the 64-bit hash of every id it reads to its
feature's filter (`SeenIds`, fed by the loader's collision counter: `SeenIdsCounter`);
each checkpoint saves the filters (OR-ed over the ranks), the export writes them into the
model directory (``id_sketch.bin``), and predict and serve count an id the filter does
not hold as unseen.

A feature's filter has ``m`` bits, the next power of two at or above ``BITS_PER_ROW``
times its table's rows (at least ``MIN_BITS``, at most ``MAX_BITS``: a 64-wide fp32 row
is 2,048 bits, so the filter costs about 3% of the table), and ``k = HASHES`` bit
positions per id, all in one block of 512 bits (a cache line, so that adding an id costs
one cache miss, not k): with ``h = hashed(key, SKETCH_SEED)``
(data/parquet/id_hashing.py), the block is ``(h >> 36) mod (m / 512)`` and position ``i``
is ``512 x block + ((h >> 9i) mod 512)``: independent bits of one hash. An id training read is always found; a new id is found
(counted as seen: a false positive) with probability the mean over the blocks of
``fill ** k``, ``fill`` being the share of a block's bits set (recorded per feature as ``false_positive_rate``: under
0.1% while a feature has at most 3 distinct ids per table row, 2.4% at 8 per row). The
unseen counts are therefore a lower bound, low by at most that share of the new ids.
"""

import contextlib
import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from data.parquet import kernel
from data.parquet.id_hashing import hashed, salt

SKETCH_SEED = 0x5EE11D5
HASHES = 4
BLOCK_BITS = 512  # the bits of one id lie in one block of this many (a 64-byte cache line)
BITS_PER_ID = 16  # `IdSketch.of`, for a known set of ids
BITS_PER_ROW = 64  # `SeenIds`, sized before any id is read: tables often hold more ids than rows
MIN_BITS = 1 << 16
MAX_BITS = 1 << 28  # 32 MiB a feature
_MERGE_EVERY = 1 << 20  # keys hashed at a time
_SKETCH_SALT = salt(SKETCH_SEED)  # once: numpy's call costs more than a batch's bits
# The file of an exported model directory that holds every feature's filter, back to back.
SKETCH_FILE = "id_sketch.bin"


def sketch_bits(distinct: int) -> int:
    """The filter's bits for ``distinct`` ids: a power of two of at least ``BITS_PER_ID`` an id."""
    wanted = max(MIN_BITS, BITS_PER_ID * max(distinct, 1))
    return min(MAX_BITS, 1 << (wanted - 1).bit_length())


def _positions(keys: np.ndarray, bits: int) -> np.ndarray:
    """(len(keys), HASHES) bit positions of each key (uint64), all in one 512-bit block
    (a cache line: the filters are megabytes, and a miss per bit cost 4x; columns.c's
    dlrm_bloom_add places them the same way)."""
    h = hashed(np.asarray(keys, dtype=np.uint64), SKETCH_SEED)
    block = ((h >> np.uint64(36)) & np.uint64(bits // BLOCK_BITS - 1)) * np.uint64(BLOCK_BITS)
    shifts = np.uint64(9) * np.arange(HASHES, dtype=np.uint64)  # 9 bits a position: 4 x 9 below bit 36
    return block[:, None] + ((h[:, None] >> shifts[None, :]) & np.uint64(BLOCK_BITS - 1))


@dataclass
class IdSketch:
    """One feature's Bloom filter: ``bits`` bits, packed little-endian into bytes.

    Example::

        sketch = IdSketch.of(integer_keys(np.array([5, 7])))
        sketch.contains(integer_keys(np.array([5, 6])))  # [True, False] (False: unless a false positive)
    """

    packed: np.ndarray  # uint8, bits // 8
    ids: int  # distinct ids added

    @property
    def bits(self) -> int:
        return len(self.packed) * 8

    @classmethod
    def of(cls, distinct_keys: np.ndarray) -> "IdSketch":
        """The filter of a set of distinct keys (uint64)."""
        bits = sketch_bits(len(distinct_keys))
        flags = np.zeros(bits, dtype=bool)
        for start in range(0, len(distinct_keys), _MERGE_EVERY):
            flags[_positions(distinct_keys[start : start + _MERGE_EVERY], bits).ravel()] = True
        return cls(np.packbits(flags, bitorder="little"), int(len(distinct_keys)))

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """Whether each key (uint64) may have been added (bool; False: surely new)."""
        positions = _positions(keys, self.bits)
        found = (self.packed[positions >> np.uint64(3)] >> (positions & np.uint64(7)).astype(np.uint8)) & 1
        return found.all(axis=1)

    def fill(self) -> float:
        return float(np.bitwise_count(self.packed).sum()) / self.bits

    def false_positive_rate(self) -> float:
        """The chance that an id never added is found: the mean over the blocks of the
        block's ``fill ** HASHES`` (a new id falls in any block alike; the blocks fill
        unevenly, so this is above the whole filter's ``fill ** HASHES``)."""
        per_block = np.unpackbits(self.packed).reshape(-1, BLOCK_BITS).mean(axis=1, dtype=np.float64)
        return float(np.mean(per_block**HASHES))


def rows_bits(table_rows: int) -> int:
    """A `SeenIds` filter's bits for a table of ``table_rows`` rows (a power of two)."""
    wanted = max(MIN_BITS, BITS_PER_ROW * max(table_rows, 1))
    return min(MAX_BITS, 1 << (wanted - 1).bit_length())


def widened(packed: Sequence[np.ndarray], bits: Sequence[int]) -> list[np.ndarray]:
    """Filters (packed bytes) made ``bits`` wide, holding every id they hold: a filter of
    ``m`` bits places an id in block ``b mod (m / 512)`` of the same hash ``b``, so in a
    filter ``2^j`` times wider the id's block is one of the ``2^j`` copies of that block
    at the same offset: the filter tiled holds it (its false positives stay those of the
    narrower one). A filter already as wide is returned as it is; a narrower target is
    refused (tables only grow: `rows_bits` grows with them)."""
    result = []
    for own, wanted in zip(packed, bits):
        times, rest = divmod(wanted, len(own) * 8)
        if rest or times < 1 or times & (times - 1):
            raise ValueError(f"a filter of {len(own) * 8} bits cannot widen to {wanted}")
        result.append(np.tile(own, times) if times > 1 else own)
    return result


_HUGE_PAGE = 1 << 21


def _zeroed_filter(nbytes: int) -> np.ndarray:
    """``nbytes`` zero bytes (uint8) for a filter; on Linux, from 2 MiB on, in memory the
    kernel is asked to back with huge pages: an id's bits are one random cache line of
    megabytes, and with 4 KiB pages nearly every one also missed the TLB (a quarter of
    the time of adding an id, measured on a 1M-row table's 8 MiB filters)."""
    if nbytes < _HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.zeros(nbytes, np.uint8)
    memory = mmap.mmap(-1, nbytes + _HUGE_PAGE)  # anonymous: zeros
    whole = np.frombuffer(memory, np.uint8)
    start = -whole.ctypes.data % _HUGE_PAGE
    with contextlib.suppress(OSError):  # not granted: 4 KiB pages, as np.zeros
        memory.madvise(mmap.MADV_HUGEPAGE, start, nbytes)
    return whole[start : start + nbytes]


class SeenIds:
    """The filters of the ids training reads, one per feature, sized by the tables
    (thread-safe, a lock a filter: the loader's workers add, the trainer copies at a save).

    Example::

        seen = SeenIds(["C1"], [1000])
        seen.add([integer_keys(np.array([5, 7]))])
        seen.sketches()[0].contains(integer_keys(np.array([5])))  # [True]
    """

    def __init__(self, names: Sequence[str], table_sizes: Sequence[int]) -> None:
        import threading

        self.names = list(names)
        self._packed = [_zeroed_filter(rows_bits(rows) // 8) for rows in table_sizes]
        # One a filter: the loader's workers add to different features at once.
        self._locks = [threading.Lock() for _ in self._packed]

    @property
    def bits(self) -> list[int]:
        return [len(p) * 8 for p in self._packed]

    def add(self, keys: Sequence[np.ndarray]) -> None:
        """The keys (uint64) of a block of rows, one array per feature."""
        from data.parquet.id_collisions import each_locked

        def add(f: int) -> None:
            packed, values = self._packed[f], keys[f]
            if len(values) and not kernel.bloom_add(packed, values, _SKETCH_SALT, HASHES):
                positions = _positions(values, len(packed) * 8).ravel()
                np.bitwise_or.at(
                    packed, positions >> np.uint64(3), np.left_shift(1, positions & np.uint64(7)).astype(np.uint8)
                )

        each_locked(self._locks[: min(len(keys), len(self._packed))], add)

    def merge(self, packed: Sequence[np.ndarray]) -> None:
        """ORs other filters of the same sizes in (another rank's, or a resumed checkpoint's)."""
        for own, other, lock in zip(self._packed, packed, self._locks):
            with lock:
                own |= other

    def holds_any(self) -> bool:
        """Whether any id was added (or merged in)."""
        return any(self._locked(f, lambda p: bool(p.any())) for f in range(len(self._packed)))

    def unseen(self, keys: Sequence[np.ndarray]) -> list[int]:
        """Per feature, how many of ``keys`` (uint64, one array per feature) the filter
        lacks, read in place (an evaluation batch's count; `packed` would copy the
        filters, megabytes each, for every batch)."""
        counts = []
        for f, values in enumerate(keys[: len(self._packed)]):
            with self._locks[f]:
                counts.append(int((~IdSketch(self._packed[f], 0).contains(values)).sum()))
        return counts

    def packed(self) -> list[np.ndarray]:
        """A copy of every filter's bytes."""
        return [self._locked(f, np.copy) for f in range(len(self._packed))]

    def _locked(self, f: int, read: Callable[[np.ndarray], Any]) -> Any:
        """``read(filter f)`` under the filter's lock."""
        with self._locks[f]:
            return read(self._packed[f])

    def sketches(self) -> list[IdSketch]:
        """The filters, with their distinct ids estimated from the fill:
        ``-m / k * ln(1 - fill)``."""
        result = []
        for packed in self.packed():
            sketch = IdSketch(packed, 0)
            fill = min(sketch.fill(), 1 - 1e-12)
            sketch.ids = int(round(-sketch.bits / HASHES * np.log1p(-fill)))
            result.append(sketch)
        return result


def unseen_ids_counter(seen: SeenIds, *args: Any) -> Any:
    """A `data.parquet.id_collisions.CollisionCounter` (its ``args``) for an evaluation
    loader: instead of collisions, it counts per feature the ids read and those ``seen``
    lacks (its ``take()``: (unseen, ids) since the last take)."""
    from data.parquet.id_collisions import CollisionCounter

    class UnseenIdsCounter(CollisionCounter):
        counts_collisions = False

        def __init__(self, *counter_args: Any) -> None:
            super().__init__(*counter_args)
            self._unseen = np.zeros(len(seen.names), np.int64)
            self._ids = np.zeros(len(seen.names), np.int64)

        def add(self, keys: Sequence[np.ndarray]) -> None:
            unseen = seen.unseen(keys) if any(len(k) for k in keys) else []
            # The loader's workers add from several threads: an unlocked += loses counts.
            with self._lock:
                for f, values in enumerate(keys[: len(unseen)]):
                    self._unseen[f] += unseen[f]
                    self._ids[f] += len(values)

        def take(self) -> tuple[np.ndarray, np.ndarray]:
            with self._lock:
                taken = (self._unseen.copy(), self._ids.copy())
                self._unseen[:], self._ids[:] = 0, 0
            return taken

    return UnseenIdsCounter(*args)


def seen_ids_counter(seen: SeenIds, *args: Any) -> Any:
    """A `data.parquet.id_collisions.CollisionCounter` (its ``args``) that also adds
    every block's keys to ``seen``: the training loader's one hook on the keys it reads."""
    from data.parquet.id_collisions import CollisionCounter

    class SeenIdsCounter(CollisionCounter):
        def add(self, keys: Sequence[np.ndarray]) -> None:
            super().add(keys)
            seen.add(keys)  # under the filters' own lock

    return SeenIdsCounter(*args)


def sketch_facts(names: Sequence[str], sketches: Sequence[IdSketch]) -> dict[str, Any]:
    """What meta.json's ``serving_facts.id_sketch`` and inputs.json record of the filters
    (the bits themselves travel as tensors, then as `SKETCH_FILE`)."""
    return {
        "hashes": HASHES,
        "seed": SKETCH_SEED,
        "bits": {name: s.bits for name, s in zip(names, sketches)},
        "ids": {name: s.ids for name, s in zip(names, sketches)},
        "false_positive_rate": {name: s.false_positive_rate() for name, s in zip(names, sketches)},
    }


def sketches_to_bytes(sketches: Sequence[IdSketch]) -> bytes:
    """`SKETCH_FILE`'s content: the packed filters back to back, in feature order."""
    return b"".join(s.packed.tobytes() for s in sketches)


def sketches_from_bytes(data: bytes, bits: Sequence[int], ids: Sequence[int]) -> list[IdSketch] | None:
    """The filters of `sketches_to_bytes` given each one's bits; None when the bytes do not
    hold exactly those filters."""
    sizes = [b // 8 for b in bits]
    if sum(sizes) != len(data) or any(b % 8 or b < 8 for b in bits):
        return None
    packed = np.frombuffer(data, dtype=np.uint8)
    starts = np.cumsum([0, *sizes])
    return [IdSketch(packed[a:b].copy(), int(n)) for a, b, n in zip(starts[:-1], starts[1:], ids)]
