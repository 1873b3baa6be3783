"""History columns from a click log, leak-free: each row's user's earlier positive items.

    python -m data.histories --parquet_path IN --output_dir OUT --user_column U --item_column I \\
        --time_column T [--positive_column L] [--max_history 50] [--aggregates] [--overwrite]

For every row of the Parquet log ``IN`` (read as ``--parquet_path`` is everywhere:
data/parquet/files.py) it writes the row, unchanged, plus a list column ``I_history``:
the items of the same user's positive events strictly before the row's time, newest
last, the last ``--max_history`` of them. Events at the same time are not in each
other's history (a row never sees itself, nor anything logged with it). An event is
positive when ``--positive_column`` is true or 1 (without it, every event is). A null
user has no history and gives none; a null item, a null positive value, are no
positive event.

``OUT`` has the input's layout: the same files under the same relative paths (Hive
partitions such as ``date=2026-11-01/`` included), the same row groups, each file's own
columns then the new ones. ``--aggregates`` adds what a tree can take of the same
history, leak-free too: ``U_past_events``, ``U_past_positives``, ``U_past_positive_rate``
and ``I_past_events``, ``I_past_positives``, ``I_past_positive_rate`` (U and I the user
and item columns' names): the events and positive events of the row's user (item)
strictly before the row's time, and their ratio (null without a past event).

Streaming and memory: the row groups are taken in time order, in blocks: row groups
whose time ranges overlap form one block, the rows of which are sorted by user and
time together; a user's last ``--max_history`` positive items are carried from block
to block (a history spans days). The events at a block's latest time are held and
come again with the next block, whose first rows may tie with them. Memory is bounded by

    users x max_history x 4 bytes                             the carried histories
    + distinct users and items (each value once)              their codes
    + about 40 bytes x the rows of the largest block          keys of the block, held ties
    + one row group of every column, being written

A log appended in time (row groups in time order, as lakes write them) has blocks of
one row group. A log whose row groups all span the same time (partitioned by
user, say) is one block: sort it by time first. The summary line says the largest
block's rows. Row times are taken from row-group statistics (or a partition value) to
order the row groups, as the time split does (data/parquet/split.py).
"""

import os
import posixpath
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from common.atomic import atomic_dir
from common.cli import OneLineParser, cli_main, positive_int
from common.config_flags import add_flags, config_values, flag
from common.errors import BadInput
from common.url_paths import is_url, redacted
from data.parquet.files import (
    FileFooter,
    check_same_types,
    file_schema,
    list_files,
    read_footers,
    read_row_group,
)
from data.parquet.split import TimeIndex, time_kind, time_numbers

PROG = "python -m data.histories"
HISTORY_SUFFIX = "_history"
AGGREGATE_SUFFIXES = ("_past_events", "_past_positives", "_past_positive_rate")
_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class HistoryFlags:
    """The flags of ``python -m data.histories``."""

    parquet_path: str = flag(help="the click log: a Parquet file, a directory or a glob (as for training)")
    output_dir: str = flag(help="where the log with its history column goes, in the input's layout (local)")
    user_column: str = flag(help="the column naming the user whose history a row has")
    item_column: str = flag(help="the item column; its history column is ITEM_history")
    time_column: str = flag(help="the time of a row: timestamp, date, integer, or a partition column such as date")
    positive_column: str | None = flag(
        None, help="an event enters histories when this column is true or 1 (default: every event does)"
    )
    max_history: int = flag(50, parse=positive_int, help="the most items a history holds (the newest)")
    aggregates: bool = flag(False, help="also write the user's and the item's past events, positives and positive rate")
    overwrite: bool = flag(False, help="replace a non-empty --output_dir (else refused)")


def history_column(item_column: str) -> str:
    """The name of the history column of ``item_column``."""
    return item_column + HISTORY_SUFFIX


def aggregate_columns(user_column: str, item_column: str) -> list[str]:
    """The columns ``--aggregates`` adds, in order."""
    return [key + suffix for key in (user_column, item_column) for suffix in AGGREGATE_SUFFIXES]


