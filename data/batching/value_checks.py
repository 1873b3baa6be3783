"""What a data set's values must be, checked before training reads them.

Labels are 0 or 1; dense values are finite (no NaN, no infinity); sample weights are
finite and not negative (a zero weight leaves a row out); categorical ids are
from 0 up to, not including, the cardinality the data set declares (its metadata.json
or feature spec). With no declared cardinality only negative ids are wrong: the loader
takes ids modulo the table sizes then (``CriteoBinaryLoader``).

A file is checked in blocks of rows, each with one or two vectorised reductions: an
id block is compared once, read as unsigned, against the cardinalities (a negative id
reads as a huge unsigned one); a float32 block's min and max are finite only if every
value is (NaN propagates through both). Only a failing block is searched for its first
bad value, to name the row and column.

Example::

    files = [ValueFile("day_0_labels.npy", labels, LABELS, ["label"])]
    check_value_files(files)  # DataValueError: "day_0_labels.npy row 7 column label: label 2 ..."
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from common.errors import BadInput

DENSE, IDS, LABELS, WEIGHTS = "dense", "ids", "labels", "weights"
CHECK_BLOCK_ROWS = 1 << 18
_LABEL_LIMIT = 2  # labels are ids below 2

Sparse = np.ndarray | list[np.ndarray]


class DataValueError(BadInput):
    """A value a data set must not hold; the message names the file, row and column."""

    # Whether every rank of the job raises it alike (a loader that checks the whole
    # global batch on every rank), or only the rank that read the value.
    seen_by_every_rank = False


@dataclass(frozen=True)
class ValueFile:
    """One array of one file of a data set, whose values are checked.

    Args:
        path: how messages name the file (a path, or an .npz path and array key).
        array: (rows, columns) or (rows,), usually memory-mapped.
        kind: DENSE, IDS, LABELS or WEIGHTS.
        columns: the name of each column (a multi-hot feature repeats its name).
        first_row: the data set's global number of the array's row 0.
        cardinalities: for IDS, each column's cardinality (ids must be below it), or
            None when the data set declares none (then only negative ids are wrong).
        declared_by: what declares the cardinalities, for messages.
    """

    path: str
    array: np.ndarray
    kind: str
    columns: Sequence[str]
    first_row: int = 0
    cardinalities: Sequence[int] | None = None
    declared_by: str = ""

    @property
    def num_rows(self) -> int:
        return int(self.array.shape[0])


def _as_2d(array: np.ndarray) -> np.ndarray:
    """(rows, columns), with bool read as its bytes (a label byte of 2 is not True)."""
    return (array.view(np.uint8) if array.dtype == np.bool_ else array).reshape(len(array), -1)


def _as_unsigned(array: np.ndarray) -> np.ndarray:
    """The same bytes as unsigned integers: negatives become huge."""
    return array.view(np.dtype(f"u{array.dtype.itemsize}"))


def _limits(kind: str, cardinalities: Sequence[int] | None) -> np.ndarray | None:
    if kind == LABELS:
        return np.asarray([_LABEL_LIMIT], dtype=np.int64)
    return None if cardinalities is None else np.asarray(cardinalities, dtype=np.int64)


def _all_valid(kind: str, array: np.ndarray, limits: np.ndarray | None) -> bool:
    """The fast test of a block: True when every value is valid."""
    array = _as_2d(array)
    if array.size == 0:
        return True
    if kind == DENSE:
        if array.dtype == np.float16:  # numpy's float16 min/max are slow: test the exponent bits
            return not ((array.view(np.uint16) & 0x7C00) == 0x7C00).any()
        return bool(np.isfinite(array.min()) and np.isfinite(array.max()))
    if kind == WEIGHTS:  # NaN propagates through min, and min >= 0 is False for it
        return bool(array.min() >= 0 and np.isfinite(array.max()))
    if limits is None:
        return array.dtype.kind == "u" or int(array.min()) >= 0
    unsigned = _as_unsigned(array)
    if limits.dtype != unsigned.dtype and int(limits.max()) <= np.iinfo(unsigned.dtype).max:
        limits = limits.astype(unsigned.dtype)  # compare without widening the block
    return not (unsigned >= limits).any()


def _invalid(kind: str, array: np.ndarray, limits: np.ndarray | None) -> np.ndarray:
    """Bool (rows, columns): which values are invalid (the slow path of a failing block)."""
    array = _as_2d(array)
    if kind == DENSE:
        return ~np.isfinite(array.astype(np.float32))
    if kind == WEIGHTS:
        return ~np.isfinite(array) | (array < 0)
    values = array.astype(np.int64)
    return (values < 0) if limits is None else (values < 0) | (values >= limits)


def _reason(kind: str, value, limit: int | None, declared_by: str) -> str:
    if kind == DENSE:
        return f"dense value {float(value)} (dense values must be finite)"
    if kind == WEIGHTS:
        return f"weight {float(value)} (weights must be finite and not negative)"
    if kind == LABELS:
        return f"label {int(value)} (labels must be 0 or 1)"
    if value < 0:
        return f"negative id {int(value)} (ids must be from 0 to the cardinality - 1)"
    return f"id {int(value)} is not below the cardinality {limit} {declared_by}"


def check_value_files(
    files: Sequence[ValueFile], start: int = 0, stop: int | None = None, block_rows: int = CHECK_BLOCK_ROWS
) -> None:
    """Checks the values of the files' rows in the global range [start, stop).

    Raises:
        DataValueError: at the first bad value, naming the file, its row (0-based, in
            that file) and column.
    """
    for file in files:
        lo = max(start, file.first_row) - file.first_row
        hi = file.num_rows if stop is None else min(stop - file.first_row, file.num_rows)
        limits = _limits(file.kind, file.cardinalities)
        for block_start in range(lo, hi, block_rows):
            block = _as_2d(np.asarray(file.array[block_start : min(block_start + block_rows, hi)]))
            if _all_valid(file.kind, block, limits):
                continue
            row, column = (int(i) for i in np.argwhere(_invalid(file.kind, block, limits))[0])
            limit = None if limits is None else int(limits[column % len(limits)])
            raise DataValueError(
                f"{file.path} row {block_start + row} column {file.columns[column]}: "
                f"{_reason(file.kind, block[row, column], limit, file.declared_by)}"
            )


class BatchValueCheck:
    """Checks the values of batches as a loader reads them (``--mmap_mode``).

    A batch's ids are compared in one operation: one-hot (rows, features) against the
    cardinalities, or the per-feature bags, flattened together as int32, against
    each value's cardinality (cached per batch shape).

    Args:
        cardinalities: one per feature, or None when the data set declares none.

    Example::

        check = BatchValueCheck([1000] * 26)
        check.first_invalid_row(dense, sparse, labels)  # None: the batch is clean
    """

    def __init__(self, cardinalities: Sequence[int] | None) -> None:
        self._cardinalities = None if cardinalities is None else np.asarray(cardinalities, dtype=np.int64)
        self._bag_limits: dict[tuple[int, ...], np.ndarray] = {}

    def _ids(self, sparse: Sparse) -> tuple[np.ndarray, np.ndarray | None]:
        """(ids as one array, their limits) of one-hot ids or per-feature bags."""
        if isinstance(sparse, np.ndarray) or self._cardinalities is None:
            ids = (
                sparse
                if isinstance(sparse, np.ndarray)
                else np.concatenate([np.asarray(part, dtype=np.int32).reshape(-1) for part in sparse]).reshape(1, -1)
            )
            return ids, _limits(IDS, self._cardinalities)
        shape = (len(sparse[0]), *(part.shape[1] for part in sparse))
        if shape not in self._bag_limits:
            sizes = [shape[0] * hotness for hotness in shape[1:]]
            self._bag_limits[shape] = np.repeat(self._cardinalities, sizes).astype(np.uint32)
        ids = np.concatenate([np.asarray(part, dtype=np.int32).reshape(-1) for part in sparse])
        return ids.reshape(1, -1), self._bag_limits[shape]  # one row: a limit per value

    def first_invalid_row(self, dense: np.ndarray, sparse: Sparse, labels: np.ndarray) -> int | None:
        """The index of the first row of a batch holding an invalid value, or None.

        Args:
            dense: (rows, numerical features).
            sparse: one-hot ids (rows, features), or one (rows, hotness) array per feature.
            labels: (rows,) or (rows, 1).
        """
        ids, limits = self._ids(sparse)
        parts = [(IDS, ids, limits), (DENSE, dense, None), (LABELS, labels, _limits(LABELS, None))]
        if all(_all_valid(kind, array, limits) for kind, array, limits in parts):
            return None
        bad = _invalid(DENSE, dense, None).any(axis=1) | _invalid(LABELS, labels, parts[2][2]).any(axis=1)
        if isinstance(sparse, np.ndarray):
            return int(np.flatnonzero(bad | _invalid(IDS, sparse, limits).any(axis=1))[0])
        for f, part in enumerate(sparse):
            bound = None if self._cardinalities is None else self._cardinalities[f : f + 1]
            bad |= _invalid(IDS, part, bound).any(axis=1)
        return int(np.flatnonzero(bad)[0])
