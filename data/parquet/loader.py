"""Streams a Parquet table's splits to the ranks: each row read by one rank, bounded memory,
converted by the rank's workers in the background.

`ParquetDataset` is the table opened: its files' footers (checked against the columns'
roles), the splits (data.parquet.split) and reading one row group. `ParquetLoader`
is one rank's loader of one split.

Decode once per job: every epoch the split's row groups are put in one order (file
order, or with shuffling a random one from (seed, epoch)), and that order of rows is cut
into S (``--epoch_shares``, default the world size) equal contiguous shares; rank r of W
reads shares r * S/W ... (r + 1) * S/W - 1, and only a row group that straddles two
shares is read for each (each share's rows of it converted once). Share s's batch k is
rows [k * G/S, (k + 1) * G/S) of the share (G the global batch), and rank r's batch k
is its shares' k-th blocks one after the other, so every rank has the same number of
batches of the same size (data/batching/batches.py RankBatchLayout's count and sizes,
per share: a final partial global batch is shared evenly, the fewer than S rows left
over are the epoch's last rows of the order). Global batch k is the shares' k-th
blocks in share order whatever the world size: one rank with S = 2 reads at every step
the rows two ranks read (docs/data.md).

Memory: a rank holds at most ``--max_buffered_row_groups`` row groups per share it
reads (the columns read only), plus the batches being built: the workers run up to
`prefetch_depth` batches ahead of training. A batch of B rows costs about
B * (4 * (dense + 2) + 12 * ids per row) bytes as tensors.

Workers (``--data_workers N``): one planning thread walks the batches in order and says
which rows of which row groups each takes (it reads nothing); N workers each take a
whole batch: read the row groups it needs that no worker has read yet (pyarrow decodes
without the GIL), cut its rows from them (Arrow slices, no copy) and convert them
(checks, hash, KJT). A row group is read once, by the first worker that needs it (the
others wait for it); training gets the batches in order. One worker is one core, N
workers N cores.

Shuffling (``--shuffle_training_set``): the row groups in a random order from (seed,
epoch), and the rows of each window of ``--max_buffered_row_groups`` consecutive row
groups of a share shuffled together, from (seed, epoch, share, window): not from the
rank or the world size.
"""

import queue
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from torchrec.datasets.utils import Batch

from common.errors import BadInput
from common.url_paths import redacted
from data.batching.batches import BatchBuilder, RankBatchLayout, WeightedBatch
from data.batching.value_checks import DataValueError
from data.parquet.columns import ColumnValueError, ParquetColumns, id_kind
from data.parquet.feed import (
    Agreement,
    StartedAgreement,
    default_workers,
    lower_this_threads_priority,
    pins_batches,
    started_agreement,
    yields_to_training,
)
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
from data.sources.types import FeedJob

# Batches the workers prepare ahead of the one training uses (at least; with
# more workers, two per worker).
PREFETCH_BATCHES = 2
# A string or binary id column is read dictionary-encoded (pyarrow's read_dictionary:
# its dictionary pages' indices, never materialised) until a row group of it holds more
# distinct values than this share of its values; from then on it is read plain. Parquet
# writers fall back to plain pages once a row group's dictionary outgrows its limit (1 MiB
# in pyarrow), and pyarrow then builds the dictionary by hashing every value of those
# pages: twice a plain read's time on nearly distinct values. Below the share, the
# kernels hash each entry once per row group and the id counters take each entry once a batch.
DICTIONARY_SHARE = 0.5
# Bytes a value of a column chunk's data pages may take when they hold only dictionary
# indices: one index of ceil(log2(values)) bits and a definition level bit, times this
# (page and run headers on small pages, a codec's growth on incompressible indices), plus
# `_INDEX_BYTES_SLACK`. Data pages larger than that hold plain-encoded values: the writer
# fell back (`plain_chunks`).
_INDEX_BYTES_FACTOR = 1.5
_INDEX_BYTES_SLACK = 1024
# Dense columns whose nulls this process has reported (once per column, by rank 0).
_NULLS_REPORTED: set[str] = set()


