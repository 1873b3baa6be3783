"""Reads the Criteo in-memory binary layout, each rank only its own rows.

Split (documented in the README): every day file but the last is training data; the
last day's first half is validation and its second half test, so validation and
test never overlap training. For Criteo 1TB (days 0-23) that is days 0-22 for
training and day 23 halved.

Sparse features are one (N, 26) int32 array per day (one-hot), or, for the MLPerf
multi-hot layout, 26 arrays of shape (N, k_f); `Sparse` covers both.
"""

import mmap
import os
import zipfile
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from torchrec.datasets.utils import Batch

from common.errors import BadInput
from data.batching.batches import BatchBuilder, RankBatchLayout, Sparse
from data.batching.multi_hot import open_npz_arrays
from data.batching.value_checks import DENSE, IDS, LABELS, BatchValueCheck, DataValueError, ValueFile, check_value_files
from data.binary.criteo_layout import (
    DENSE_FEATURE_NAMES,
    METADATA_FILE,
    NUM_DENSE_FEATURES,
    NUM_SPARSE_FEATURES,
    SPARSE_FEATURE_NAMES,
    day_file,
    day_files_from,
    multi_hot_file,
    read_metadata,
)
from data.binary.mapped_pages import RELEASE_EVERY_BYTES, MappedPageRelease, prefetch_rows
from data.binary.split import SplitBinaryDataset

Arrays = tuple[np.ndarray, Sparse, np.ndarray]


def _map_sparse(sparse: Sparse, fn: Callable[[np.ndarray], np.ndarray]) -> Sparse:
    return fn(sparse) if isinstance(sparse, np.ndarray) else [fn(part) for part in sparse]


def _every_array(arrays: Arrays) -> list[np.ndarray]:
    """The arrays of a day or a batch, each sparse array apart."""
    dense, sparse, labels = arrays
    return [dense, labels, *([sparse] if isinstance(sparse, np.ndarray) else sparse)]


def _concat_arrays(parts: Sequence[Arrays]) -> Arrays:
    dense = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[2] for p in parts])
    first = parts[0][1]
    if isinstance(first, np.ndarray):
        return dense, np.concatenate([p[1] for p in parts]), labels
    return dense, [np.concatenate([p[1][f] for p in parts]) for f in range(len(first))], labels


