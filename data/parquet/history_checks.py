"""Bad input for training on histories: what a history column must be, checked before use.

The Parquet source (data/sources/parquet.py) runs these checks: the type checks on every
file's schema (`data.parquet.columns.ParquetColumns.check_schema`, through
`data.parquet.columns.history_type_error`), and with ``--user_column`` and
``--time_column`` the future check on every row before training (`check_table_histories`).

A history column (``item_history``, as ``python -m data.histories`` writes it) holds, for
each row, items looked up in the same embedding table as the item column. It is refused

- when it is not a list (`check_history_type`, from a file's schema);
- when its elements are of another kind than the item column's: integers against
  strings, say; the same id would hash to another row (integer widths do not matter:
  an integer hashes as its 64-bit pattern, data/parquet/id_hashing.py);
- when a row's history holds the row's own future (`check_history_rows`), when the
  times are known: the row's time, and the time of each (user, item)'s first positive
  event in the same log (`FirstEventTimes`). A history item that the user had no
  positive event of before the row's time, though the log has one at or after it,
  came from the future (a history built with the row itself, or with events logged
  at the same time). A pair the log does not hold passes: a history may come from
  before the log. Training checks against the user's first event of the item of any
  label (``positive_column`` None): a history of positive events only is leak-free
  against it too, whatever made an event positive.

Each refusal is one line: a type names the file and column; a value the file, row
group, row and column (`check_history_row_group`, or `ColumnValueError` with the row in
the block, which the Parquet reader turns into that line).

Example::

    first = FirstEventTimes.from_parquet("clicks/", "user", "item", "ts", "label")
    check_history_type(schema, "item_history", "item", "clicks/part-0.parquet")
    check_history_row_group(footer, 0, table, "item_history", "user", "ts", first)
"""

import datetime
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.errors import BadInput
from data.parquet.columns import ColumnValueError, history_type_error
from data.parquet.files import FileFooter, list_files, read_footers, read_row_group
from data.parquet.split import time_kind, time_numbers

# A pair absent from the lookup: later than any time.
UNKNOWN = np.iinfo(np.int64).max
# Partial lookups merged once this many row groups have added theirs.
_MERGE_EVERY = 32
_USER, _ITEM, _TIME, _ROW = "user", "item", "first_time", "row"


def check_history_type(schema: pa.Schema, history_column: str, item_column: str, file: str) -> None:
    """Refuses a history column that is not a list, or whose elements are another kind
    of id than the item column's (integers against strings or bytes: they hash apart).

    Raises:
        BadInput: ``"FILE: column item_history is int64, but a history column is a list
            of item's ids (list<int64>)"``, or the element kind's mismatch.
    """
    error = history_type_error(
        schema.field(history_column).type, schema.field(item_column).type, history_column, item_column
    )
    if error is not None:
        raise BadInput(f"{file}: {error}")


class FirstEventTimes:
    """When each user first had a positive event of each item, in a log's time numbers
    (data/parquet/split.py `time_numbers`). Memory: one entry per distinct (user, item)
    positive pair.

    Args:
        table: columns user, item, first_time (int64), one row per pair.
        kind: the time column's kind ("timestamp", "date" or "integer"), for messages.
        positive: whether only positive events count (else every event does).
    """

    def __init__(self, table: pa.Table, kind: str, positive: bool = True) -> None:
        self.table = table
        self.kind = kind
        self.positive = positive

    @classmethod
    def from_parquet(
        cls,
        path: str,
        user_column: str,
        item_column: str,
        time_column: str,
        positive_column: str | None = None,
    ) -> "FirstEventTimes":
        """Reads the log at ``path`` (``--parquet_path``'s forms) a row group at a time.

        Raises:
            BadInput: a missing column, a time column that is no time.
        """
        filesystem, root, files = list_files(path)
        footers, _, schema = read_footers(filesystem, root, files)
        return cls.from_row_groups(
            footers,
            schema,
            lambda footer, g, names: read_row_group(filesystem, footer, schema, g, names),
            user_column,
            item_column,
            time_column,
            positive_column,
        )

    @classmethod
    def from_row_groups(
        cls,
        footers: Sequence[FileFooter],
        schema: pa.Schema,
        read: Callable[[FileFooter, int, list[str]], pa.Table],
        user_column: str,
        item_column: str,
        time_column: str,
        positive_column: str | None = None,
    ) -> "FirstEventTimes":
        """Reads the log's files (``footers``, ``schema``: `read_footers`'), a row group at
        a time by ``read(footer, row_group, columns)``.

        Raises:
            BadInput: a missing column, a time column that is no time.
        """
        names = [user_column, item_column, time_column] + ([positive_column] if positive_column else [])
        for name in names:
            if name not in schema.names:
                raise BadInput(
                    f"{footers[0].path}: column {name}: no such column (the table has {', '.join(schema.names)})"
                )
        kind = time_kind(schema.field(time_column).type)
        if kind is None:
            raise BadInput(
                f"{footers[0].path}: column {time_column} is {schema.field(time_column).type}, which is no time"
            )
        partial: list[pa.Table] = []
        for footer in footers:
            for g in range(len(footer.row_group_rows)):
                rows = read(footer, g, list(dict.fromkeys(names)))
                if positive_column is not None:
                    flags = rows.column(positive_column)
                    hit = flags if pa.types.is_boolean(flags.type) else pc.equal(flags, pa.scalar(1).cast(flags.type))
                    rows = rows.filter(pc.fill_null(hit, False))
                times = time_numbers(rows.column(time_column), kind) if rows.num_rows else np.zeros(0, np.int64)
                pairs = pa.table({_USER: rows.column(user_column), _ITEM: rows.column(item_column), _TIME: times})
                partial.append(pairs.drop_null())
                if len(partial) >= _MERGE_EVERY:
                    partial = [_earliest(partial)]
        return cls(_earliest(partial), kind, positive_column is not None)

    def lookup(self, users: pa.Array, items: pa.Array) -> np.ndarray:
        """The first positive time of each (user, item); `UNKNOWN` for a pair not held."""
        key_types = {_USER: self.table.schema.field(_USER).type, _ITEM: self.table.schema.field(_ITEM).type}
        asked = pa.table(
            {
                _USER: users.cast(key_types[_USER]),
                _ITEM: items.cast(key_types[_ITEM]),
                _ROW: np.arange(len(users), dtype=np.int64),
            }
        )
        joined = asked.join(self.table, keys=[_USER, _ITEM], join_type="left outer").sort_by(_ROW)
        return joined.column(_TIME).fill_null(UNKNOWN).to_numpy().astype(np.int64)

    def format(self, value: int) -> str:
        """A time number as a user reads it."""
        if self.kind == "integer":
            return str(value)
        moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=int(value))
        return moment.date().isoformat() if self.kind == "date" else moment.isoformat()