def _key_type_error(kind: pa.DataType) -> str | None:
    """Why a column of type ``kind`` cannot key a user or an item, or None."""
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return "a list (a history is built from one item a row)"
    if not (
        pa.types.is_integer(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    ):
        return "neither integers nor strings"
    return None


class Vocabulary:
    """Dense codes 0, 1, ... of the values seen, in order of first sight (a user's or
    an item's), and the values of codes. Integers are looked up in a sorted array,
    strings in a dict."""

    def __init__(self, kind: pa.DataType) -> None:
        self.kind = kind
        self._integers = pa.types.is_integer(kind)
        dtype = kind.to_pandas_dtype() if self._integers else object
        self._sorted = np.zeros(0, dtype=dtype)  # integers: the values seen, sorted
        self._sorted_codes = _EMPTY
        self._by_code = np.zeros(0, dtype=dtype)  # integers: the values in code order
        self._index: dict[object, int] = {}  # other ids
        self._chunks: list[pa.Array] = []

    def __len__(self) -> int:
        return len(self._by_code) if self._integers else len(self._index)

    def codes(self, values: pa.Array) -> np.ndarray:
        """Each value's code (-1 for a null), new values added."""
        null = pc.is_null(values).to_numpy(zero_copy_only=False)
        out = np.full(len(values), -1, dtype=np.int64)
        if null.all():
            return out
        if self._integers:
            given = values.filter(pc.invert(pc.is_null(values))).to_numpy(zero_copy_only=False)
            unique, inverse = np.unique(given, return_inverse=True)
            at = np.searchsorted(self._sorted, unique)
            found = at < len(self._sorted)
            found[found] = self._sorted[at[found]] == unique[found]
            codes = np.empty(len(unique), dtype=np.int64)
            codes[found] = self._sorted_codes[at[found]]
            fresh = np.arange(len(self), len(self) + int((~found).sum()), dtype=np.int64)
            codes[~found] = fresh
            self._sorted = np.insert(self._sorted, at[~found], unique[~found])
            self._sorted_codes = np.insert(self._sorted_codes, at[~found], fresh)
            self._by_code = np.concatenate([self._by_code, unique[~found]])
            out[~null] = codes[inverse.reshape(-1)]
            return out
        unique = pc.unique(values.drop_null())
        seen = unique.to_pylist()
        new = [v for v in seen if v not in self._index]
        for value in new:
            self._index[value] = len(self._index)
        if new:
            self._chunks.append(pa.array(new, type=self.kind))
            if len(self._chunks) > 64:  # ChunkedArray.take walks the chunks
                self._chunks = [pa.concat_arrays(self._chunks)]
        known = np.fromiter((self._index[v] for v in seen), dtype=np.int64, count=len(seen))
        where = pc.index_in(values, value_set=unique).fill_null(-1).to_numpy(zero_copy_only=False)
        return np.where(where >= 0, known[np.maximum(where, 0)], -1)

    def values(self, codes: np.ndarray) -> pa.Array:
        """The values of ``codes`` (all valid)."""
        if self._integers:
            return pa.array(self._by_code[codes], type=self.kind)
        if not self._chunks:
            return pa.array([], type=self.kind)
        return pa.chunked_array(self._chunks, type=self.kind).take(pa.array(codes)).combine_chunks()


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(s, s + n)`` for each (s, n)."""
    total = int(lengths.sum())
    if total == 0:
        return _EMPTY
    ends = np.cumsum(lengths)
    shift = np.repeat(starts - (ends - lengths), lengths)
    return np.arange(total, dtype=np.int64) + shift


@dataclass
class _Sorted:
    """A block's rows sorted by key then time (then place in the log): ``order`` maps sorted to
    block rows; ``key_first[r]`` and ``tie_first[r]`` are the sorted positions of the
    first row of row r's key and of its (key, time) group."""

    order: np.ndarray
    keys: np.ndarray
    key_first: np.ndarray
    tie_first: np.ndarray
    run: np.ndarray  # each sorted row's key run, 0, 1, ...
    run_keys: np.ndarray

    @classmethod
    def of(cls, keys: np.ndarray, times: np.ndarray, positions: np.ndarray) -> "_Sorted":
        """``positions``: each row's place in the log (files in path order, row groups,
        rows), which orders events at one time."""
        n = len(keys)
        order = np.lexsort((positions, times, keys))
        k, t = keys[order], times[order]
        new_key = np.ones(n, dtype=bool)
        new_key[1:] = k[1:] != k[:-1]
        new_tie = new_key.copy()
        new_tie[1:] |= t[1:] != t[:-1]
        positions = np.arange(n)
        key_first = np.maximum.accumulate(np.where(new_key, positions, 0))
        tie_first = np.maximum.accumulate(np.where(new_tie, positions, 0))
        return cls(order, k, key_first, tie_first, np.cumsum(new_key) - 1, k[new_key])

    def before(self, counted: np.ndarray) -> np.ndarray:
        """Per sorted row: how many rows of its key strictly before its time are ``counted``."""
        exclusive = np.cumsum(counted) - counted
        return exclusive[self.tie_first] - exclusive[self.key_first]


@dataclass
class _Counts:
    """Events and positive events per code so far (an aggregate's carried state)."""

    events: np.ndarray = field(default_factory=lambda: _EMPTY.copy())
    positives: np.ndarray = field(default_factory=lambda: _EMPTY.copy())

    def past(
        self, codes: np.ndarray, times: np.ndarray, positions: np.ndarray, positive: np.ndarray, commit: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each row's key's events and positives strictly before its time (0 for a null
        key); then counts the rows of ``commit`` in (the others come again, held)."""
        size = max(int(codes.max(initial=-1)) + 1, 1)  # a null key looks up code 0, then drops it
        if size > len(self.events):
            self.events = np.pad(self.events, (0, size - len(self.events)))
            self.positives = np.pad(self.positives, (0, size - len(self.positives)))
        ordered = _Sorted.of(codes, times, positions)
        valid = ordered.keys >= 0
        pos = positive[ordered.order] & valid
        safe = np.maximum(ordered.keys, 0)
        events = np.where(valid, ordered.before(valid.astype(np.int64)) + self.events[safe], 0)
        positives = np.where(valid, ordered.before(pos.astype(np.int64)) + self.positives[safe], 0)
        counted = valid & commit[ordered.order]
        self.events += np.bincount(ordered.keys[counted], minlength=len(self.events))
        self.positives += np.bincount(ordered.keys[pos & counted], minlength=len(self.positives))
        out_events, out_positives = np.empty_like(events), np.empty_like(positives)
        out_events[ordered.order], out_positives[ordered.order] = events, positives
        return out_events, out_positives


@dataclass
class BlockHistories:
    """The histories of a block's rows: row r's history is the items of codes
    ``timeline[start[r] : start[r] + length[r]]``."""

    timeline: np.ndarray
    start: np.ndarray
    length: np.ndarray


class HistoryState:
    """Each user's last ``max_history`` positive items (codes), carried from block to
    block: the only state that spans the log, users x max_history x 4 bytes.

    Args:
        max_history: the most items a history holds.
    """

    def __init__(self, max_history: int) -> None:
        self.max_history = max_history
        self.tails = np.zeros((0, max_history), dtype=np.int32)  # a user's items, oldest first
        self.lengths = np.zeros(0, dtype=np.int64)

    def _grow(self, users: int) -> None:
        if users > len(self.lengths):
            size = max(users, 2 * len(self.lengths))
            self.tails = np.concatenate([self.tails, np.zeros((size - len(self.tails), self.max_history), np.int32)])
            self.lengths = np.pad(self.lengths, (0, size - len(self.lengths)))

    def advance(
        self,
        users: np.ndarray,
        items: np.ndarray,
        times: np.ndarray,
        positions: np.ndarray,
        positive: np.ndarray,
        commit: np.ndarray,
    ) -> BlockHistories:
        """The histories of a block's rows (user and item codes, -1 null; times; places
        in the log; whether each is a positive event), every event of the block at or after every event
        carried; then carries the block's positives of ``commit`` (the block's events
        at its latest time are held instead, and come again with the next block: they
        are not in the history of a row at that time, and are in a later row's)."""
        ordered = _Sorted.of(users, times, positions)
        valid = ordered.keys >= 0
        pos = positive[ordered.order] & valid & (items[ordered.order] >= 0)
        run_users = np.maximum(ordered.run_keys, 0)
        self._grow(int(run_users.max(initial=0)) + 1)
        carried_lengths = np.where(ordered.run_keys >= 0, self.lengths[run_users], 0)
        block_lengths = np.bincount(ordered.run[pos], minlength=len(run_users)).astype(np.int64)
        totals = carried_lengths + block_lengths
        offsets = np.cumsum(totals) - totals
        # A user's timeline: the carried items, then the block's positives in time order.
        timeline = np.empty(int(totals.sum()), dtype=np.int64)
        within = _ranges(np.zeros_like(carried_lengths), carried_lengths)
        timeline[_ranges(offsets, carried_lengths)] = self.tails[np.repeat(run_users, carried_lengths), within]
        rank = np.cumsum(pos) - pos
        rank -= rank[ordered.key_first]
        run_pos = ordered.run[pos]
        timeline[offsets[run_pos] + carried_lengths[run_pos] + rank[pos]] = items[ordered.order][pos]
        available = carried_lengths[ordered.run] + ordered.before(pos.astype(np.int64))
        length = np.where(valid, np.minimum(available, self.max_history), 0)
        end = offsets[ordered.run] + available
        # A user's positives at the block's latest time end its timeline: they are held.
        committed = np.bincount(ordered.run[pos & commit[ordered.order]], minlength=len(run_users)).astype(np.int64)
        runs = np.flatnonzero((committed > 0) & (ordered.run_keys >= 0))
        kept = np.minimum(carried_lengths[runs] + committed[runs], self.max_history)
        source = offsets[runs] + carried_lengths[runs] + committed[runs] - kept
        rows = np.repeat(run_users[runs], kept)
        self.tails[rows, _ranges(np.zeros_like(kept), kept)] = timeline[_ranges(source, kept)]
        self.lengths[run_users[runs]] = kept
        start, out_length = np.empty_like(end), np.empty_like(length)
        start[ordered.order], out_length[ordered.order] = end - length, length
        return BlockHistories(timeline, start, out_length)


def time_blocks(
    bounds: Sequence[Sequence[tuple[int, int]]], row_counts: Sequence[Sequence[int]]
) -> list[list[tuple[int, int]]]:
    """The (file, row group) pairs in blocks, in time order: row groups whose time
    ranges ``bounds[f][g]`` (min, max) overlap are in one block, so every event of a
    block is at or after every event of the blocks before (at: a tie at the boundary,
    which `HistoryState` holds). A row group without rows is a block of its own."""
    spans = sorted(
        (lo, hi, f, g) for f, per_file in enumerate(bounds) for g, (lo, hi) in enumerate(per_file) if row_counts[f][g]
    )
    blocks: list[list[tuple[int, int]]] = [
        [(f, g)] for f, per_file in enumerate(row_counts) for g, n in enumerate(per_file) if not n
    ]
    latest = None
    for lo, hi, f, g in spans:
        if latest is None or lo >= latest:
            blocks.append([])
            latest = hi
        blocks[-1].append((f, g))
        latest = max(latest, hi)
    # Events at the same time keep the log's order (files, row groups, rows): a block's
    # row groups are read in that order.
    return [sorted(block) for block in blocks]


@dataclass
class _Table:
    """The input table: its files' footers, schema and the checked columns."""

    filesystem: pafs.FileSystem
    root: str
    footers: list[FileFooter]
    metadata: list[pq.FileMetaData]
    schema: pa.Schema
    time_kind: str


def _missing(flag_name: str, column: str, schema: pa.Schema, file: str) -> BadInput:
    names = ", ".join(schema.names)
    return BadInput(f"{file}: {flag_name} {column}: no such column (the table has {names})")


def open_table(flags: HistoryFlags) -> _Table:
    """Lists and checks the input: its columns and their types.

    Raises:
        BadInput: a missing column, a user or item column of a list or other type
            that is no id, a time column that is not orderable, a positive column that
            is not boolean or a number, a history column that exists already.
    """
    filesystem, root, files = list_files(flags.parquet_path)
    footers, metadata, schema = read_footers(filesystem, root, files)
    first = footers[0].path
    columns = {
        "--user_column": flags.user_column,
        "--item_column": flags.item_column,
        "--time_column": flags.time_column,
    }
    if flags.positive_column is not None:
        columns["--positive_column"] = flags.positive_column
    for name, column in columns.items():
        if column not in schema.names:
            raise _missing(name, column, schema, first)
    check_same_types(footers, metadata, schema, list(columns.values()))
    for name in ("--user_column", "--item_column"):
        kind = schema.field(columns[name]).type
        reason = _key_type_error(kind)
        if reason is not None:
            raise BadInput(
                f"{first}: {name} {columns[name]} is {kind}: {reason}; give a column of integer or string ids"
            )
    kind = time_kind(schema.field(flags.time_column).type)
    if kind is None:
        raise BadInput(
            f"{first}: --time_column {flags.time_column} is {schema.field(flags.time_column).type}, which has no "
            "order in time; give a timestamp, date or integer column"
        )
    if flags.positive_column is not None:
        positive = schema.field(flags.positive_column).type
        if not (pa.types.is_boolean(positive) or pa.types.is_integer(positive) or pa.types.is_floating(positive)):
            raise BadInput(
                f"{first}: --positive_column {flags.positive_column} is {positive}; give a boolean or 0/1 column"
            )
    added = [history_column(flags.item_column)]
    if flags.aggregates:
        added += aggregate_columns(flags.user_column, flags.item_column)
    for column in added:
        if column in schema.names:
            raise BadInput(f"{first}: column {column} exists already (a log with histories built once is given again?)")
    if not sum(f.num_rows for f in footers):
        raise BadInput(f"--parquet_path {redacted(flags.parquet_path)}: the table has no rows")
    return _Table(filesystem, root, footers, metadata, schema, kind)


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def check_output_dir(flags: HistoryFlags) -> None:
    """Refuses an output that is a URL, a file, a non-empty directory (unless
    ``--overwrite``), or one holding or inside the input."""
    out = flags.output_dir
    if is_url(out):
        raise BadInput(f"--output_dir {redacted(out)}: histories are written to a local directory")
    if os.path.exists(out) and not os.path.isdir(out):
        raise BadInput(f"--output_dir {out}: not a directory")
    if not is_url(flags.parquet_path):
        given = flags.parquet_path
        wildcard = re.search(r"[*?\[]", given)
        if wildcard:  # a glob: the directory its literal part names
            given = posixpath.dirname(given[: wildcard.start()]) or "."
        given = os.path.realpath(given)
        target = os.path.realpath(out)
        if _inside(target, given) or _inside(given, target):
            raise BadInput(
                f"--output_dir {out}: holds or is inside --parquet_path {flags.parquet_path}; give a directory apart"
            )
    if os.path.isdir(out) and os.listdir(out) and not flags.overwrite:
        raise BadInput(f"--output_dir {out}: not empty; give a new or empty directory, or --overwrite to replace it")


def _relative(table: _Table, footer: FileFooter) -> str:
    if footer.path.startswith(table.root.rstrip("/") + "/"):
        return footer.path[len(table.root.rstrip("/")) + 1 :]
    return posixpath.basename(footer.path)


class _Writer:
    """Writes the output files, each row group when its new columns are ready, in file
    order (a row group finished early waits for the ones before it)."""

    def __init__(self, table: _Table, staging: str, fields: list[pa.Field]) -> None:
        self.table = table
        self.staging = staging
        self.fields = fields
        self.pending: dict[tuple[int, int], list[pa.Array]] = {}
        self.next_group = [0] * len(table.footers)
        self.writers: dict[int, pq.ParquetWriter] = {}

    def add(self, file: int, row_group: int, columns: list[pa.Array]) -> None:
        self.pending[(file, row_group)] = columns
        footer = self.table.footers[file]
        while (file, self.next_group[file]) in self.pending:
            self._write(file, self.next_group[file], self.pending.pop((file, self.next_group[file])))
            self.next_group[file] += 1
        if self.next_group[file] == len(footer.row_group_rows):
            self._close(file)

    def _write(self, file: int, row_group: int, columns: list[pa.Array]) -> None:
        footer, meta = self.table.footers[file], self.table.metadata[file]
        own = meta.schema.to_arrow_schema()
        rows = read_row_group(
            self.table.filesystem, footer, file_schema(footer, meta, self.table.schema), row_group, own.names
        )
        for f, column in zip(self.fields, columns):
            rows = rows.append_column(f, column)
        self._writer(file).write_table(rows, row_group_size=max(rows.num_rows, 1))

    def _writer(self, file: int) -> pq.ParquetWriter:
        if file not in self.writers:
            own = self.table.metadata[file].schema.to_arrow_schema()
            path = os.path.join(self.staging, _relative(self.table, self.table.footers[file]))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            schema = pa.schema(list(own) + self.fields, metadata=own.metadata)
            self.writers[file] = pq.ParquetWriter(path, schema)
        return self.writers[file]

    def _close(self, file: int) -> None:
        self._writer(file).close()  # a file without row groups is written too

    def close_empty_files(self) -> None:
        for file, footer in enumerate(self.table.footers):
            if not footer.row_group_rows:
                self._close(file)


def _block_keys(table: _Table, flags: HistoryFlags, block: list[tuple[int, int]]) -> tuple[pa.Table, list[int]]:
    """The key columns of a block's row groups, concatenated; and each row group's rows."""
    names = [flags.user_column, flags.item_column, flags.time_column]
    if flags.positive_column is not None:
        names.append(flags.positive_column)
    parts = []
    for f, g in block:
        part = read_row_group(table.filesystem, table.footers[f], table.schema, g, list(dict.fromkeys(names)))
        times = part.column(flags.time_column)
        if times.null_count:
            row = int(np.argmax(pc.is_null(times).to_numpy(zero_copy_only=False)))
            footer = table.footers[f]
            raise BadInput(
                f"{footer.path}: row group {g}, row {footer.first_row(g) + row}, column {flags.time_column}: "
                "the time is null"
            )
        parts.append(part)
    return pa.concat_tables(parts), [p.num_rows for p in parts]


def _positive(keys: pa.Table, flags: HistoryFlags) -> np.ndarray:
    if flags.positive_column is None:
        return np.ones(keys.num_rows, dtype=bool)
    values = keys.column(flags.positive_column)
    if pa.types.is_boolean(values.type):
        hit = values
    else:
        hit = pc.equal(values, pa.scalar(1).cast(values.type))
    return hit.fill_null(False).to_numpy(zero_copy_only=False).astype(bool)


def _rate(events: np.ndarray, positives: np.ndarray) -> pa.Array:
    return pa.array(positives / np.maximum(events, 1), mask=events == 0, type=pa.float64())


@dataclass
class _Events:
    """Events as codes: user and item (-1 null), time, place in the log, whether positive."""

    users: np.ndarray
    items: np.ndarray
    times: np.ndarray
    positions: np.ndarray
    positive: np.ndarray

    @classmethod
    def none(cls) -> "_Events":
        return cls(_EMPTY, _EMPTY, _EMPTY, _EMPTY, np.zeros(0, dtype=bool))

    def __len__(self) -> int:
        return len(self.users)

    def then(self, later: "_Events") -> "_Events":
        return _Events(*(np.concatenate([a, b]) for a, b in zip(vars(self).values(), vars(later).values())))

    def select(self, rows: np.ndarray) -> "_Events":
        return _Events(*(a[rows] for a in vars(self).values()))


@dataclass
class HistorySummary:
    """What a run wrote: rows, files, users, mean history length, the largest block."""

    rows: int
    files: int
    users: int
    mean_history: float
    largest_block_rows: int


def build_histories(flags: HistoryFlags) -> HistorySummary:
    """Writes ``flags.output_dir``: the log with its history column (and aggregates),
    staged beside it and renamed into place when complete.

    Raises:
        BadInput: what `open_table` and `check_output_dir` refuse, a null time.

    Example::

        build_histories(HistoryFlags("clicks/", "with_history/", "user", "item", "ts", "label"))
    """
    check_output_dir(flags)
    table = open_table(flags)
    footers = table.footers
    index = TimeIndex(
        footers,
        table.metadata,
        table.schema,
        flags.time_column,
        lambda f, g: read_row_group(table.filesystem, footers[f], table.schema, g, [flags.time_column]).column(0),
    )
    item_type = table.schema.field(flags.item_column).type
    fields = [pa.field(history_column(flags.item_column), pa.list_(item_type), nullable=False)]
    if flags.aggregates:
        kinds = (pa.int64(), pa.int64(), pa.float64())
        fields += [
            pa.field(name, kind, nullable=kind == pa.float64())
            for name, kind in zip(aggregate_columns(flags.user_column, flags.item_column), kinds * 2)
        ]
    users = Vocabulary(table.schema.field(flags.user_column).type)
    items = Vocabulary(item_type)
    state = HistoryState(flags.max_history)
    user_counts, item_counts = _Counts(), _Counts()
    rows = history_items = largest = 0
    try:
        with atomic_dir(flags.output_dir, replace=flags.overwrite) as staging:
            writer = _Writer(table, staging, fields)
            writer.close_empty_files()
            held = _Events.none()
            file_starts = np.cumsum([0] + [f.num_rows for f in footers])
            for block in time_blocks(index.bounds, [f.row_group_rows for f in footers]):
                keys, sizes = _block_keys(table, flags, block)
                if not keys.num_rows:  # a row group without rows: its block holds nothing else
                    nothing = BlockHistories(_EMPTY, _EMPTY, _EMPTY)
                    for f, g in block:
                        writer.add(f, g, _columns(nothing, items, [_EMPTY] * (4 * flags.aggregates), 0, 0))
                    continue
                events = held.then(
                    _Events(
                        users.codes(keys.column(flags.user_column).combine_chunks()),
                        items.codes(keys.column(flags.item_column).combine_chunks()),
                        time_numbers(keys.column(flags.time_column), table.time_kind),
                        np.concatenate(
                            [file_starts[f] + footers[f].first_row(g) + np.arange(n) for (f, g), n in zip(block, sizes)]
                        ),
                        _positive(keys, flags),
                    )
                )
                commit = events.times < events.times.max()
                histories = state.advance(
                    events.users, events.items, events.times, events.positions, events.positive, commit
                )
                extra: list[np.ndarray] = []
                if flags.aggregates:
                    extra = [
                        *user_counts.past(events.users, events.times, events.positions, events.positive, commit),
                        *item_counts.past(events.items, events.times, events.positions, events.positive, commit),
                    ]
                first = len(held)  # the held events come first and are not written again
                for (f, g), size in zip(block, sizes):
                    writer.add(f, g, _columns(histories, items, extra, first, first + size))
                    first += size
                rows += keys.num_rows
                history_items += int(histories.length[len(held) :].sum())
                largest = max(largest, len(events))
                held = events.select(~commit)
    except OSError as e:  # a full disk, say
        raise BadInput(f"--output_dir {flags.output_dir}: cannot write ({e.strerror or e})") from e
    return HistorySummary(rows, len(footers), len(users), history_items / max(rows, 1), largest)


def _columns(
    histories: BlockHistories, items: Vocabulary, extra: list[np.ndarray], first: int, stop: int
) -> list[pa.Array]:
    """The new columns of the block's rows [first, stop)."""
    lengths = histories.length[first:stop]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    codes = histories.timeline[_ranges(histories.start[first:stop], lengths)]
    columns: list[pa.Array] = [pa.ListArray.from_arrays(pa.array(offsets), items.values(codes))]
    for k in range(0, len(extra), 2):
        events, positives = extra[k][first:stop], extra[k + 1][first:stop]
        columns += [pa.array(events), pa.array(positives), _rate(events, positives)]
    return columns


@cli_main(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_flags(parser, HistoryFlags)
    flags = HistoryFlags(**config_values(HistoryFlags, parser.parse_args(argv)))
    summary = build_histories(flags)
    print(
        f"histories: {summary.rows} rows in {summary.files} files at {flags.output_dir} ({summary.users} users, "
        f"{summary.mean_history:.1f} items a history on average, largest block {summary.largest_block_rows} rows); "
        f"train with --parquet_path {flags.output_dir} "
        f"--sequence_columns {history_column(flags.item_column)}:{flags.item_column}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