class CriteoBinaryDataset:
    """The day files of one directory, seen as one array of rows (memory-mapped).

    Args:
        directory: holds ``day_{i}_{dense,sparse,labels}.npy`` for i = 0, 1, ...
        multi_hot: read ``day_{i}_sparse_multi_hot.npz`` instead of the sparse .npy.

    Raises:
        BadInput: one line naming the file when the layout is wrong.

    Example::

        dataset = CriteoBinaryDataset("data_cache/synthetic_criteo")
        dense, sparse, labels = dataset.read(0, 10)
    """

    def __init__(self, directory: str, multi_hot: bool = False) -> None:
        flag = "--synthetic_multi_hot_criteo_path" if multi_hot else "--in_memory_binary_criteo_path"
        if not os.path.isdir(directory):
            raise BadInput(f"{flag} {directory}: no such directory")
        self.directory = directory
        self.multi_hot = multi_hot
        self.metadata = read_metadata(directory)
        listed = self._listed_days()
        self._days: list[Arrays] = []
        while (
            len(self._days) < listed
            if listed is not None
            else os.path.exists(day_file(directory, len(self._days), "dense"))
        ):
            self._days.append(self._open_day(len(self._days)))
        if len(self._days) < 2:
            raise BadInput(
                f"{directory}: needs at least two day files (day_0_dense.npy, day_1_dense.npy, "
                f"...; the last day is validation + test), found {len(self._days)}"
            )
        self.rows_per_day = [d[0].shape[0] for d in self._days]
        self.day_starts = np.concatenate([[0], np.cumsum(self.rows_per_day)])
        self._check_rows_per_day()
        listed_hotness = self.metadata.multi_hot_sizes if self.metadata else None
        if multi_hot and listed_hotness is not None and listed_hotness != self.hotness:
            raise BadInput(
                f"{multi_hot_file(directory, 0)}: bags of {self.hotness} ids, but {METADATA_FILE} "
                f"says multi_hot_sizes {listed_hotness}"
            )
        for split, (start, stop) in self.split_ranges().items():
            if start == stop:
                raise BadInput(
                    f"{directory}: the {split} split has no rows "
                    f"(rows per day: {', '.join(map(str, self.rows_per_day))})"
                )

    def _listed_days(self) -> int | None:
        """The number of days metadata.json lists (None without one); refuses day files
        beyond them and an unfinished preprocessing."""
        if self.metadata is None:
            markers = day_files_from(self.directory, 0)
            if any(path.endswith(".done.json") for path in markers):
                raise BadInput(
                    f"{self.directory}: preprocessing did not finish (day markers but no {METADATA_FILE}); run it again"
                )
            return None
        listed = self.metadata.num_days
        if listed is None:
            return None
        leftovers = day_files_from(self.directory, listed)
        if leftovers:
            raise BadInput(
                f"{leftovers[0]}: not part of the data set ({METADATA_FILE} lists days 0 to "
                f"{listed - 1}); a leftover of an earlier data set? remove it"
            )
        return listed

    def _check_rows_per_day(self) -> None:
        listed = self.metadata.rows_per_day if self.metadata else None
        if listed is None:
            return
        for day, (rows, expected) in enumerate(zip(self.rows_per_day, listed)):
            if rows != expected:
                raise BadInput(
                    f"{day_file(self.directory, day, 'dense')}: holds {rows} rows, "
                    f"but {METADATA_FILE} says day {day} has {expected}"
                )

    def _open_day(self, day: int) -> Arrays:
        expected = {"dense": (np.float32, NUM_DENSE_FEATURES), "labels": (np.int32, 1)}
        if not self.multi_hot:
            expected["sparse"] = (np.int32, NUM_SPARSE_FEATURES)
        arrays = {}
        for kind, (dtype, width) in expected.items():
            path = day_file(self.directory, day, kind)
            if not os.path.exists(path):
                raise BadInput(f"{path}: missing (day {day} of the data set)")
            try:
                array = np.load(path, mmap_mode="r")
            except (OSError, ValueError) as e:
                raise BadInput(f"{path}: cannot read as .npy ({e})") from e
            if array.ndim != 2 or array.shape[1] != width or array.dtype != dtype:
                raise BadInput(
                    f"{path}: expected {np.dtype(dtype).name} of shape (N, {width}), found {array.dtype} {array.shape}"
                )
            arrays[kind] = array
        sparse: Sparse = arrays.get("sparse")  # type: ignore[assignment]
        counts = [arrays["dense"].shape[0], arrays["labels"].shape[0]]
        if self.multi_hot:
            path = multi_hot_file(self.directory, day)
            try:
                sparse = open_npz_arrays(path, [str(f) for f in range(NUM_SPARSE_FEATURES)])
            except (OSError, zipfile.BadZipFile) as e:
                raise BadInput(f"{path}: cannot read as .npz ({e})") from e
            for f, part in enumerate(sparse):
                if part.ndim != 2 or part.dtype != np.int32:
                    raise BadInput(
                        f"{path}: array {f} must be int32 of shape (N, hotness), found {part.dtype} {part.shape}"
                    )
            counts += [part.shape[0] for part in sparse]
        else:
            counts.append(sparse.shape[0])  # type: ignore[union-attr]
        if len(set(counts)) != 1:
            raise BadInput(
                f"{self.directory}: day {day} files disagree on the row count ({', '.join(map(str, counts))})"
            )
        return arrays["dense"], sparse, arrays["labels"]

    @property
    def num_rows(self) -> int:
        return int(self.day_starts[-1])

    @property
    def sparse_feature_names(self) -> list[str]:
        return SPARSE_FEATURE_NAMES

    @property
    def num_embeddings_per_feature(self) -> list[int] | None:
        """Cardinalities recorded in metadata.json, if any."""
        return self.metadata.num_embeddings_per_feature if self.metadata else None

    def split_ranges(self) -> dict:
        """{"train" | "validation" | "test": (start, stop)} in global row numbers."""
        last_start, end = int(self.day_starts[-2]), int(self.day_starts[-1])
        middle = last_start + (end - last_start) // 2
        return {"train": (0, last_start), "validation": (last_start, middle), "test": (middle, end)}

    def value_files(self) -> list[ValueFile]:
        """Every day's dense, id and label arrays, with what their values must be."""
        cardinalities = self.num_embeddings_per_feature
        files = []
        for day, (dense, sparse, labels) in enumerate(self._days):
            first = int(self.day_starts[day])
            files.append(ValueFile(day_file(self.directory, day, "dense"), dense, DENSE, DENSE_FEATURE_NAMES, first))
            if isinstance(sparse, np.ndarray):
                files.append(
                    ValueFile(
                        day_file(self.directory, day, "sparse"),
                        sparse,
                        IDS,
                        SPARSE_FEATURE_NAMES,
                        first,
                        cardinalities,
                        f"in {METADATA_FILE}",
                    )
                )
            else:
                npz = multi_hot_file(self.directory, day)
                files += [
                    ValueFile(
                        f"{npz} array '{f}'",
                        part,
                        IDS,
                        [name] * part.shape[1],
                        first,
                        None if cardinalities is None else [cardinalities[f]],
                        f"in {METADATA_FILE}",
                    )
                    for f, (name, part) in enumerate(zip(SPARSE_FEATURE_NAMES, sparse))
                ]
            files.append(ValueFile(day_file(self.directory, day, "labels"), labels, LABELS, ["label"], first))
        return files

    @property
    def hotness(self) -> list[int] | None:
        """Bag size per feature of multi-hot data, None for one-hot."""
        sparse = self._days[0][1]
        return None if isinstance(sparse, np.ndarray) else [part.shape[1] for part in sparse]

    def read(self, start: int, stop: int, prefetch: bool = False) -> Arrays:
        """Rows [start, stop) across day boundaries, copied into memory; with ``prefetch``
        each file's rows are first requested from the disk at once (for reads in random
        order: in order, the kernel's read-ahead is faster)."""
        parts = []
        day = int(np.searchsorted(self.day_starts, start, side="right")) - 1
        while start < stop:
            day_stop = int(self.day_starts[day + 1])
            lo, hi = start - int(self.day_starts[day]), min(stop, day_stop) - int(self.day_starts[day])
            dense, sparse, labels = self._days[day]
            if prefetch:
                for array in _every_array(self._days[day]):
                    prefetch_rows(array, lo, hi)  # every file's request at once, before the copies wait on them
            parts.append(
                (np.array(dense[lo:hi]), _map_sparse(sparse, lambda a: np.array(a[lo:hi])), np.array(labels[lo:hi]))
            )
            start, day = min(stop, day_stop), day + 1
        return parts[0] if len(parts) == 1 else _concat_arrays(parts)

    def take(self, rows: np.ndarray) -> Arrays:
        """Rows at the given global numbers (any order), copied into memory."""
        days = np.searchsorted(self.day_starts, rows, side="right") - 1
        order = np.argsort(days, kind="stable")
        parts = []
        for day in np.unique(days):
            local = rows[days == day] - self.day_starts[day]
            dense, sparse, labels = self._days[day]
            parts.append((dense[local], _map_sparse(sparse, lambda a: a[local]), labels[local]))
        grouped = _concat_arrays(parts)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))  # back to the requested order
        return grouped[0][inverse], _map_sparse(grouped[1], lambda a: a[inverse]), grouped[2][inverse]


