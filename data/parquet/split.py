"""Which rows of a Parquet table are training, validation and test (and rolling windows).

A split is a list of `Segment`: rows of one row group, in file order. The global row
order of a split is its segments in order (files in path order, row groups in file
order), rows in file order.

With ``--time_column`` (timestamp, date or integer; a Hive partition column counts):
the time range is [earliest value, latest value + one unit) (a unit is a day for dates,
a microsecond for timestamps, 1 for integers). The test split is the last
``--test_window`` of it, validation the ``--validation_window`` before; training is every
row before the validation window's start. A fraction is a fraction of the time range.
Row-group statistics (or the partition value) place whole row groups without reading
them; only a row group that straddles a boundary has its time column read at open.
``--rolling_windows N`` cuts the same range into N + 1 equal windows.

Without ``--time_column`` the rows in global order are split by count: training the
first rows, then validation, then test, the windows being fractions of the rows
(default 0.05 each: the last 10% of the rows halved, as Criteo's last day is).
"""

import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common.errors import BadInput
from data.parquet.files import FileFooter
from data.parquet.windows import MICROSECONDS, Window

DAY = MICROSECONDS["d"]
# Validation and test without a time column: fractions of the rows.
DEFAULT_ROW_FRACTION = "0.05"
# With a date or timestamp time column: the last day is test, the day before validation.
DEFAULT_TIME_WINDOW = "1d"
# With an integer time column (no unit to measure days in): fractions of the range.
DEFAULT_INTEGER_WINDOW = "0.1"


@dataclass(frozen=True)
class Segment:
    """Rows of one row group that belong to a split.

    Args:
        file: index of the file in path order.
        row_group: the row group in the file.
        rows: the row group's rows taken, ascending; None: all of them.
        count: how many rows.
    """

    file: int
    row_group: int
    rows: np.ndarray | None
    count: int


def row_fraction_splits(footers: Sequence[FileFooter], validation: float, test: float) -> dict[str, list[Segment]]:
    """Splits without a time column: the first rows train, then validation, then test."""
    total = sum(f.num_rows for f in footers)
    num_test = int(round(total * test))
    num_validation = int(round(total * validation))
    bounds = [0, total - num_test - num_validation, total - num_test, total]
    splits: dict[str, list[Segment]] = {"train": [], "validation": [], "test": []}
    names = list(splits)
    first = 0
    for f, footer in enumerate(footers):
        for g, rows in enumerate(footer.row_group_rows):
            for name, lo, hi in zip(names, bounds[:-1], bounds[1:]):
                start, stop = max(lo, first), min(hi, first + rows)
                if start < stop:
                    taken = None if (start, stop) == (first, first + rows) else np.arange(start - first, stop - first)
                    splits[name].append(Segment(f, g, taken, stop - start))
            first += rows
    return splits


def time_kind(kind: pa.DataType) -> str | None:
    """ "date", "timestamp" or "integer"; None for a type that cannot be a time column."""
    if pa.types.is_date(kind):
        return "date"
    if pa.types.is_timestamp(kind):
        return "timestamp"
    if pa.types.is_integer(kind):
        return "integer"
    return None


def time_numbers(values: pa.ChunkedArray, kind: str) -> np.ndarray:
    """int64 microseconds since 1970 (dates and timestamps) or the integers themselves."""
    if kind == "timestamp":
        values = pc.cast(values, pa.timestamp("us", tz=values.type.tz))
        return pc.cast(values, pa.int64()).to_numpy()
    if kind == "date":
        return pc.cast(pc.cast(values, pa.date32()), pa.int32()).to_numpy().astype(np.int64) * DAY
    return pc.cast(values, pa.int64()).to_numpy()


