"""Streams a Parquet table's splits to the ranks: bounded memory, reading in the background.

`ParquetDataset` is the table opened: its files' footers (checked against the columns'
roles), the splits (data.parquet.split) and reading one row group. `ParquetLoader`
is one rank's loader of one split, with the promise of data/batching/batches.py: a global batch
is ``batch_size * world_size`` consecutive rows of the split's order, rank r takes its
contiguous block, every rank the same number of batches (computed from the footers).

Memory: a rank holds at most ``--max_buffered_row_groups`` row groups (the columns
read only), plus the batches being built: the reading thread runs up to
`PREFETCH_BATCHES` batches ahead of training. A batch of B rows costs about
B * (4 * (dense + 2) + 12 * ids per row) bytes as tensors.

Shuffling (``--shuffle_training_set``): every epoch the row groups are visited in a
random order drawn from (seed, epoch), and the rows of each window of
``--max_buffered_row_groups`` consecutive row groups (in that order) are shuffled
together, from (seed, epoch, window). Every rank draws the same orders, so the
global order, and the batch arithmetic, are those of one rank.
"""

import queue
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from torchrec.datasets.utils import Batch

from common.errors import BadInput
from common.url_paths import redacted
from data.batching.batches import BatchBuilder, RankBatchLayout
from data.batching.value_checks import DataValueError
from data.parquet.columns import ColumnValueError, ParquetColumns
from data.parquet.files import RowCountError, check_same_types, file_schema, list_files, read_footers, read_row_group
from data.parquet.id_collisions import CollisionCounter
from data.parquet.split import (
    DEFAULT_INTEGER_WINDOW,
    DEFAULT_ROW_FRACTION,
    DEFAULT_TIME_WINDOW,
    Segment,
    TimeIndex,
    row_fraction_splits,
)
from data.parquet.windows import Window, parse_window

# Batches the reading thread prepares ahead of the one training uses.
PREFETCH_BATCHES = 2
# Dense columns whose nulls this process has reported (once per column, by rank 0).
_NULLS_REPORTED: set[str] = set()


class ParquetValueError(DataValueError):
    """A value a column must not hold; the message names the file, row group, row and column.
    Every rank checks the whole global batch, so every rank raises it at the same batch."""

    seen_by_every_rank = True