class ParquetValueError(DataValueError):
    """A value a column must not hold; the message names the file, row group, row and column.
    The ranks agree on every batch (data/parquet/feed.py), so every rank raises it at the
    same batch; a rank of several loading without the feed's group raises it alone."""

    seen_by_every_rank = True

    def __init__(self, message: str, seen_by_every_rank: bool = True) -> None:
        super().__init__(message)
        self.seen_by_every_rank = seen_by_every_rank


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
        # (file, row group) -> its string id columns read plain from the start (`plain_chunks`).
        self.plain_chunks: dict[tuple[int, int], frozenset[str]] = {}
        candidates = dictionary_candidates(self.schema, columns.kjt_keys)
        for file, meta in enumerate(metadata):
            for group, names in enumerate(plain_chunks(meta, candidates)):
                if names:
                    self.plain_chunks[file, group] = names
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

    def read_row_group(
        self, file: int, row_group: int, names: Sequence[str], use_threads: bool = True, dictionary: Sequence[str] = ()
    ) -> pa.Table:
        """The columns ``names`` of one row group (partition columns made from the path);
        those of ``dictionary`` dictionary-encoded (data.parquet.files.read_row_group)."""
        return read_row_group(
            self.filesystem, self.footers[file], self.schema, row_group, names, use_threads, dictionary
        )

    def read_segment(self, segment: Segment, names: Sequence[str]) -> pa.Table:
        return _segment_rows(self.read_row_group(segment.file, segment.row_group, names), segment)

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
class _Span:
    """Rows [lo, hi) of the split's segment ``segment`` (counted in the segment)."""

    segment: int
    lo: int
    hi: int

    @property
    def count(self) -> int:
        return self.hi - self.lo


def _take(spans: Sequence[_Span], lo: int, hi: int) -> list[_Span]:
    """Rows [lo, hi) of the spans' rows, one span after the other."""
    result, start = [], 0
    for span in spans:
        if start >= hi:
            break
        first, last = max(lo - start, 0), min(hi - start, span.count)
        if first < last:
            result.append(_Span(span.segment, span.lo + first, span.lo + last))
        start += span.count
    return result


def epoch_share(counts: Sequence[int], order: Sequence[int], shares: int, share: int) -> list[_Span]:
    """Share ``share``'s rows of an epoch: the segments in ``order`` (``counts`` rows
    each) cut into ``shares`` equal contiguous shares, the ``share``-th; the rows after
    the last share (fewer than ``shares``) are no share's."""
    spans = [_Span(int(s), 0, int(counts[s])) for s in order if counts[s]]
    size = sum(int(c) for c in counts) // shares
    return _take(spans, share * size, (share + 1) * size)


@dataclass(frozen=True)
class _Piece:
    """Rows taken from one block: ``positions[i]`` is row i's place in the block, whose
    spans end at ``ends`` (cumulative rows)."""

    table: pa.Table
    spans: list[_Span]
    ends: np.ndarray
    positions: np.ndarray

    def where(self, dataset: ParquetDataset, segments: Sequence[Segment], row: int) -> str:
        position = int(self.positions[row])
        s = int(np.searchsorted(self.ends, position, side="right"))
        span = self.spans[s]
        return dataset.where(segments[span.segment], span.lo + position - (int(self.ends[s - 1]) if s else 0))


class _LazyTable:
    """One row group's columns, read by the workers that need it, together: the planning
    thread only names the row groups. The columns are cut into parts (one per worker);
    a worker that needs the row group reads the next part no worker has taken yet (pyarrow
    decodes it without the GIL), then waits for the parts others are reading. So a row
    group is decoded once, and with N workers by up to N of them at the same time: the
    workers that would wait for it read it instead.

    Args:
        parts: the column names of each part.
        read: reads one part (a table of its columns).
        finish: the whole row group's table (the parts' columns, in order) cut to what the
            loader keeps of it.
        names: the columns in the order of the table.
    """

    def __init__(
        self,
        parts: list[list[str]],
        read: Callable[[list[str]], pa.Table],
        finish: Callable[[pa.Table], pa.Table],
        names: list[str],
    ) -> None:
        self._parts, self._read, self._finish, self._names = parts, read, finish, names
        self._read_parts: list[pa.Table | None] = [None] * len(parts)
        self._taken = 0
        self._arrived = 0
        self._ready = threading.Condition()
        self._table: pa.Table | None = None
        self._error: BaseException | None = None

    def get(self) -> pa.Table:
        with self._ready:
            while self._table is None and self._error is None and self._taken == len(self._parts):
                self._ready.wait()
            part = self._taken if self._table is None and self._error is None else None
            if part is not None:
                self._taken += 1
        if part is not None:
            try:
                table, error = self._read(self._parts[part]), None
            except BaseException as e:  # every batch that needs it fails alike
                table, error = None, e
            with self._ready:
                self._read_parts[part] = table
                self._error = self._error or error
                self._arrived += 1
                if self._arrived == len(self._parts) and self._error is None:
                    try:
                        self._table = self._finish(self._whole())
                    except BaseException as e:
                        self._error = e
                self._ready.notify_all()
            return self.get()
        if self._error is not None:
            raise self._error
        assert self._table is not None
        return self._table

    def _whole(self) -> pa.Table:
        tables = [t for t in self._read_parts if t is not None]
        if len(tables) == 1:
            return tables[0].select(self._names)
        fields = {f.name: (f, t.column(f.name)) for t in tables for f in t.schema}
        return pa.Table.from_arrays(
            [fields[n][1] for n in self._names], schema=pa.schema([fields[n][0] for n in self._names])
        )


