"""Profile a Parquet lake's categorical columns before training, and size their tables.

    python -m data.profile --parquet_path LAKE [--time_column date] [--sparse_columns 'C*'] \\
        [--target_collision_share 0.01] [--memory_gb 8] [--embedding_dim 64] [--output profile.json]

reads the sparse columns once, one row group at a time, and reports per column: the
distinct ids, the nulls, the share of each day's values whose id was first seen that day,
how many ids cover 90% and 99% of the values, and the expected collision share at
candidate table sizes. It prints a ``--num_embeddings_per_feature`` line meeting
``--target_collision_share`` within ``--memory_gb``, and with ``--output`` writes the
profile as versioned JSON (`read_profile` reads it back). ``--num_embeddings auto`` on
the entry points runs the same sizing on the training split (training/table_sizing.py).

Counting (`IdCounter`): each column keeps, per id (its 64-bit key, data.parquet.id_hashing),
its values, the first day it was seen and its values that day. Exact while a column has
at most ``--exact_ids`` distinct ids; beyond, it keeps only the ids whose sampling hash
(data.parquet.id_collisions' `SAMPLING_SEED`) has its top ``level`` bits 0, ``level``
growing by one each time the sample outgrows the cap. A kept id's counts stay exact
(every value of it was counted from the start), so the distinct count is the sample's
times ``2**level`` with a relative standard error of about ``1/sqrt(sample size)``
(reported per column), and the other figures are the sample's scaled the same way.

Collisions (docs/data.md): with ``D`` distinct ids hashed uniformly onto ``m`` rows, an id
shares its row with another id with probability ``1 - (1 - 1/m)**(D - 1)`` whatever its
frequency, so that is the expected share both of the distinct ids and of the values
(rows) whose id shares its row: the share the trainer's ``id collisions`` line reports.
"""

import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.atomic import write_bytes
from common.cli import OneLineParser, cli_main
from common.config_flags import FlagError, add_flags, config_values, flag, flags_of, option
from common.errors import BadInput
from common.json_fields import (
    BOOLEAN,
    INTEGER,
    NUMBER,
    SHARE,
    SHARES,
    TEXT,
    FileFieldError,
    JsonObject,
    Kind,
    int_list,
    integer,
    one_of,
    optional,
    versioned_json,
)
from data.parquet.id_collisions import SAMPLING_SEED
from data.parquet.id_hashing import hashed
from data.sources.parquet import ParquetOptions

PROFILE_VERSION = 1
# Distinct ids per column counted exactly (about 28 bytes each while merging).
EXACT_IDS = 1 << 17
# Table sizes every column's expected collision share is reported at (besides the suggested one).
CANDIDATE_SIZES = tuple(10**k for k in range(3, 10))
COVERAGES = (0.9, 0.99)
_MERGE_EVERY = 1 << 18  # values buffered before they are merged into the counts
_WHAT = "an id profile (python -m data.profile --output)"
# Bytes of a table weight (models/config.py's --embedding_precision choices).
_PRECISION_BYTES = {"fp32": 4, "fp16": 2}
_DAY_MICROSECONDS = 86_400_000_000
_NO_DAY = np.iinfo(np.int64).min  # no time column: every value on one "day"


def collision_share(distinct: int, table_size: int) -> float:
    """The expected share of ``distinct`` ids (and of their values) that share their row
    with another id when hashed uniformly onto ``table_size`` rows:
    ``1 - (1 - 1/m)**(D - 1)``."""
    if distinct <= 1:
        return 0.0
    if table_size <= 1:
        return 1.0
    return -math.expm1((distinct - 1) * math.log1p(-1.0 / table_size))


