"""How many raw values each categorical feature has, and how many share an embedding row.

With ``--id_hashing hash`` distinct raw values can land on the same embedding row (a
hash collision): the model cannot tell them apart. `CollisionCounter` counts, per
feature, the distinct values seen and the fraction of them that share their row with
another seen value.

Exact while a feature has at most ``exact_cap`` distinct values (the set of their
64-bit keys is kept). Beyond it the counter keeps a hash sample: only keys whose
sampling hash (data.parquet.id_hashing.hashed with `SAMPLING_SEED`) has its top ``level``
bits 0, ``level`` growing by one each time the sample outgrows the cap; the distinct
count is then ``sample size * 2**level`` (standard error about
``1 / sqrt(sample size)``), and the colliding fraction the expected one for that many
values spread uniformly over the table: ``1 - (1 - 1/rows)**(distinct - 1)``.
"""

import itertools
import threading
from collections.abc import Callable, Sequence

import numpy as np

from data.parquet import kernel
from data.parquet.id_hashing import embedding_rows, hashed, salt

# Distinct values per feature counted exactly (8 bytes each).
EXACT_DISTINCT_CAP = 1 << 16
# The seed of the sampling hash (not the embedding hash's, so that the sample is not
# biased towards some embedding rows).
SAMPLING_SEED = 0x5A3D1E
_SAMPLING_SALT = salt(SAMPLING_SEED)
_MERGE_EVERY = 1 << 18  # (sampled) keys buffered before they are merged into the set


def each_locked(locks: Sequence[threading.Lock], work: Callable[[int], None], first: int | None = None) -> None:
    """``work(i)`` for every i, each under ``locks[i]``: from index ``first`` round (None:
    each call from another, `_first`), those whose lock is free, again over those left
    while any was, and waiting only when none of those left is free. The loader's workers
    add the same features' keys at once: starting far apart they seldom meet, and one
    that meets a busy lock works on another feature meanwhile. (Calls all starting at the
    first feature and waiting in turn on the busy ones kept two workers waiting 8% of
    their time on Criteo-skewed rows.)"""
    n = len(locks)
    start = _first(n) if first is None else first
    left = [(start + k) % n for k in range(n)]
    while left:
        busy = []
        for i in left:
            if locks[i].acquire(blocking=False):
                try:
                    work(i)
                finally:
                    locks[i].release()
            else:
                busy.append(i)
        if busy and len(busy) == len(left):  # none was free: wait for one
            with locks[busy[0]]:
                work(busy.pop(0))
        left = busy


# Calls of `each_locked` so far: call c starts at c times the golden ratio's fraction of
# the locks, so that calls made close together start far apart (1, 2, 3 calls apart:
# 0.62, 0.24, 0.85 of the way round).
_calls = itertools.count()


def _first(n: int) -> int:
    return int(next(_calls) * 0.6180339887498949 * n) % n if n else 0