class ParquetDataset:
    """A Parquet table opened: footers read, schemas checked, splits computed.

    Args:
        path: ``--parquet_path``.
        columns: the columns' roles (the table sizes do not matter here).
        time_column: ``--time_column`` or None.
        validation, test: the windows of the validation and test splits; None: the
            default (data.parquet.split).
        num_windows: with ``--rolling_windows N``, N + 1: the splits are then the
            consecutive equal time windows "window 0" ... "window N" instead of train,
            validation and test (needs ``time_column``).

    Raises:
        BadInput: one line naming the file: not Parquet or truncated, a missing column,
            a column of a wrong type or whose type changes between files, an empty
            table, split or window, a null time.
    """

    def __init__(
        self,
        path: str,
        columns: ParquetColumns,
        time_column: str | None,
        validation: Window | None,
        test: Window | None,
        num_windows: int | None = None,
        listing: tuple[Any, str, list[str]] | None = None,
    ) -> None:
        self.path = path
        self.columns = columns
        # The source's listing when it has one: on object storage each is a recursive
        # listing of the table (a round trip per thousand files).
        self.filesystem, root, files = listing or list_files(path)
        self.footers, metadata, self.schema = read_footers(self.filesystem, root, files)
        read = list(columns.names) + ([time_column] if time_column else [])
        for footer, meta in zip(self.footers, metadata):
            columns.check_schema(file_schema(footer, meta, self.schema), footer.path)
        if time_column and self.schema.get_field_index(time_column) < 0:
            raise BadInput(
                f"{self.footers[0].path}: no column {time_column} (--time_column; the table has "
                f"{', '.join(self.schema.names)})"
            )
        check_same_types(self.footers, metadata, self.schema, read)
        if sum(f.num_rows for f in self.footers) == 0:
            raise BadInput(f"--parquet_path {redacted(path)}: the table has no rows ({len(files)} file(s))")
        self.time: TimeIndex | None = None
        if time_column is None:
            assert num_windows is None, "rolling windows are time windows"  # refused with the flags
            validation = validation or parse_window(DEFAULT_ROW_FRACTION, "--validation_window")
            test = test or parse_window(DEFAULT_ROW_FRACTION, "--test_window")
            self.splits = row_fraction_splits(self.footers, validation.fraction, test.fraction)  # type: ignore[arg-type]
            self._boundaries: list[int] = []
        else:
            self.time = TimeIndex(
                self.footers,
                metadata,
                self.schema,
                time_column,
                lambda f, g: self.read_row_group(f, g, [time_column]).column(time_column),
            )
            if num_windows is not None:
                start, end = self.time.start, self.time.end
                self._boundaries = [start + (end - start) * i // num_windows for i in range(num_windows + 1)]
                names = [f"window {i}" for i in range(num_windows)]
            else:
                default = DEFAULT_INTEGER_WINDOW if self.time.kind == "integer" else DEFAULT_TIME_WINDOW
                validation = validation or parse_window(default, "--validation_window")
                test = test or parse_window(default, "--test_window")
                test_start = self.time.end - self.time.span(test, "--test_window")
                validation_start = test_start - self.time.span(validation, "--validation_window")
                self._boundaries = [self.time.start, validation_start, test_start, self.time.end]
                names = ["train", "validation", "test"]
            self.splits = dict(zip(names, self.time.intervals(self._boundaries)))
        for split, segments in self.splits.items():
            if not segments:
                what = split if num_windows is not None else f"the {split} split"
                raise BadInput(f"--parquet_path {redacted(path)}: {what} has no rows ({self.describe_splits()})")

    def read_row_group(self, file: int, row_group: int, names: Sequence[str]) -> pa.Table:
        """The columns ``names`` of one row group (partition columns made from the path)."""
        return read_row_group(self.filesystem, self.footers[file], self.schema, row_group, names)

    def read_segment(self, segment: Segment, names: Sequence[str]) -> pa.Table:
        table = self.read_row_group(segment.file, segment.row_group, names)
        return table if segment.rows is None else table.take(pa.array(segment.rows))

    def where(self, segment: Segment, row: int) -> str:
        """``"<file>: row group G, row R"`` of a segment's row (R counted in the file)."""
        footer = self.footers[segment.file]
        in_group = row if segment.rows is None else int(segment.rows[row])
        return f"{footer.path}: row group {segment.row_group}, row {footer.first_row(segment.row_group) + in_group}"

    def num_rows(self, split: str) -> int:
        return sum(s.count for s in self.splits[split])

    def split_ranges(self) -> dict[str, tuple[int, int]]:
        """Each split's (or window's) rows as consecutive ranges, in time order, for what
        counts rows (the start-up report); not row numbers of the files."""
        counts = [self.num_rows(s) for s in self.splits]
        starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
        return {s: (starts[i], starts[i + 1]) for i, s in enumerate(self.splits)}

    def describe_splits(self) -> str:
        """One line: each split's (or window's) rows, and with a time column its time range."""
        parts = []
        for i, split in enumerate(self.splits):
            rows = self.num_rows(split)
            if self.time is None:
                parts.append(f"{split} {rows} rows")
            else:
                parts.append(
                    f"{split} {rows} rows, {self.time.column} from {self.time.format(self._boundaries[i])} "
                    f"to before {self.time.format(self._boundaries[i + 1])}"
                )
        return "; ".join(parts)

    def time_ranges(self) -> dict[str, tuple[str, str]]:
        """{split or window: (first time, end time exclusive)} with a time column, else {}."""
        if self.time is None:
            return {}
        return {
            s: (self.time.format(self._boundaries[i]), self.time.format(self._boundaries[i + 1]))
            for i, s in enumerate(self.splits)
        }


@dataclass(frozen=True)
class _Piece:
    """Rows taken from one block: ``positions[i]`` is row i's place in the block, whose
    segments end at ``ends`` (cumulative rows)."""

    table: pa.Table
    segments: list[Segment]
    ends: np.ndarray
    positions: np.ndarray

    def where(self, dataset: ParquetDataset, row: int) -> str:
        position = int(self.positions[row])
        s = int(np.searchsorted(self.ends, position, side="right"))
        return dataset.where(self.segments[s], position - (int(self.ends[s - 1]) if s else 0))

    def slice(self, first: int, last: int) -> "_Piece":
        return _Piece(self.table.slice(first, last - first), self.segments, self.ends, self.positions[first:last])


class _EpochOrder:
    """The global row order of one epoch: blocks of consecutive segments, each block's
    rows in file order or (shuffled) permuted together."""

    def __init__(self, segments: Sequence[Segment], window: int, seed: int | None, epoch: int) -> None:
        order = np.arange(len(segments))
        if seed is not None:
            order = np.random.default_rng([seed, epoch]).permutation(len(segments))
        size = window if seed is not None else 1
        self.blocks = [order[i : i + size] for i in range(0, len(order), size)]
        counts = np.array([segments[i].count for i in range(len(segments))], dtype=np.int64)
        self.block_rows = [counts[b] for b in self.blocks]
        self.starts = np.concatenate([[0], np.cumsum([int(r.sum()) for r in self.block_rows])])
        self._seed, self._epoch = seed, epoch

    def permutation(self, block: int) -> np.ndarray | None:
        if self._seed is None:
            return None
        return np.random.default_rng([self._seed, self._epoch, block]).permutation(
            int(self.starts[block + 1] - self.starts[block])
        )


class ParquetLoader:
    """One rank's batches of one split (the BatchLoader of data/config.py).

    Args:
        dataset: the table.
        segments: the split's rows (ParquetDataset.splits[split], or a window).
        columns: the columns' roles, with the model's table sizes.
        batch_size: rows per rank per batch.
        rank, world_size: this rank and the number of ranks.
        drop_last: drop the final partial global batch.
        shuffle_seed: --shuffle_training_set's seed, or None (file order).
        limit_batches: stop after this many batches.
        max_buffered_row_groups: row groups held at once (and the shuffle window).
        collisions: counts distinct values and hash collisions of the rows read.
    """

    def __init__(
        self,
        dataset: ParquetDataset,
        segments: Sequence[Segment],
        columns: ParquetColumns,
        batch_size: int,
        rank: int,
        world_size: int,
        drop_last: bool = False,
        shuffle_seed: int | None = None,
        limit_batches: int | None = None,
        max_buffered_row_groups: int = 4,
        collisions: CollisionCounter | None = None,
    ) -> None:
        self._dataset = dataset
        self._segments = list(segments)
        self._columns = columns
        self._names = list(columns.names)
        self._layout = RankBatchLayout(sum(s.count for s in self._segments), batch_size, rank, world_size, drop_last)
        self._shuffle_seed = shuffle_seed
        self._limit = limit_batches
        self._window = max_buffered_row_groups
        self._builder = BatchBuilder(list(columns.sparse))
        self._collisions = collisions
        self._dense_nulls = np.zeros(len(columns.dense), dtype=np.int64)
        self._rank = rank
        self._epoch, self._start_batch = 0, 0

    def __len__(self) -> int:
        n = len(self._layout)
        return n if self._limit is None else min(n, self._limit)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """The epoch's order (with shuffling) and the batch the next iteration starts at;
        the batches before it are skipped without reading their row groups."""
        self._epoch, self._start_batch = epoch, start_batch

    def dense_null_counts(self) -> dict[str, int]:
        """Nulls read as 0 so far, per dense column (this rank's rows)."""
        return {name: int(n) for name, n in zip(self._columns.dense, self._dense_nulls)}

    def statistics(self) -> dict[str, Any]:
        """What the trainer logs once per evaluation (this rank's rows so far):
        {"id_collisions": data.parquet.id_collisions.CollisionCounter.statistics (training
        loaders), "dense_nulls": `dense_null_counts`}."""
        return {
            "id_collisions": self._collisions.statistics() if self._collisions is not None else {},
            "dense_nulls": self.dense_null_counts(),
        }

    def __iter__(self) -> Iterator[Batch]:
        batches: queue.Queue[Any] = queue.Queue(maxsize=PREFETCH_BATCHES)
        stop = threading.Event()
        done = object()

        def produce() -> None:
            try:
                for batch in self._batches(self._epoch, self._start_batch):
                    if not _put(batches, batch, stop):
                        return
                _put(batches, done, stop)
            except BaseException as e:  # handed to the training thread, which raises it
                _put(batches, e, stop)

        reader = threading.Thread(target=produce, name="parquet-reader", daemon=True)
        reader.start()
        try:
            while True:
                item = batches.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            reader.join()

    def _batches(self, epoch: int, start_batch: int) -> Iterator[Batch]:
        order = _EpochOrder(self._segments, self._window, self._shuffle_seed, epoch)
        cache: OrderedDict[int, pa.Table] = OrderedDict()
        weighted = self._columns.weight is not None
        for b in range(start_batch, len(self)):
            lo, hi = self._layout.rows(b)
            if self._layout.world_size == 1:
                yield self._convert(self._global_pieces(order, cache, lo, hi, b))  # its checks see every row
                continue
            # Every rank checks the values of the whole global batch, so that a bad value
            # stops every rank at the same batch, before any collective on it (a rank
            # reads the row groups holding its own rows anyway, mostly the same ones).
            g_lo, g_hi = self._layout.global_rows(b)
            pieces = self._global_pieces(order, cache, g_lo, g_hi, b)
            table = pa.concat_tables([p.table for p in pieces])
            try:
                self._columns.check_values(table)
            except ColumnValueError as e:
                raise ParquetValueError(f"{self._value_message(pieces, e)} (batch {b} of the split)") from None
            normalizer = 1.0
            if weighted:  # every rank's weights normalize the loss (data/batching/batches.py WeightedBatch)
                total = float(np.asarray(table.column(self._columns.weight).to_numpy(), dtype=np.float64).sum())
                normalizer = total / self._layout.world_size if total > 0 else 1.0
            yield self._convert(_slice_pieces(pieces, lo - g_lo, hi - g_lo), normalizer)

    def _global_pieces(
        self, order: _EpochOrder, cache: "OrderedDict[int, pa.Table]", lo: int, hi: int, batch: int
    ) -> list[_Piece]:
        """`_pieces` of the global batch ``batch``: every rank reads its row groups, so a
        row group whose footer lies stops every rank at this batch, as a bad value does."""
        try:
            return self._pieces(order, cache, lo, hi)
        except RowCountError as e:
            raise ParquetValueError(f"{e} (batch {batch} of the split)") from None

    def _pieces(self, order: _EpochOrder, cache: "OrderedDict[int, pa.Table]", lo: int, hi: int) -> list[_Piece]:
        """Rows [lo, hi) of the epoch's order: (table, where each row comes from) per block."""
        pieces = []
        block = int(np.searchsorted(order.starts, lo, side="right")) - 1
        while lo < hi:
            start, stop = int(order.starts[block]), int(order.starts[block + 1])
            first, last = lo - start, min(hi, stop) - start
            segment_ids = order.blocks[block]
            tables = [self._segment_table(int(s), cache) for s in segment_ids]
            table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            permutation = order.permutation(block)
            positions = np.arange(first, last) if permutation is None else permutation[first:last]
            taken = table.slice(first, last - first) if permutation is None else table.take(pa.array(positions))
            pieces.append(
                _Piece(
                    taken, [self._segments[int(s)] for s in segment_ids], np.cumsum(order.block_rows[block]), positions
                )
            )
            lo, block = min(hi, stop), block + 1
        return pieces

    def _segment_table(self, index: int, cache: "OrderedDict[int, pa.Table]") -> pa.Table:
        if index in cache:
            cache.move_to_end(index)
            return cache[index]
        while len(cache) >= self._window:
            cache.popitem(last=False)
        table = self._dataset.read_segment(self._segments[index], self._names)
        cache[index] = table
        return table

    def _convert(self, pieces: list[_Piece], normalizer: float = 1.0) -> Batch:
        tables = [p.table for p in pieces]
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        try:
            rows = self._columns.convert(table)
        except ColumnValueError as e:
            raise ParquetValueError(self._value_message(pieces, e)) from None
        if rows.dense_nulls.any():
            self._dense_nulls += rows.dense_nulls
            fresh = [n for n, c in zip(self._columns.dense, rows.dense_nulls) if c and n not in _NULLS_REPORTED]
            if fresh and self._rank == 0:
                _NULLS_REPORTED.update(fresh)
                # Only the training loader counts for the evaluations' lines (it alone
                # has a collision counter); --mode test|validate reads no training row.
                counts = (
                    " (the training rows' counts per column follow each evaluation, and go to the run log "
                    "with --log_path)"
                    if self._collisions is not None and self._collisions.counts_collisions
                    else ", as in training"
                )
                print(f"note: dense column(s) {', '.join(fresh)} hold nulls, read as 0{counts}", file=sys.stderr)
        if self._collisions is not None:
            self._collisions.add(rows.keys)
        return self._builder.bags(rows.dense, rows.ids, rows.lengths, rows.labels, rows.weights, normalizer)

    def _value_message(self, pieces: list[_Piece], error: ColumnValueError) -> str:
        """``error`` (its row counted in the pieces' rows) naming file, row group, row and column."""
        return f"{self._where(pieces, error.row)}, column {error.column}: {error.what}"

    def _where(self, pieces: list[_Piece], row: int) -> str:
        for piece in pieces:
            if row < piece.table.num_rows:
                return piece.where(self._dataset, row)
            row -= piece.table.num_rows
        raise AssertionError(f"row {row} is not in the batch")


def _slice_pieces(pieces: list[_Piece], lo: int, hi: int) -> list[_Piece]:
    """Rows [lo, hi) of the pieces' rows, with their origins."""
    result, start = [], 0
    for piece in pieces:
        first, last = max(lo - start, 0), min(hi - start, piece.table.num_rows)
        if first < last:
            result.append(piece.slice(first, last))
        start += piece.table.num_rows
    return result


def _put(batches: "queue.Queue[Any]", item: Any, stop: threading.Event) -> bool:
    """Puts ``item`` unless the consumer has stopped; False when it has."""
    while not stop.is_set():
        try:
            batches.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False