class TimeIndex:
    """Every row group's earliest and latest time, from statistics, partition values or
    (when neither tells) its time column, read once here.

    Args:
        footers, metadata: the files' footers (data.parquet.files.read_footers).
        schema: the table's schema (partition columns included).
        column: the time column.
        read_times: reads the time column of (file, row group) as the file holds it.

    Raises:
        BadInput: a type that cannot be a time, a null time (naming file, row group,
            row, column).
    """

    def __init__(
        self,
        footers: Sequence[FileFooter],
        metadata: Sequence[pq.FileMetaData],
        schema: pa.Schema,
        column: str,
        read_times: Callable[[int, int], pa.ChunkedArray],
    ) -> None:
        self.column = column
        self.type = schema.field(column).type
        kind = time_kind(self.type)
        if kind is None:
            raise BadInput(
                f"{footers[0].path}: --time_column {column} is {self.type}, but a time column "
                "holds timestamps, dates or integers"
            )
        self.kind = kind
        self.unit = DAY if kind == "date" else 1
        self._footers = footers
        self._read_times = read_times
        self._partition = column in footers[0].partitions
        self.bounds: list[list[tuple[int, int]]] = []  # per file, per row group: (min, max)
        for f, (footer, meta) in enumerate(zip(footers, metadata)):
            if self._partition:
                value = int(time_numbers(pa.chunked_array([pa.array([footer.partitions[column]], self.type)]), kind)[0])
                self.bounds.append([(value, value)] * len(footer.row_group_rows))
                continue
            index = [meta.schema.column(i).path for i in range(meta.num_columns)].index(column)
            self.bounds.append(
                [self._statistics(meta, g, index) or self._read_bounds(f, g) for g in range(meta.num_row_groups)]
            )
        every = [b for per_file in self.bounds for b in per_file]
        self.start = min(lo for lo, _ in every)
        self.end = max(hi for _, hi in every) + self.unit  # exclusive

    def _statistics(self, meta: pq.FileMetaData, row_group: int, index: int) -> tuple[int, int] | None:
        statistics = meta.row_group(row_group).column(index).statistics
        if statistics is None or not statistics.has_min_max or statistics.null_count != 0:
            return None  # no statistics, or nulls: reading the column finds them
        try:
            pair = pa.chunked_array([pa.array([statistics.min, statistics.max], self.type)])
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            return None
        low, high = time_numbers(pair, self.kind)
        return int(low), int(high)

    def _times(self, file: int, row_group: int) -> np.ndarray:
        if self._partition:
            value = self.bounds[file][row_group][0]
            return np.full(self._footers[file].row_group_rows[row_group], value, dtype=np.int64)
        values = self._read_times(file, row_group)
        if values.null_count:
            row = int(np.argmax(pc.is_null(values).to_numpy(zero_copy_only=False)))
            footer = self._footers[file]
            raise BadInput(
                f"{footer.path}: row group {row_group}, row {footer.first_row(row_group) + row}, "
                f"column {self.column}: the time is null"
            )
        return time_numbers(values, self.kind)

    def _read_bounds(self, file: int, row_group: int) -> tuple[int, int]:
        times = self._times(file, row_group)
        if len(times) == 0:
            return (np.iinfo(np.int64).max // 2, np.iinfo(np.int64).min // 2)  # no rows: in no range
        return int(times.min()), int(times.max())

    def intervals(self, boundaries: Sequence[int]) -> list[list[Segment]]:
        """The rows with ``boundaries[i] <= time < boundaries[i + 1]``, per interval i;
        reads the time column of the row groups that straddle a boundary."""
        edges = np.asarray(boundaries, dtype=np.int64)
        result: list[list[Segment]] = [[] for _ in range(len(edges) - 1)]
        for f, footer in enumerate(self._footers):
            for g, rows in enumerate(footer.row_group_rows):
                if rows == 0:
                    continue
                low, high = self.bounds[f][g]
                first, last = np.searchsorted(edges, [low, high], side="right") - 1
                if first == last:
                    if 0 <= first < len(result):
                        result[first].append(Segment(f, g, None, rows))
                    continue
                where = np.searchsorted(edges, self._times(f, g), side="right") - 1
                for i in range(max(first, 0), min(last, len(result) - 1) + 1):
                    taken = np.flatnonzero(where == i)
                    if len(taken):
                        result[i].append(Segment(f, g, None if len(taken) == rows else taken, len(taken)))
        return result

    def span(self, window: Window, option: str) -> int:
        """The length of a window in the column's numbers."""
        if window.is_duration:
            if self.kind == "integer":
                raise BadInput(
                    f"{option} {window.text}: --time_column {self.column} holds integers, which have no "
                    "unit: give a fraction (0.1)"
                )
            return int(window.microseconds)  # type: ignore[arg-type]
        return int(round((self.end - self.start) * float(window.fraction)))  # type: ignore[arg-type]

    def format(self, value: int) -> str:
        """A boundary as a user reads it (ISO date or time, or the integer)."""
        if self.kind == "integer":
            return str(value)
        moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=value)
        return moment.date().isoformat() if self.kind == "date" else moment.isoformat()