class CollisionCounter:
    """Distinct values and colliding fraction per feature (thread-safe: the loader's
    workers add, each feature under its own lock, the trainer reads).

    Args:
        names: the sparse features.
        table_sizes: embedding rows of each.
        id_hashing: "hash" or "modulo" (data.parquet.columns.ParquetColumns).
        hash_seed: the seed of the embedding hash.
        exact_cap: distinct values per feature kept exactly.

    Example::

        counter = CollisionCounter(["C1"], [1000], "hash", 0)
        counter.add([keys])
        counter.statistics()  # {"C1": {"distinct": 812, "colliding_fraction": 0.33, "exact": True}}
    """

    # False in a subclass that counts something else of an evaluation's rows
    # (data/parquet/id_sketch.py's unseen ids): the loader's null note says no counts follow.
    counts_collisions = True

    def __init__(
        self,
        names: Sequence[str],
        table_sizes: Sequence[int],
        id_hashing: str,
        hash_seed: int,
        exact_cap: int = EXACT_DISTINCT_CAP,
    ) -> None:
        self._names = list(names)
        self._sizes = list(table_sizes)
        self._id_hashing, self._seed, self._cap = id_hashing, hash_seed, exact_cap
        self._kept = [np.zeros(0, dtype=np.uint64) for _ in names]
        self._pending: list[list[np.ndarray]] = [[] for _ in names]
        self._pending_count = [0] * len(names)
        self._level = [0] * len(names)
        self._lock = threading.Lock()
        # One a feature: the loader's workers add to different features at once.
        self._feature_locks = [threading.Lock() for _ in names]
        # With the compiled kernels, a hash set per feature (data.parquet.kernel.KeySet)
        # instead of the sorted array and its pending keys: the same sample, no sorting.
        lib = kernel.library()
        self._sets = [kernel.KeySet(lib) for _ in self._names] if lib is not None else None

    def add(self, keys: Sequence[np.ndarray]) -> None:
        """The keys (uint64, data.parquet.id_hashing) of one block of rows, one array per feature."""

        def add(f: int) -> None:
            values = np.asarray(keys[f], dtype=np.uint64)
            if self._sets is not None:
                self._add_to_set(f, values)
                return
            # Sampled as they come: past the cap, sorting is paid for the sample only.
            sample = self._sampled(f, values)
            self._pending[f].append(sample)
            self._pending_count[f] += len(sample)
            if self._pending_count[f] >= _MERGE_EVERY:
                self._merge(f)

        each_locked(self._feature_locks[: len(keys)], add)

    def _add_to_set(self, f: int, values: np.ndarray) -> None:
        """`add` into the feature's hash set: past the cap, the level rises and the set is
        sampled again, as `_merge` does (the final sample is the same whatever the order)."""
        assert self._sets is not None
        done = 0
        while done < len(values):
            done += self._sets[f].add(values[done:], _SAMPLING_SALT, self._level[f], self._cap + 1)
            while len(self._sets[f]) > self._cap:
                self._level[f] += 1
                sample = kernel.sample_keys(self._sets[f].keys(), _SAMPLING_SALT, self._level[f])
                assert sample is not None
                self._sets[f].replace(sample)

    def _sampled(self, f: int, values: np.ndarray) -> np.ndarray:
        if self._level[f] == 0:
            return values
        sample = kernel.sample_keys(values, _SAMPLING_SALT, self._level[f])
        if sample is not None:
            return sample
        return values[(hashed(values, SAMPLING_SEED) >> np.uint64(64 - self._level[f])) == 0]

    def _merge(self, f: int) -> None:
        fresh = [self._kept[f]] + [self._sampled(f, p) for p in self._pending[f]]
        self._pending[f], self._pending_count[f] = [], 0
        kept = _distinct(np.concatenate(fresh))
        while len(kept) > self._cap:
            self._level[f] += 1
            kept = self._sampled(f, kept)
        self._kept[f] = kept

    def _rows(self, f: int, keys: np.ndarray) -> np.ndarray:
        if self._id_hashing == "hash":
            return embedding_rows(keys, self._seed, self._sizes[f])
        return keys.view(np.int64) % self._sizes[f]

    def statistics(self) -> dict[str, dict[str, object]]:
        """{feature: {"distinct": values seen, "colliding_fraction": share of them whose
        embedding row another seen value also has, "exact": not estimated}}."""
        result: dict[str, dict[str, object]] = {}
        for f, name in enumerate(self._names):
            with self._feature_locks[f]:
                if self._sets is None:
                    self._merge(f)
                    kept = self._kept[f]
                else:
                    kept = np.sort(self._sets[f].keys())
                level = self._level[f]
                if level == 0:
                    colliding = _sharing(self._rows(f, kept))
                    fraction = colliding / len(kept) if len(kept) else 0.0
                    result[name] = {"distinct": int(len(kept)), "colliding_fraction": fraction, "exact": True}
                    continue
                distinct = int(len(kept)) << level
                fraction = 1.0 - (1.0 - 1.0 / self._sizes[f]) ** (distinct - 1)
                result[name] = {"distinct": distinct, "colliding_fraction": fraction, "exact": False}
        return result


def collision_summary(statistics: dict[str, dict[str, object]], shown: int = 3) -> str:
    """One line of `CollisionCounter.statistics`: the features whose values share rows
    most, e.g. ``id collisions: C3 41.2% of 1,203,554 values (estimated), C7 ...``."""
    if not statistics:
        return "id collisions: no categorical values counted yet"
    worst = sorted(statistics.items(), key=lambda item: -float(item[1]["colliding_fraction"]))[:shown]  # type: ignore[arg-type]
    parts = [
        f"{name} {float(s['colliding_fraction']):.1%} of {int(s['distinct']):,} values"  # type: ignore[arg-type]
        f"{'' if s['exact'] else ' (estimated)'}"
        for name, s in worst
    ]
    return (
        f"id collisions (share of a feature's distinct values on a row another also has; this rank's "
        f"training rows, highest {len(worst)} of {len(statistics)} features): {', '.join(parts)}"
    )


# np.unique hashes before it sorts (numpy 2.4): 15x slower than a sort on 2M uint64 here.
def _distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted."""
    ordered = np.sort(values)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if len(ordered) else ordered


def _sharing(rows: np.ndarray) -> int:
    """How many of ``rows`` (one per distinct value) equal another of them."""
    ordered = np.sort(rows)
    same_as_next = ordered[1:] == ordered[:-1]
    shared = np.zeros(len(ordered), dtype=bool)
    shared[1:] |= same_as_next
    shared[:-1] |= same_as_next
    return int(shared.sum())