def rows_for_share(distinct: int, target: float) -> int:
    """The fewest rows at which `collision_share` is at most ``target`` (0 < target < 1)."""
    if distinct <= 1:
        return 1
    # (1 - 1/m)**(D-1) >= 1 - target  <=>  1/m <= 1 - (1 - target)**(1/(D-1))
    per_row = -math.expm1(math.log1p(-target) / (distinct - 1))
    rows = max(1, math.ceil(1.0 / per_row))
    while rows > 1 and collision_share(distinct, rows - 1) <= target:  # float rounding, either way
        rows -= 1
    while collision_share(distinct, rows) > target:
        rows += 1
    return rows


@dataclass(frozen=True)
class Sizing:
    """Table sizes for a target collision share within a memory budget.

    Args:
        rows: per column.
        shares: the expected collision share of each at its size.
        share: the collision share the sizes meet (the target, or the larger share the
            budget allows).
        table_bytes: the tables' weights at these sizes.
    """

    rows: list[int]
    shares: list[float]
    share: float
    table_bytes: int

    @property
    def flag_line(self) -> str:
        return "--num_embeddings_per_feature " + ",".join(str(r) for r in self.rows)


def suggest_sizes(distinct: Sequence[int], target: float, memory_bytes: int | None, row_bytes: int) -> Sizing:
    """The rows of each table for collision share ``target`` (`rows_for_share`); when
    they outgrow ``memory_bytes`` (None: no budget), every table is sized for the one
    larger share that fits (a bisection over shares), so the features collide alike."""

    def sized(share: float) -> list[int]:
        return [rows_for_share(d, share) for d in distinct]

    def cost(rows: list[int]) -> int:
        return sum(rows) * row_bytes

    share = target
    rows = sized(share)
    if memory_bytes is not None and cost(rows) > memory_bytes:
        low, high = target, 1.0 - 1e-12  # high: a share whose sizes fit (a row or so each)
        if cost(sized(high)) > memory_bytes:
            raise BadInput(
                f"--memory_gb: {memory_bytes:,} bytes is too little for even the smallest tables "
                f"({cost(sized(high)):,} bytes)"
            )
        for _ in range(60):
            middle = (low + high) / 2
            if cost(sized(middle)) > memory_bytes:
                low = middle
            else:
                high = middle
        share, rows = high, sized(high)
    shares = [collision_share(d, r) for d, r in zip(distinct, rows)]
    return Sizing(rows, shares, max(shares, default=0.0) if share != target else target, cost(rows))