@dataclass(frozen=True)
class _PiecePlan:
    """Rows [first, last) of a share's block (its spans' row groups, unread yet), in order
    or through the block's permutation: what a worker cuts into a `_Piece`."""

    tables: list[_LazyTable]
    spans: list[_Span]
    ends: np.ndarray
    first: int
    last: int
    permutation: np.ndarray | None

    def piece(self) -> "_Piece":
        tables = [t.get().slice(s.lo, s.count) for t, s in zip(self.tables, self.spans)]
        table = _concat(tables)
        if self.permutation is None:
            positions = np.arange(self.first, self.last)
            taken = table.slice(self.first, self.last - self.first)
        else:
            positions = self.permutation[self.first : self.last]
            taken = table.take(pa.array(positions))
        return _Piece(taken, self.spans, self.ends, positions)


class _ShareOrder:
    """A share's rows of one epoch (`epoch_share`) in blocks of consecutive spans, each
    block's rows in order or (shuffled) permuted together."""

    def __init__(self, spans: list[_Span], window: int, seed: list[int] | None) -> None:
        size = window if seed is not None else 1
        self.blocks = [spans[i : i + size] for i in range(0, len(spans), size)]
        self.ends = [np.cumsum([s.count for s in b]) for b in self.blocks]
        self.starts = np.concatenate([[0], np.cumsum([int(e[-1]) for e in self.ends])]).astype(np.int64)
        self._seed = seed

    def permutation(self, block: int) -> np.ndarray | None:
        if self._seed is None:
            return None
        return np.random.default_rng([*self._seed, block]).permutation(int(self.starts[block + 1] - self.starts[block]))


@dataclass(frozen=True)
class _Bad:
    """A batch whose rows this rank found bad: the line naming file, row group, row and column."""

    message: str