class CriteoBinaryLoader:
    """Iterates one rank's batches of one split.

    Without ``mmap_mode`` the rank's rows (and only those) are read into memory up
    front; with it they are read from the memory-mapped files batch by batch. Either
    way the file pages read are unmapped again (`data.binary.mapped_pages`): up front once
    the rows are in memory, batch by batch every ``release_every_bytes``, so the RSS
    of a loader over data larger than memory stays bounded.

    Args:
        dataset: the day files, or a feature-spec data set (``--dataset_path``).
        split: "train", "validation" or "test".
        batch_size: rows per rank per batch.
        rank, world_size: this rank and the number of ranks.
        drop_last: drop the final partial batch.
        row_permutation_seed: when set, rows are visited in one random order drawn
            from this seed (identical on every rank): --shuffle_training_set.
        shuffle_batches_seed: when set, the order of batches is shuffled every epoch
            from (seed, epoch), identically on every rank: --shuffle_batches.
        mmap_mode: read batches lazily from the memory map, checking each batch's
            values as it is read (``data.batching.value_checks``; in memory, the source's ``check_values``
            checks every file when the data set is opened).
        num_embeddings_per_feature: ids at or above a table's size are taken modulo it.
        limit_batches: stop after this many batches.
        expand: turns one-hot rows into multi-hot bags (``--multi_hot_sizes``).
        release_every_bytes: mapped bytes read between two releases of the pages
            read; None keeps them mapped (the batches are the same).

    A data set opened with a weight column yields `WeightedBatch` objects: each row's
    weight, and the weight sum of the whole global batch (every rank reads all its
    rows' weights, 4 bytes a row, so no collective is needed to normalize the loss).
    """

    def __init__(
        self,
        dataset: CriteoBinaryDataset | SplitBinaryDataset,
        split: str,
        batch_size: int,
        rank: int,
        world_size: int,
        drop_last: bool = False,
        row_permutation_seed: int | None = None,
        shuffle_batches_seed: int | None = None,
        mmap_mode: bool = False,
        num_embeddings_per_feature: Sequence[int] | None = None,
        limit_batches: int | None = None,
        expand: Callable[[np.ndarray], list[np.ndarray]] | None = None,
        release_every_bytes: int | None = RELEASE_EVERY_BYTES,
    ) -> None:
        self._dataset = dataset
        self._expand = expand
        self._start, stop = dataset.split_ranges()[split]
        self._layout = RankBatchLayout(stop - self._start, batch_size, rank, world_size, drop_last)
        self._permutation = (
            None
            if row_permutation_seed is None
            else self._start + np.random.default_rng(row_permutation_seed).permutation(stop - self._start)
        )
        self._shuffle_seed = shuffle_batches_seed
        self._limit = limit_batches
        self._builder = BatchBuilder(dataset.sparse_feature_names)
        self._modulo = self._modulo_sizes(num_embeddings_per_feature)
        self._batch_check = BatchValueCheck(dataset.num_embeddings_per_feature) if mmap_mode else None
        self._epoch, self._start_batch = 0, 0
        self._in_memory: Arrays | None = None
        self._weighted = isinstance(dataset, SplitBinaryDataset) and dataset.weight_column is not None
        self._in_memory_weights: tuple[np.ndarray, np.ndarray] | None = None  # (rank's weights, normalizers)
        random_order = mmap_mode and (shuffle_batches_seed is not None or row_permutation_seed is not None)
        self._release = (
            None
            if release_every_bytes is None
            else MappedPageRelease([f.array for f in dataset.value_files()], release_every_bytes, random_order)
        )
        self._prefetch = random_order and isinstance(dataset, CriteoBinaryDataset)
        if not mmap_mode:
            # This rank's rows of every batch it may visit, batch after batch, in one block.
            visited = len(self._layout) if shuffle_batches_seed is not None else len(self)
            blocks = [self._read_batch(b) for b in range(visited)]
            self._in_memory = _concat_arrays(blocks) if blocks else None
            if self._weighted:
                weights = [self._read_weights(b) for b in range(visited)]
                self._in_memory_weights = (
                    np.concatenate([w for w, _ in weights] or [np.zeros(0, np.float32)]),
                    np.asarray([n for _, n in weights], dtype=np.float64),
                )
            if self._release is not None:
                self._release.release()  # the rows are in memory: their file pages (and the value check's) can go

    def _modulo_sizes(self, sizes: Sequence[int] | None) -> np.ndarray | None:
        if sizes is None:
            return None
        known = self._dataset.num_embeddings_per_feature
        if known is not None and all(k <= s for k, s in zip(known, sizes)):
            return None  # every id already fits its table
        return np.asarray(sizes, dtype=np.int32)

    def _read_batch(self, batch: int) -> Arrays:
        lo, hi = self._layout.rows(batch)
        if self._prefetch and self._permutation is None:
            return self._dataset.read(self._start + lo, self._start + hi, prefetch=True)  # type: ignore[call-arg]
        if self._permutation is None:
            return self._dataset.read(self._start + lo, self._start + hi)
        return self._dataset.take(self._permutation[lo:hi])

    def _read_weights(self, batch: int) -> tuple[np.ndarray, float]:
        """(this rank's rows' weights, `WeightedBatch.weight_normalizer`) of global batch ``batch``."""
        lo, hi = self._layout.global_rows(batch)
        rows = self._start + np.arange(lo, hi) if self._permutation is None else self._permutation[lo:hi]
        weights = self._dataset.take_weights(rows)  # type: ignore[union-attr]
        if self._batch_check is not None:  # --mmap_mode: no up-front check of the files
            bad = np.flatnonzero(~np.isfinite(weights) | (weights < 0))
            if bad.size:
                row = int(rows[bad[0]])
                check_value_files(self._dataset.value_files(), row, row + 1)  # raises, naming the file
                raise DataValueError(f"row {row} of the data set holds an invalid weight")
        total = float(weights.sum(dtype=np.float64))
        mine = slice(*(r - lo for r in self._layout.rows(batch)))
        return weights[mine], (total / self._layout.world_size if total > 0 else 1.0)

    def _mapped_bytes(self, arrays: Arrays) -> int:
        """About how many bytes of file pages reading ``arrays`` mapped: their own bytes
        for consecutive rows, a page per row and array for rows scattered by a permutation."""
        parts = _every_array(arrays)
        if self._permutation is None:
            return sum(part.nbytes for part in parts)
        return len(parts) * arrays[0].shape[0] * mmap.PAGESIZE

    def _check_batch(self, batch: int, arrays: Arrays) -> None:
        """Raises DataValueError naming the file, row and column of the first invalid
        value of a batch read from the memory map."""
        bad = self._batch_check.first_invalid_row(*arrays)  # type: ignore[union-attr]
        if bad is None:
            return
        lo = self._layout.rows(batch)[0] + bad
        row = self._start + lo if self._permutation is None else int(self._permutation[lo])
        check_value_files(self._dataset.value_files(), row, row + 1)  # raises, naming the file
        raise DataValueError(f"row {row} of the data set holds an invalid value")

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Selects the batch order of ``epoch`` (with --shuffle_batches) and where the
        next iteration starts in it (a resumed run skips the batches already trained)."""
        self._epoch, self._start_batch = epoch, start_batch

    def __len__(self) -> int:
        n = len(self._layout)
        return n if self._limit is None else min(n, self._limit)

    def _batch_order(self) -> np.ndarray:
        order = np.arange(len(self._layout))
        if self._shuffle_seed is not None:
            order = np.random.default_rng([self._shuffle_seed, self._epoch]).permutation(order)
        return order[self._start_batch : len(self)]

    def __iter__(self) -> Iterator[Batch]:
        full = self._layout.batch_size
        for b in self._batch_order():
            weights: np.ndarray | None = None
            normalizer = 1.0
            if self._in_memory is not None:
                size = self._layout.rows(b)[1] - self._layout.rows(b)[0]
                lo = b * full  # all batches but the last are full
                dense, sparse, labels = self._in_memory
                dense, labels = dense[lo : lo + size], labels[lo : lo + size]
                sparse = _map_sparse(sparse, lambda a: a[lo : lo + size])
                if self._in_memory_weights is not None:
                    weights, normalizer = self._in_memory_weights[0][lo : lo + size], self._in_memory_weights[1][b]
            else:
                dense, sparse, labels = self._read_batch(b)
                if self._weighted:
                    weights, normalizer = self._read_weights(b)
                if self._release is not None:
                    self._release.count(self._mapped_bytes((dense, sparse, labels)))
                if self._batch_check is not None:
                    self._check_batch(b, (dense, sparse, labels))
            if self._modulo is not None:
                if isinstance(sparse, np.ndarray):
                    sparse = np.remainder(sparse, self._modulo)
                else:
                    sparse = [np.remainder(part, size) for part, size in zip(sparse, self._modulo)]
            if self._expand is not None:
                sparse = self._expand(sparse)  # type: ignore[arg-type]
            yield self._builder(dense, sparse, labels, weights, normalizer)