class IdCounter:
    """The ids of one column: values, nulls, distinct ids, first days (see the module's
    docstring for the sampling past ``exact_ids``).

    Example::

        counter = IdCounter()
        counter.add(integer_keys(np.array([5, 5, 7])), days=np.array([0, 1, 1]), nulls=2)
        counter.distinct()  # 2
    """

    def __init__(self, exact_ids: int = EXACT_IDS) -> None:
        self._cap = exact_ids
        self.level = 0
        self.values = 0
        self.nulls = 0
        self.values_by_day: dict[int, int] = {}
        # Per kept id, sorted by key: its first day, values that day, values in all.
        self._keys = np.zeros(0, np.uint64)
        self._first = np.zeros(0, np.int64)
        self._first_values = np.zeros(0, np.int64)
        self._total = np.zeros(0, np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (key, day, values) pairs
        self._pending_count = 0

    def add(self, keys: np.ndarray, days: np.ndarray | None, nulls: int) -> None:
        """One block's ids (uint64 keys), the day number of each (None: no time column)
        and its null rows."""
        self.values += len(keys)
        self.nulls += nulls
        days = np.full(len(keys), _NO_DAY, np.int64) if days is None else days.astype(np.int64)
        found, counts = np.unique(days, return_counts=True)
        for day, count in zip(found.tolist(), counts.tolist()):
            self.values_by_day[day] = self.values_by_day.get(day, 0) + count
        keep = self._sampled(keys)
        if keep is not None:
            keys, days = keys[keep], days[keep]
        if len(keys):
            self._pending.append(_pairs(keys, days))
            self._pending_count += len(self._pending[-1][0])
        if self._pending_count >= _MERGE_EVERY:
            self._merge()

    def _sampled(self, keys: np.ndarray) -> np.ndarray | None:
        """Which keys the sample keeps (None: all, while exact)."""
        if self.level == 0:
            return None
        return (hashed(keys, SAMPLING_SEED) >> np.uint64(64 - self.level)) == 0

    def _merge(self) -> None:
        if not self._pending:
            return
        keys = np.concatenate([self._keys] + [k for k, _, _ in self._pending])
        first = np.concatenate([self._first] + [d for _, d, _ in self._pending])
        first_values = np.concatenate([self._first_values] + [n for _, _, n in self._pending])
        total = np.concatenate([self._total] + [n for _, _, n in self._pending])
        self._pending, self._pending_count = [], 0
        keep = self._sampled(keys)  # the level may have grown since they were buffered
        if keep is not None:
            keys, first, first_values, total = keys[keep], first[keep], first_values[keep], total[keep]
        if not len(keys):
            return
        order = np.argsort(keys)
        keys, first, first_values, total = keys[order], first[order], first_values[order], total[order]
        starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
        group_first = np.minimum.reduceat(first, starts)
        on_first = np.where(first == np.repeat(group_first, np.diff(np.append(starts, len(keys)))), first_values, 0)
        self._keys, self._first = keys[starts], group_first
        self._first_values = np.add.reduceat(on_first, starts)
        self._total = np.add.reduceat(total, starts)
        while len(self._keys) > self._cap:
            self.level += 1
            keep = self._sampled(self._keys)
            assert keep is not None
            self._keys, self._first = self._keys[keep], self._first[keep]
            self._first_values, self._total = self._first_values[keep], self._total[keep]

    @property
    def exact(self) -> bool:
        self._merge()
        return self.level == 0

    def distinct(self) -> int:
        self._merge()
        return len(self._keys) << self.level

    def relative_error(self) -> float:
        """The distinct count's relative standard error: 0 while exact, else about
        ``sqrt((1 - p) / (p * D))`` for a sample of ``p * D`` ids at rate ``p = 2**-level``."""
        self._merge()
        if self.level == 0:
            return 0.0
        return math.sqrt(max(1.0 - 2.0**-self.level, 0.0) / max(len(self._keys), 1))

    def ids_covering(self, share: float) -> int:
        """The fewest ids whose values make up ``share`` of the column's values (the
        most frequent first; scaled from the sample past the exact cap)."""
        self._merge()
        if not len(self._total):
            return 0
        running = np.cumsum(np.sort(self._total)[::-1])
        return (int(np.searchsorted(running, share * running[-1] - 1e-9)) + 1) << self.level

    def new_share_by_day(self) -> dict[int, float]:
        """{day: share of that day's values whose id was first seen that day} (the
        sample's first-day values scaled by ``2**level``, capped at 1)."""
        self._merge()
        new: dict[int, int] = {}
        for day in np.unique(self._first).tolist():
            new[day] = int(self._first_values[self._first == day].sum()) << self.level
        return {
            day: min(1.0, new.get(day, 0) / values) if values else 0.0
            for day, values in sorted(self.values_by_day.items())
        }


def _pairs(keys: np.ndarray, days: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (key, day) pairs of a block and the values of each: Arrow's hash
    aggregation, so that the sorting merge sees each pair once (a frequent id repeats
    thousands of times in a block)."""
    import pyarrow as pa

    grouped = pa.table({"k": keys, "d": days}).group_by(["k", "d"], use_threads=False).aggregate([([], "count_all")])
    return (
        grouped.column("k").to_numpy(),
        grouped.column("d").to_numpy(),
        grouped.column("count_all").to_numpy().astype(np.int64),
    )


@dataclass
class ColumnProfile:
    """One sparse column of a profile (the JSON's ``columns`` items)."""

    name: str
    values: int  # ids counted (one per row; a list column's every id)
    nulls: int  # null rows
    distinct: int
    distinct_exact: bool
    distinct_relative_error: float  # standard error of an approximate count; 0 when exact
    ids_covering_90: int
    ids_covering_99: int
    new_share_by_day: dict[str, float]  # {YYYY-MM-DD: share}; {} without a time column
    collision_share_at: dict[str, float]  # {table size: expected share}
    suggested_rows: int


@dataclass
class Profile:
    """What ``python -m data.profile --output`` writes (`read_profile` reads it)."""

    parquet_path: str
    time_column: str | None
    rows: int
    columns: list[ColumnProfile]
    target_collision_share: float
    memory_gb: float | None
    embedding_dim: int
    embedding_precision: str
    num_embeddings_per_feature: list[int]
    expected_collision_share: float  # the share the suggested sizes meet (> target when the budget binds)
    table_bytes: int
    version: int = PROFILE_VERSION

    @property
    def sparse_columns(self) -> list[str]:
        return [c.name for c in self.columns]

    def distinct(self) -> list[int]:
        return [c.distinct for c in self.columns]


def read_profile(data: bytes, path: str) -> Profile:
    """A profile JSON's bytes, checked field by field.

    Raises:
        FileFieldError: one line naming ``path`` and the field.
    """
    document, _ = JsonObject.versioned(data, path, _WHAT, PROFILE_VERSION)
    items = document.get("columns", Kind(lambda v: isinstance(v, list) and bool(v), "a non-empty list of columns"))
    columns = []
    for i, item in enumerate(items):
        column = JsonObject(item, path, f"columns[{i}]", _WHAT)
        columns.append(
            ColumnProfile(
                name=column.get("name", TEXT),
                values=column.get("values", INTEGER),
                nulls=column.get("nulls", INTEGER),
                distinct=column.get("distinct", INTEGER),
                distinct_exact=column.get("distinct_exact", BOOLEAN),
                distinct_relative_error=column.get("distinct_relative_error", NUMBER),
                ids_covering_90=column.get("ids_covering_90", INTEGER),
                ids_covering_99=column.get("ids_covering_99", INTEGER),
                new_share_by_day=column.get("new_share_by_day", SHARES),
                collision_share_at=column.get("collision_share_at", SHARES),
                suggested_rows=column.get("suggested_rows", integer(1)),
            )
        )
    names = [c.name for c in columns]
    if len(set(names)) != len(names):
        raise FileFieldError(f"{path}: columns name a column twice")
    for i, c in enumerate(columns):
        if c.distinct > c.values or max(c.ids_covering_90, c.ids_covering_99) > max(c.distinct, 1) * 2:
            raise FileFieldError(
                f"{path}: columns[{i}] ({c.name}) counts {c.distinct:,} distinct ids among {c.values:,} ids, "
                f"{c.ids_covering_99:,} of them covering 99%: not a profile this code wrote"
            )
    return Profile(
        parquet_path=document.get("parquet_path", TEXT),
        time_column=document.get("time_column", optional(TEXT)),
        rows=document.get("rows", INTEGER),
        columns=columns,
        target_collision_share=document.get("target_collision_share", SHARE),
        memory_gb=document.get("memory_gb", optional(NUMBER)),
        embedding_dim=document.get("embedding_dim", integer(1)),
        embedding_precision=document.get("embedding_precision", one_of(*_PRECISION_BYTES)),
        num_embeddings_per_feature=document.get("num_embeddings_per_feature", int_list(len(columns), minimum=1)),
        expected_collision_share=document.get("expected_collision_share", SHARE),
        table_bytes=document.get("table_bytes", INTEGER),
    )


def write_profile(profile: Profile, path: str) -> None:
    """The profile as versioned JSON at ``path`` (written whole or not at all)."""
    try:
        write_bytes(path, versioned_json(profile))
    except OSError as e:
        raise BadInput(f"--output {path}: cannot write ({e.strerror or e})") from e


def _day_name(day: int) -> str:
    if day == _NO_DAY:
        return "all"
    return str(np.datetime64(day, "D"))


def _holds_ids(kind: Any) -> bool:
    """A string or binary column, or a list column (of integers or strings)."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return True
    return any(test(kind) for test in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary))


class LakeReader:
    """The sparse columns (and time column) of a Parquet lake, one row group at a time,
    through data/parquet's listing, footers, column patterns and schema checks.

    Raises:
        BadInput: a pattern matching no column, a column of a type no sparse column
            holds, a time column that is not a date or timestamp, a file that is not Parquet.
    """

    def __init__(self, path: str, sparse_patterns: str | None, time_column: str | None) -> None:
        from data.parquet.columns import ParquetColumns, resolve_column_patterns
        from data.parquet.files import check_same_types, column_names, file_schema, list_files, read_footers
        from data.parquet.split import time_kind

        self.path = path
        listing = list_files(path)
        self.filesystem = listing[0]
        names = column_names(path, listing)
        self.footers, metadata, self.schema = read_footers(*listing)
        if sparse_patterns is None:  # integers may be counts or labels: strings and lists are ids
            self.sparse = tuple(n for n in names if n != time_column and _holds_ids(self.schema.field(n).type))
            if not self.sparse:
                raise BadInput(
                    f"--parquet_path {path}: no string or list column; name the id columns with --sparse_columns"
                )
        else:
            patterns = [p.strip() for p in sparse_patterns.split(",") if p.strip()]
            self.sparse = resolve_column_patterns(patterns, names, "--sparse_columns")
        columns = ParquetColumns(label="", dense=(), sparse=self.sparse, table_sizes=(1,) * len(self.sparse))
        for footer, meta in zip(self.footers, metadata):
            columns.check_schema(file_schema(footer, meta, self.schema), footer.path, labelled=False)
        self.time_column = time_column
        self.time_kind: str | None = None
        if time_column is not None:
            if self.schema.get_field_index(time_column) < 0:
                raise BadInput(f"--time_column {time_column}: no such column (the table has {', '.join(names)})")
            self.time_kind = time_kind(self.schema.field(time_column).type)
            if self.time_kind not in ("date", "timestamp"):
                raise BadInput(
                    f"--time_column {time_column} is {self.schema.field(time_column).type}: the profile counts "
                    "days, so it takes a date or timestamp column"
                )
        self.read = list(self.sparse) + ([time_column] if time_column else [])
        check_same_types(self.footers, metadata, self.schema, self.read)

    def blocks(self) -> Iterator[Any]:
        from data.parquet.files import read_row_group

        for footer in self.footers:
            for group in range(len(footer.row_group_rows)):
                yield read_row_group(self.filesystem, footer, self.schema, group, self.read)


class Profiler:
    """Counts blocks of rows (pyarrow Tables holding ``sparse`` and the time column)."""

    def __init__(
        self, sparse: Sequence[str], time_column: str | None, time_kind: str | None, exact_ids: int = EXACT_IDS
    ) -> None:
        self.sparse = list(sparse)
        self.time_column, self.time_kind = time_column, time_kind
        self.counters = [IdCounter(exact_ids) for _ in self.sparse]
        self.rows = 0

    def add(self, table: Any) -> None:
        import pyarrow as pa

        from data.parquet.columns import ParquetColumns
        from data.parquet.split import time_numbers

        assert isinstance(table, pa.Table)
        self.rows += table.num_rows
        row_days = None
        if self.time_column is not None:
            assert self.time_kind is not None
            row_days = time_numbers(table.column(self.time_column), self.time_kind) // _DAY_MICROSECONDS
        for name, counter in zip(self.sparse, self.counters):
            column = table.column(name)
            keys, lengths = ParquetColumns._bags(column)  # the ids as training reads them
            days = None if row_days is None else np.repeat(row_days, lengths)
            counter.add(keys, days, column.null_count)

    def profile(
        self,
        parquet_path: str,
        target: float,
        memory_gb: float | None,
        embedding_dim: int,
        embedding_precision: str,
    ) -> Profile:
        distinct = [c.distinct() for c in self.counters]
        row_bytes = embedding_dim * _PRECISION_BYTES[embedding_precision]
        memory = None if memory_gb is None else int(memory_gb * 2**30)
        sizing = suggest_sizes(distinct, target, memory, row_bytes)
        columns = []
        for name, counter, d, rows in zip(self.sparse, self.counters, distinct, sizing.rows):
            # The candidates up to the first whose share is negligible, and the suggested size.
            small = [m for m in CANDIDATE_SIZES if m <= 10 * max(d, 1) or collision_share(d, m) >= 1e-3]
            sizes = sorted(set(small or CANDIDATE_SIZES[:1]) | {rows})
            columns.append(
                ColumnProfile(
                    name=name,
                    values=counter.values,
                    nulls=counter.nulls,
                    distinct=d,
                    distinct_exact=counter.exact,
                    distinct_relative_error=counter.relative_error(),
                    ids_covering_90=counter.ids_covering(COVERAGES[0]),
                    ids_covering_99=counter.ids_covering(COVERAGES[1]),
                    new_share_by_day=(
                        {_day_name(day): s for day, s in counter.new_share_by_day().items()}
                        if self.time_column is not None
                        else {}
                    ),
                    collision_share_at={str(m): collision_share(d, m) for m in sizes},
                    suggested_rows=rows,
                )
            )
        return Profile(
            parquet_path=parquet_path,
            time_column=self.time_column,
            rows=self.rows,
            columns=columns,
            target_collision_share=target,
            memory_gb=memory_gb,
            embedding_dim=embedding_dim,
            embedding_precision=embedding_precision,
            num_embeddings_per_feature=sizing.rows,
            expected_collision_share=sizing.share,
            table_bytes=sizing.table_bytes,
        )


def report_lines(profile: Profile) -> list[str]:
    """What ``python -m data.profile`` prints: a line per column, then the sizing."""
    lines = [f"{profile.rows:,} rows of {profile.parquet_path}"]
    for c in profile.columns:
        count = (
            f"{c.distinct:,} distinct"
            if c.distinct_exact
            else f"~{c.distinct:,} distinct (approximate, relative standard error {c.distinct_relative_error:.2%})"
        )
        new = (
            " | new ids per day " + ", ".join(f"{day} {share:.1%}" for day, share in c.new_share_by_day.items())
            if c.new_share_by_day
            else ""
        )
        shares = ", ".join(f"{int(m):,} rows {s:.1%}" for m, s in c.collision_share_at.items())
        lines.append(
            f"{c.name}: {c.values:,} ids, {c.nulls:,} null rows, {count} | {c.ids_covering_90:,} ids cover 90% "
            f"and {c.ids_covering_99:,} cover 99% of the ids | expected collision share: {shares}{new}"
        )
    weights = f"{profile.table_bytes / 2**30:.3g} GiB of {profile.embedding_precision} weights at --embedding_dim {profile.embedding_dim}"
    if profile.expected_collision_share <= profile.target_collision_share:
        budget = f" within --memory_gb {profile.memory_gb:g}" if profile.memory_gb is not None else ""
        met = f"expected collision share at most {profile.target_collision_share:g} per feature{budget}"
    else:
        met = (
            f"--memory_gb {profile.memory_gb:g} allows expected collision share "
            f"{profile.expected_collision_share:.3g} per feature, above the target {profile.target_collision_share:g}"
        )
    lines.append(f"suggested table sizes ({met}; {weights}):")
    lines.append("--num_embeddings_per_feature " + ",".join(str(r) for r in profile.num_embeddings_per_feature))
    return lines


@dataclass
class SizingFlags:
    """How ``--num_embeddings auto`` (and ``python -m data.profile``) size the tables."""

    target_collision_share: float = flag(
        0.01,
        help="--num_embeddings auto: size each table so that this expected share of its ids share "
        "their row with another id",
    )
    memory_gb: float | None = flag(
        None, help="--num_embeddings auto: the tables' weights in at most this many GiB (default: no budget)"
    )
    table_profile: str | None = flag(
        None,
        help="--num_embeddings auto: size from this python -m data.profile --output file instead of "
        "reading the training split",
    )
    # What --num_embeddings auto found (not flags: meta.json records them with the sizes).
    distinct_ids: list[int] | None = None
    expected_collision_shares: list[float] | None = None
    expected_collision_share: float | None = None

    def validate(self) -> None:
        """Raises FlagError naming the flag."""
        if not 0.0 < self.target_collision_share < 1.0:
            raise FlagError(
                f"{option(self, 'target_collision_share')} must be between 0 and 1, got {self.target_collision_share:g}"
            )
        if self.memory_gb is not None and self.memory_gb <= 0:
            raise FlagError(f"{option(self, 'memory_gb')} must be positive, got {self.memory_gb:g}")

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory_gb is None else int(self.memory_gb * 2**30)


@dataclass
class ProfileFlags:
    """``python -m data.profile``'s own flags."""

    output: str | None = flag(None, help="write the profile as JSON to this file")
    exact_ids: int = flag(
        EXACT_IDS, help="distinct ids per column counted exactly; beyond, a hash sample estimates the counts"
    )
    # As the entry points' --embedding_dim and --embedding_precision (models/config.py),
    # which the data layer cannot import.
    embedding_dim: int = flag(64, help="width of every embedding table (what a row costs)")
    embedding_precision: str = flag("fp32", choices=tuple(_PRECISION_BYTES), help="table weights in fp32 or fp16")

    def validate(self) -> None:
        for name in ("exact_ids", "embedding_dim"):
            if getattr(self, name) < 1:
                raise FlagError(f"{option(self, name)} must be positive, got {getattr(self, name)}")


PROG = "python -m data.profile"
_PARQUET_FLAGS = ("parquet_path", "sparse_columns", "time_column")


def profile_lake(
    path: str,
    sparse_columns: str | None,
    time_column: str | None,
    target: float,
    memory_gb: float | None,
    embedding_dim: int,
    embedding_precision: str,
    exact_ids: int = EXACT_IDS,
) -> Profile:
    """Reads the lake once and profiles its sparse columns (`Profiler`)."""
    reader = LakeReader(path, sparse_columns, time_column)
    profiler = Profiler(reader.sparse, time_column, reader.time_kind, exact_ids)
    for block in reader.blocks():
        profiler.add(block)
    return profiler.profile(path, target, memory_gb, embedding_dim, embedding_precision)


@cli_main(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    others = [f.field.name for f in flags_of(ParquetOptions) if f.field.name not in _PARQUET_FLAGS]
    add_flags(parser, ParquetOptions, exclude=others)
    add_flags(parser, SizingFlags, exclude=("table_profile",))
    add_flags(parser, ProfileFlags)
    args = parser.parse_args(argv)
    lake = config_values(ParquetOptions, args, exclude=others)
    sizing = SizingFlags(**config_values(SizingFlags, args, exclude=("table_profile",)))
    own = ProfileFlags(**config_values(ProfileFlags, args))
    if not lake["parquet_path"]:
        raise FlagError("--parquet_path is required (the lake to profile)")
    sizing.validate()
    own.validate()
    profile = profile_lake(
        lake["parquet_path"],
        lake["sparse_columns"],
        lake["time_column"],
        sizing.target_collision_share,
        sizing.memory_gb,
        own.embedding_dim,
        own.embedding_precision,
        own.exact_ids,
    )
    print("\n".join(report_lines(profile)))
    if own.output:
        write_profile(profile, own.output)
        print(f"profile written to {own.output}")
    return 0


__all__ = [
    "ColumnProfile",
    "IdCounter",
    "Profile",
    "Profiler",
    "Sizing",
    "collision_share",
    "main",
    "profile_lake",
    "read_profile",
    "rows_for_share",
    "suggest_sizes",
    "write_profile",
]

if __name__ == "__main__":
    sys.exit(main())