def _earliest(tables: list[pa.Table]) -> pa.Table:
    merged = pa.concat_tables(tables)
    grouped = merged.group_by([_USER, _ITEM], use_threads=False).aggregate([(_TIME, "min")])
    return grouped.rename_columns({f"{_TIME}_min": _TIME}).select([_USER, _ITEM, _TIME])


def check_history_rows(
    table: pa.Table, history_column: str, user_column: str, time_column: str, first: FirstEventTimes
) -> None:
    """Refuses a row whose history holds an item the user first had a positive event of
    at or after the row's time. A null history, user, item or time is not checked.

    Raises:
        ColumnValueError: the row (in ``table``) and the history column, the item, and
            both times.
    """
    histories = table.column(history_column).combine_chunks()
    if len(histories) == 0:
        return
    parents = pc.list_parent_indices(histories).to_numpy().astype(np.int64)
    if len(parents) == 0:
        return
    elements = pc.list_flatten(histories)
    users = table.column(user_column).combine_chunks().take(pa.array(parents))
    row_times = table.column(time_column)
    known = ~pc.is_null(row_times.combine_chunks()).to_numpy(zero_copy_only=False)
    kind = time_kind(row_times.type)
    numbers = np.full(len(row_times), UNKNOWN, dtype=np.int64)
    if kind is not None and known.any():
        numbers[known] = time_numbers(row_times.filter(pa.array(known)), kind)
    firsts = first.lookup(users, elements)
    leak = (firsts != UNKNOWN) & (firsts >= numbers[parents]) & known[parents]
    if not leak.any():
        return
    k = int(np.argmax(leak))
    row = int(parents[k])
    raise ColumnValueError(
        history_column,
        row,
        f"item {elements[k].as_py()!r} is in the history, but user {users[k].as_py()!r} first had "
        f"{'a positive event' if first.positive else 'an event'} of it at {first.format(int(firsts[k]))}, not before the row's time {first.format(int(numbers[row]))}: "
        "the row's own future (python -m data.histories builds histories of earlier events only)",
    )


def check_history_row_group(
    footer: FileFooter,
    row_group: int,
    table: pa.Table,
    history_column: str,
    user_column: str,
    time_column: str,
    first: FirstEventTimes,
) -> None:
    """`check_history_rows` on one row group's rows, the line naming its file, row group,
    row (counted in the file) and column.

    Raises:
        BadInput: ``"FILE: row group G, row R, column item_history: item 17 is in the
            history, but ..."``.
    """
    try:
        check_history_rows(table, history_column, user_column, time_column, first)
    except ColumnValueError as e:
        raise BadInput(
            f"{footer.path}: row group {row_group}, row {footer.first_row(row_group) + e.row}, "
            f"column {e.column}: {e.what}"
        ) from None


def check_table_histories(
    footers: Sequence[FileFooter],
    schema: pa.Schema,
    read: Callable[[FileFooter, int, list[str]], pa.Table],
    sequences: Sequence[tuple[str, str]],
    user_column: str,
    time_column: str,
) -> None:
    """Refuses the first row, in file order, whose history holds the row's own future
    (`check_history_rows`), for each (history, item) of ``sequences``, against the
    user's first event of any label of each item in the same files (`FirstEventTimes`).
    Reads the files twice per history (``read(footer, row_group, columns)``); memory: one
    entry per distinct (user, item) pair of the log.

    Raises:
        BadInput: ``"FILE: row group G, row R, column item_history: item 17 is in the
            history, but ..."``.
    """
    for history, item in sequences:
        first = FirstEventTimes.from_row_groups(footers, schema, read, user_column, item, time_column)
        for footer in footers:
            for g in range(len(footer.row_group_rows)):
                rows = read(footer, g, list(dict.fromkeys([history, user_column, time_column])))
                check_history_row_group(footer, g, rows, history, user_column, time_column, first)