class _ReaderCounters:
    """What a rank's reader did (thread-safe: the workers add)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows_read = 0  # rows of the row groups pyarrow decoded (a straddling one whole)
        self.bytes_read = 0  # their Arrow bytes (the columns read)
        self.rows_decoded = 0  # rows checked and converted into batches

    def read(self, rows: int, nbytes: int) -> None:
        with self._lock:
            self.rows_read += rows
            self.bytes_read += nbytes

    def decoded(self, rows: int) -> None:
        with self._lock:
            self.rows_decoded += rows

    def statistics(self) -> dict[str, int]:
        with self._lock:
            return {"rows_read": self.rows_read, "bytes_read": self.bytes_read, "rows_decoded": self.rows_decoded}


class ParquetLoader:
    """One rank's batches of one split (the BatchLoader of data/config.py).

    Args:
        dataset: the table.
        segments: the split's rows (ParquetDataset.splits[split], or a window).
        columns: the columns' roles, with the model's table sizes.
        batch_size: rows per rank per batch.
        rank, world_size: this rank and the number of ranks.
        epoch_shares: ``--epoch_shares``, the shares each epoch's order is cut into (a
            multiple of ``world_size`` dividing the global batch), or a function that
            tells it when an epoch starts (the source resolves it when the job joins);
            None: ``world_size``.
        drop_last: drop the final partial global batch.
        shuffle_seed: --shuffle_training_set's seed, or None (file order).
        limit_batches: stop after this many batches.
        max_buffered_row_groups: row groups held at once per share read (and the shuffle
            window).
        collisions: counts distinct values and hash collisions of the rows read.
        workers: ``--data_workers``: threads converting batches; None: the rank's share
            of the host's cores (data/parquet/feed.py).
        job: what the job is (device, ranks on the host, the feed's agreement), asked
            when an epoch starts: the trainer tells the source after the loaders of
            --rolling_windows are made. None: one process on CPU.
        agree: the ranks' agreement on each batch (data/parquet/feed.py `Agreement`),
            instead of the job group's: how ranks run as threads agree (tests).
        read_dictionary: read string and binary id columns dictionary-encoded
            (`DICTIONARY_SHARE`); False: always plain (the batches are the same).
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
        workers: int | None = 1,
        job: "Callable[[], FeedJob] | None" = None,
        agree: Agreement | None = None,
        epoch_shares: "int | Callable[[], int | None] | None" = None,
        read_dictionary: bool = True,
    ) -> None:
        self._dataset = dataset
        self._segments = list(segments)
        self._counts = [s.count for s in self._segments]
        self._columns = columns
        self._names = list(columns.names)
        self._batch_size, self._drop_last = batch_size, drop_last
        self._epoch_shares = epoch_shares
        self._shuffle_seed = shuffle_seed
        self._limit = limit_batches
        self._window = max_buffered_row_groups
        self._builder = BatchBuilder(columns.kjt_keys)  # the sparse features, then the histories
        self._collisions = collisions
        self._dense_nulls = np.zeros(len(columns.dense), dtype=np.int64)
        self._nulls_lock = threading.Lock()
        self._counters = _ReaderCounters()
        self._rank, self._world_size = rank, world_size
        self._workers = workers
        self._job = job or FeedJob
        self._agree = agree
        self._epoch, self._start_batch = 0, 0
        self._read_parts = 1  # the parts a row group's columns are read in: one a worker
        # The string and binary id columns, read dictionary-encoded (`DICTIONARY_SHARE`) but
        # those found to hold mostly distinct values (the workers add to it).
        self._dictionary = set(dictionary_candidates(dataset.schema, columns.kjt_keys))
        # Those a chunk read dictionary-encoded showed to be mostly distinct (the metadata
        # could not tell: `plain_chunks`), read plain from then on.
        self._plain: set[str] = set()
        self.read_dictionary = read_dictionary  # may be changed between epochs

    def shares(self) -> int:
        """S: the shares each epoch is cut into (``--epoch_shares``; unset, the world size)."""
        given = self._epoch_shares() if callable(self._epoch_shares) else self._epoch_shares
        shares = given or self._world_size
        global_batch = self._batch_size * self._world_size
        if shares % self._world_size or global_batch % shares:  # the source refuses the flag first
            raise ValueError(f"{shares} shares: not a multiple of {self._world_size} ranks dividing {global_batch}")
        return shares

    def _share_layout(self, shares: int) -> RankBatchLayout:
        """Every share's blocks (the same count and sizes for each: share 0's)."""
        global_batch = self._batch_size * self._world_size
        return RankBatchLayout(sum(self._counts), global_batch // shares, 0, shares, self._drop_last)

    def __len__(self) -> int:
        n = len(self._share_layout(self.shares()))
        return n if self._limit is None else min(n, self._limit)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """The epoch's order (with shuffling) and the batch the next iteration starts at;
        the batches before it are skipped without reading their row groups. Started past
        batch 0 after a resume from a run that cut the epoch into other shares (the
        job's ``resumed_epoch_shares``, else ``resumed_world_size``), the rows its shares
        had not read yet are cut into this run's shares anew."""
        self._epoch, self._start_batch = epoch, start_batch

    def dense_null_counts(self) -> dict[str, int]:
        """Nulls read as 0 so far, per dense column (this rank's rows)."""
        with self._nulls_lock:
            return {name: int(n) for name, n in zip(self._columns.dense, self._dense_nulls)}

    def statistics(self) -> dict[str, Any]:
        """What the trainer logs once per evaluation (this rank's rows so far):
        {"id_collisions": data.parquet.id_collisions.CollisionCounter.statistics (training
        loaders), "dense_nulls": `dense_null_counts`, "reader": {"rows_read": rows of the
        row groups pyarrow decoded, "bytes_read": their Arrow bytes, "rows_decoded": rows
        checked and converted}}."""
        return {
            "id_collisions": self._collisions.statistics() if self._collisions is not None else {},
            "dense_nulls": self.dense_null_counts(),
            "reader": self._counters.statistics(),
        }

    def workers(self) -> int:
        """The converting threads an epoch runs."""
        return self._workers or default_workers(self._job().local_world_size)

    def prefetch_depth(self) -> int:
        """Batches read and converted ahead of the one training takes, at most."""
        return max(PREFETCH_BATCHES, 2 * self.workers())

    def __iter__(self) -> Iterator[Batch]:
        job = self._job()
        agree: StartedAgreement | None = None
        if self._agree is not None:
            given = self._agree
            agree = lambda message, weight_sum: partial(_agreed, given(message, weight_sum))
        elif job.group is not None:
            agree = started_agreement(job.group)
        yields = yields_to_training(job.device_type)
        pin = pins_batches(job.device_type)
        shares = self.shares()
        resumed = job.resumed_epoch_shares or job.resumed_world_size
        consumed = (
            (resumed, self._start_batch * self._batch_size * self._world_size // resumed)
            if self._start_batch and resumed is not None and resumed != shares
            else None
        )
        batches: queue.Queue[Any] = queue.Queue(maxsize=self.prefetch_depth())
        stop = threading.Event()
        done = object()
        # Started by the planning thread (on its first batch), the workers inherit its priority.
        pool = ThreadPoolExecutor(self.workers(), thread_name_prefix="parquet-worker")

        def produce() -> None:
            if yields:
                lower_this_threads_priority()
            try:
                for b, plans in self._read(self._epoch, self._start_batch, shares, consumed, not yields):
                    if not _put(batches, pool.submit(self._convert, b, plans, pin), stop):
                        return
                _put(batches, done, stop)
            except BaseException as e:  # handed to the training thread, which raises it
                _put(batches, e, stop)

        self._read_parts = self.workers()
        reader = threading.Thread(target=produce, name="parquet-planner", daemon=True)
        reader.start()

        def take() -> "tuple[Batch | None, Callable[[], tuple[str | None, float]]] | None":
            """The next batch and its agreement started (or this rank's own verdict)."""
            item = batches.get()
            if item is done:
                return None
            if isinstance(item, BaseException):
                raise item
            result = item.result()
            batch, weight_sum = (None, 0.0) if isinstance(result, _Bad) else result
            message = result.message if isinstance(result, _Bad) else None
            if agree is None:
                return batch, partial(_agreed, (message, weight_sum))
            # The same batch on every rank: training's thread, in order.
            return batch, agree(message, weight_sum)

        try:
            following: Any = take()
            while following is not None:
                batch, finish = following
                following = None
                if agree is not None:  # the next batch's all-reduce runs during this step
                    try:
                        following = take()
                    except BaseException as e:  # raised where it was before: after this batch
                        following = e
                message, weight_sum = finish()
                if message is not None:
                    raise ParquetValueError(message, seen_by_every_rank=agree is not None or self._world_size == 1)
                if isinstance(batch, WeightedBatch):  # the global batch's sum / ranks (WeightedBatch)
                    ranks = self._world_size if agree is not None else 1
                    batch.weight_normalizer.fill_(weight_sum / ranks if weight_sum > 0 else 1.0)
                yield batch  # type: ignore[misc]
                if isinstance(following, BaseException):
                    raise following
                if agree is None:
                    following = take()
        finally:
            stop.set()
            reader.join()
            pool.shutdown(wait=True, cancel_futures=True)

    def _read(
        self, epoch: int, start_batch: int, shares: int, consumed: tuple[int, int] | None, use_threads: bool
    ) -> Iterator[tuple[int, list[_PiecePlan]]]:
        """(batch, where its rows come from) of this rank, from ``start_batch`` on: each
        batch the block of each of its shares, in share order. Reads nothing: the row
        groups are named (the share's cache of ``max_buffered_row_groups``) for the worker
        that converts the batch to read."""
        layout = self._share_layout(shares)
        per_rank = shares // self._world_size
        own = range(self._rank * per_rank, (self._rank + 1) * per_rank)
        streams = [self._streams(epoch, shares, share, consumed) for share in own]
        first = start_batch if consumed is not None else 0  # the batch the streams' row 0 starts
        # A cache per share: a rank's shares are read side by side, each its own window.
        caches: list[OrderedDict[int, _LazyTable]] = [OrderedDict() for _ in own]
        for b in range(start_batch, len(self)):
            lo, hi = layout.rows(b)
            local, size = (b - first) * layout.batch_size, hi - lo
            plans: list[_PiecePlan] = []
            for share_streams, cache in zip(streams, caches):
                position = 0
                for order, start, stop in share_streams:
                    first_row, last_row = max(local - position, 0), min(local + size - position, stop - start)
                    if first_row < last_row:
                        plans += self._plans(order, cache, start + first_row, start + last_row, use_threads)
                    position += stop - start
            yield b, plans

    def _streams(
        self, epoch: int, shares: int, share: int, consumed: tuple[int, int] | None
    ) -> list[tuple[_ShareOrder, int, int]]:
        """Share ``share``'s rows of the epoch, as rows [start, stop) of shares' orders,
        one after the other: the share's own order; after a resume from a run that cut
        the epoch into other shares (``consumed`` = (S0, rows each of its shares had
        read)), the ``share``-th of ``shares`` equal parts of what S0 shares' orders had
        left followed by the rows no share of S0 held."""
        order = np.arange(len(self._segments))
        if self._shuffle_seed is not None:
            order = np.random.default_rng([self._shuffle_seed, epoch]).permutation(len(self._segments))

        def share_order(spans: list[_Span], share: int) -> _ShareOrder:
            # Seeded by the share, not the rank: the same rows in the same order at every world size.
            seed = None if self._shuffle_seed is None else [self._shuffle_seed, epoch, share]
            return _ShareOrder(spans, self._window, seed)

        if consumed is None:
            own = share_order(epoch_share(self._counts, order, shares, share), share)
            return [(own, 0, int(own.starts[-1]))]
        old_shares, read = consumed
        total = sum(self._counts)
        old_size = total // old_shares
        rest = [
            (share_order(epoch_share(self._counts, order, old_shares, s), s), min(read, old_size), old_size)
            for s in range(old_shares)
        ]
        spans = [_Span(int(s), 0, int(self._counts[s])) for s in order if self._counts[s]]
        tail = _take(spans, old_shares * old_size, total)
        rest.append((share_order(tail, old_shares), 0, total - old_shares * old_size))
        size = sum(stop - start for _, start, stop in rest) // shares
        lo, hi = share * size, (share + 1) * size
        streams, position = [], 0
        for stream, start, stop in rest:
            first_row, last_row = max(lo - position, 0), min(hi - position, stop - start)
            if first_row < last_row:
                streams.append((stream, start + first_row, start + last_row))
            position += stop - start
        return streams

    def _plans(
        self, order: _ShareOrder, cache: "OrderedDict[int, _LazyTable]", lo: int, hi: int, use_threads: bool
    ) -> list[_PiecePlan]:
        """Rows [lo, hi) of a share's order: (row groups, where each row comes from) per block."""
        plans = []
        block = int(np.searchsorted(order.starts, lo, side="right")) - 1
        while lo < hi:
            start, stop = int(order.starts[block]), int(order.starts[block + 1])
            spans = order.blocks[block]
            tables = [self._segment_table(s.segment, cache, use_threads) for s in spans]
            plans.append(
                _PiecePlan(
                    tables, spans, order.ends[block], lo - start, min(hi, stop) - start, order.permutation(block)
                )
            )
            lo, block = min(hi, stop), block + 1
        return plans

    def _segment_table(self, index: int, cache: "OrderedDict[int, _LazyTable]", use_threads: bool) -> _LazyTable:
        if index in cache:
            cache.move_to_end(index)
            return cache[index]
        while len(cache) >= self._window:
            cache.popitem(last=False)
        segment = self._segments[index]
        partitions = self._dataset.footers[segment.file].partitions
        # One part a worker (the partition columns, made from the path, with the first:
        # a part of none but those would count no rows).
        own = [n for n in self._names if n not in partitions]
        parts = [p for p in (own[i :: self._read_parts] for i in range(self._read_parts)) if p] or [[]]
        parts[0] += [n for n in self._names if n in partitions]

        def read(names: list[str]) -> pa.Table:
            wanted = self._dictionary if self.read_dictionary else set()
            plain = self._dataset.plain_chunks.get((segment.file, segment.row_group), frozenset())
            encoded = [n for n in names if n in wanted and n not in self._plain and n not in plain]
            table = self._dataset.read_row_group(segment.file, segment.row_group, names, use_threads, encoded)
            self._plain.update(n for n in encoded if _many_distinct(table.column(n)))
            return table

        def finish(table: pa.Table) -> pa.Table:
            self._counters.read(table.num_rows, table.nbytes)
            return _segment_rows(table, segment)

        cache[index] = _LazyTable(parts, read, finish, self._names)
        return cache[index]

    def _convert(self, batch: int, plans: list[_PiecePlan], pin: bool) -> "tuple[Batch, float] | _Bad":
        """A worker's part: the batch's row groups read (those no worker has), its rows
        cut, checked and converted, and their weight sum (or the line of the first bad
        value, or of a row group whose footer lies)."""
        try:
            pieces = [plan.piece() for plan in plans]
        except RowCountError as e:  # the rank reading it flags the batch: every rank stops there
            return _Bad(f"{e} (batch {batch} of the split)")
        table = _concat([p.table for p in pieces])
        try:
            rows = self._columns.convert(table)
        except ColumnValueError as e:
            suffix = f" (batch {batch} of the split)" if self._world_size > 1 else ""
            return _Bad(f"{self._value_message(pieces, e)}{suffix}")
        self._counters.decoded(table.num_rows)
        if rows.dense_nulls.any():
            self._count_nulls(rows.dense_nulls)
        if self._collisions is not None:
            # Training's counter: per table, a history's ids with its item's (they are looked
            # up and trained in its table: its collisions, its seen-id filter). An evaluation's
            # unseen ids: the categorical features' own, as serving counts them.
            # Training's counts are sets (a filter's bits, distinct values): each key once
            # is the same (a dictionary-encoded column lists each entry read once); the
            # unseen ids of an evaluation are counted per id.
            training = self._collisions.counts_collisions
            columns = self._columns
            if training:
                self._collisions.add(columns.table_keys(rows.distinct_keys or rows.keys))
            else:
                self._collisions.add(rows.keys[: len(columns.sparse)])
        result = self._builder.bags(
            rows.dense, rows.ids, rows.lengths, rows.labels, rows.weights, 1.0, flat_ids=rows.flat_ids
        )
        if pin:
            result = result.pin_memory()
        # The normalizer is the ranks' sum: the training thread sets it.
        weight_sum = 0.0 if rows.weights is None else float(np.asarray(rows.weights, dtype=np.float64).sum())
        return result, weight_sum

    def _count_nulls(self, counts: np.ndarray) -> None:
        with self._nulls_lock:
            self._dense_nulls += counts
            fresh = [n for n, c in zip(self._columns.dense, counts) if c and n not in _NULLS_REPORTED]
            if not (fresh and self._rank == 0):
                return
            _NULLS_REPORTED.update(fresh)
        # Only the training loader counts for the evaluations' lines (it alone
        # has a collision counter); --mode test|validate reads no training row.
        counts_note = (
            " (the training rows' counts per column follow each evaluation, and go to the run log with --log_path)"
            if self._collisions is not None and self._collisions.counts_collisions
            else ", as in training"
        )
        print(f"note: dense column(s) {', '.join(fresh)} hold nulls, read as 0{counts_note}", file=sys.stderr)

    def _value_message(self, pieces: list[_Piece], error: ColumnValueError) -> str:
        """``error`` (its row counted in the pieces' rows) naming file, row group, row and column."""
        return f"{self._where(pieces, error.row)}, column {error.column}: {error.what}"

    def _where(self, pieces: list[_Piece], row: int) -> str:
        for piece in pieces:
            if row < piece.table.num_rows:
                return piece.where(self._dataset, self._segments, row)
            row -= piece.table.num_rows
        raise AssertionError(f"row {row} is not in the batch")


def _concat(tables: Sequence[pa.Table]) -> pa.Table:
    """The tables' rows one after the other. A column read dictionary-encoded in some and
    plain in others (the loader stopped reading it so: `ParquetLoader`) is decoded in all."""
    if len(tables) == 1:
        return tables[0]
    if any(t.schema != tables[0].schema for t in tables[1:]):
        plain = pa.schema(
            [f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in tables[0].schema]
        )
        tables = [t.cast(plain) for t in tables]
    return pa.concat_tables(tables)


def _many_distinct(column: pa.ChunkedArray) -> bool:
    """Whether a column read dictionary-encoded holds more than `DICTIONARY_SHARE` distinct
    values per value in a chunk."""
    return any(
        pa.types.is_dictionary(c.type) and len(c.dictionary) > DICTIONARY_SHARE * max(len(c) - c.null_count, 1)
        for c in column.chunks
    )


def dictionary_candidates(schema: pa.Schema, names: Sequence[str]) -> list[str]:
    """The columns of ``names`` a loader may read dictionary-encoded: string and binary
    ids, not lists (pyarrow reads only byte arrays so)."""
    return [
        n
        for n in names
        if schema.get_field_index(n) >= 0
        and id_kind(schema.field(n).type) == "string"
        and not pa.types.is_list(schema.field(n).type)
        and not pa.types.is_large_list(schema.field(n).type)
    ]


def plain_chunks(meta: pq.FileMetaData, names: Sequence[str]) -> list[frozenset[str]]:
    """Per row group of a file, the columns of ``names`` whose chunk its footer shows to
    be better read plain, before anything of it is read:

    - its statistics count more distinct values than `DICTIONARY_SHARE` of its values;
    - it has no dictionary page and no dictionary-encoded pages (written plain: a
      dictionary read would hash every value to build one);
    - its data pages hold more bytes than dictionary indices of its values could (the
      writer fell back to plain pages when the dictionary outgrew its limit: pyarrow's
      dictionary read then hashes every value of those pages).

    The others are read dictionary-encoded, and `ParquetLoader` still reads a column
    plain from the chunk on that shows it mostly distinct. Either way the batches are
    the same: this decides only the speed."""
    wanted = set(names)
    # Only the chunks of those columns (a wide table's others are never looked at).
    leaves = [(j, path) for j in range(meta.num_columns) if (path := meta.schema.column(j).path) in wanted]
    result: list[frozenset[str]] = []
    for group in range(meta.num_row_groups):
        row_group = meta.row_group(group)
        result.append(frozenset(path for j, path in leaves if _reads_plain(row_group.column(j))))
    return result


def _reads_plain(chunk: pq.ColumnChunkMetaData) -> bool:
    values = chunk.num_values
    stats = chunk.statistics if chunk.is_stats_set else None
    nulls = stats.null_count if stats is not None and stats.has_null_count else 0
    if (
        stats is not None
        and stats.has_distinct_count
        and stats.distinct_count > DICTIONARY_SHARE * max(values - nulls, 1)
    ):
        return True
    dictionary_pages = any(e in ("PLAIN_DICTIONARY", "RLE_DICTIONARY") for e in chunk.encodings)
    if not chunk.has_dictionary_page:
        # Some writers leave the dictionary page's offset out (the page then starts the
        # chunk): only a chunk with no dictionary-encoded page is known to be plain.
        return not dictionary_pages
    start, data = chunk.dictionary_page_offset, chunk.data_page_offset
    if not (start is not None and data is not None and 0 <= start < data):
        return False  # offsets that do not say where the dictionary ends: not known
    data_bytes = chunk.total_compressed_size - (data - start)
    index_bits = max(values - 1, 1).bit_length() + 1  # an index and a definition level
    return data_bytes > _INDEX_BYTES_FACTOR * values * index_bits / 8 + _INDEX_BYTES_SLACK


def _segment_rows(table: pa.Table, segment: Segment) -> pa.Table:
    """A segment's rows of its row group's ``table``: a slice (no copy) when they are
    consecutive, as a row-fraction split's are."""
    rows = segment.rows
    if rows is None:
        return table
    if len(rows) and int(rows[-1]) - int(rows[0]) + 1 == len(rows):  # ascending and distinct
        return table.slice(int(rows[0]), len(rows))
    return table.take(pa.array(rows))


def _agreed(result: tuple[str | None, float]) -> tuple[str | None, float]:
    """An agreement already made (`StartedAgreement`'s second half)."""
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
