"""A learnable click log as a data lake holds one: day-partitioned Parquet with raw ids.

    python -m data.synthetic_parquet --output_dir DIR [--days 4 --rows_per_day 100000 --seed 0]

writes ``DIR/date=YYYY-MM-DD/part-K.parquet`` (Hive partitions: the date is the
directory's name, not a column in the files), ``--files_per_day`` files per day of
row groups of ``--row_group_rows`` rows, with the columns

- ``ts``: timestamp (milliseconds, UTC; whole seconds), the time of the impression;
  ascending within a day (part-0 holds the earliest rows);
- ``label``: int8, 0 or 1;
- ``I1`` ... ``I13``: int64 counts, about 15% null;
- ``C1`` ... ``C26``: raw categorical values, a few percent null: odd-numbered ones
  8-digit hex strings (as Criteo's raw logs), even-numbered ones int64 ids in the
  billions;
- ``M1`` ... (``--multi_hot_columns``): multi-hot bags, lists of int64 ids (odd M) or
  hex strings (even M) of 0 to ``--max_bag_size`` values, some empty, some null.

Labels come from a hidden model of the features, as in data/synthetic_criteo.py, so a
model trained on the log visibly learns:

    logit = bias + sum_j w_j * z_j                  (13 counts, log1p'd and standardised)
                 + sum_f a_f[id_f]                  (an effect per id; a null adds 0)
                 + sum_m mean_(i in bag m) a_m[i]   (multi-hot bags; an empty one adds 0)
                 + sum_(f,g) <u_f[id_f], u_g[id_g]> (a few pairwise id interactions)
    label ~ Bernoulli(sigmoid(signal_scale * logit))

Ids follow a power law over each feature's vocabulary, and every day brings ids never
seen before: a fraction ``--new_id_rate`` of the values of a day are ids first drawn
that day (with effects of their own), as in a real log. With ``--id_lifetime_days N``
the catalogue drifts: each feature's ids live N days (every day 1/N of its vocabulary
is born and as many of the oldest die), and a day's rows draw their ids, power-law by a
popularity fixed per id, from the ids alive that day: a model of last month sees most
of today's ids never. The same flags give the same files; each day draws from its own
seed, so a longer log extends a shorter one.
"""

import datetime
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common.atomic import atomic_dir
from common.cli import OneLineParser, cli_main, positive_int
from common.config_flags import add_flags, config_values, flag
from common.errors import BadInput
from data.synthetic_criteo import DEFAULT_CARDINALITIES

NUM_DENSE = 13
NUM_SPARSE = 26
MULTI_HOT_CARDINALITY = 5000
DENSE_COLUMNS = [f"I{i + 1}" for i in range(NUM_DENSE)]
SPARSE_COLUMNS = [f"C{i + 1}" for i in range(NUM_SPARSE)]
TIME_COLUMN = "ts"
PARTITION_COLUMN = "date"
_PARTITION_DIR = re.compile(r"date=\d{4}-\d{2}-\d{2}")
_PART_FILE = re.compile(r"part-\d+\.parquet")
_SECONDS_PER_DAY = 86400
_DENSE_NULL_RATE = 0.15
# Odd multipliers modulo 2**32 and 2**40: bijections, so distinct ids stay distinct values.
_HEX_MULTIPLIER = np.uint64(2654435761)
_INT_MULTIPLIER = np.uint64(0x9E3779B97F)
_INT_ID_BASE = 1_000_000_000


def multi_hot_columns(count: int) -> list[str]:
    return [f"M{i + 1}" for i in range(count)]


def _is_string_column(index: int) -> bool:
    """C1, C3, ... and M2, M4, ... hold hex strings; the others int64 ids (index from 0)."""
    return index % 2 == 0


@dataclass
class SyntheticParquetSpec:
    """What to generate (the flags of ``python -m data.synthetic_parquet`` but the output
    directory): the days and their files, the columns, and the hidden model that labels
    the rows."""

    days: int = flag(4, parse=positive_int, help="day partitions")
    rows_per_day: int = flag(100_000, parse=positive_int, help="rows of each day")
    start_date: str = flag("2026-11-01", help="the first day, YYYY-MM-DD")
    # Rows are split evenly between a day's files.
    files_per_day: int = flag(2, parse=positive_int, help="part files per day, in time order")
    row_group_rows: int = flag(10_000, parse=positive_int, help="rows per Parquet row group")
    multi_hot_columns: int = flag(2, help="list columns M1 ... of multi-hot bags")
    max_bag_size: int = flag(20, parse=positive_int, help="the longest multi-hot bag")
    new_id_rate: float = flag(0.05, help="fraction of a day's ids first seen that day")
    id_lifetime_days: int = flag(
        0,
        help="a drifting catalogue: each id lives this many days (every day 1/N of a feature's ids are born and "
        "as many die; a day draws from the live ones); 0: ids never die",
    )
    id_skew: float = flag(3.0, help="ids are floor(cardinality * u ** SKEW): larger puts more rows on a few ids")
    signal_scale: float = flag(1.0, help="multiplies the hidden logit: larger makes labels easier to predict")
    seed: int = flag(0, help="seed of the hidden model and every sample")

    def validate(self) -> None:
        for name in ("days", "rows_per_day", "files_per_day", "row_group_rows", "max_bag_size"):
            if getattr(self, name) <= 0:
                raise BadInput(f"--{name} must be positive, got {getattr(self, name)}")
        if self.files_per_day > self.rows_per_day:
            raise BadInput(f"--files_per_day {self.files_per_day} is more than --rows_per_day {self.rows_per_day}")
        if self.multi_hot_columns < 0:
            raise BadInput(f"--multi_hot_columns must not be negative, got {self.multi_hot_columns}")
        if not 0.0 <= self.new_id_rate <= 1.0:
            raise BadInput(f"--new_id_rate must be within [0, 1], got {self.new_id_rate}")
        if self.id_lifetime_days < 0:
            raise BadInput(f"--id_lifetime_days must not be negative, got {self.id_lifetime_days}")
        if self.id_skew <= 0:
            raise BadInput(f"--id_skew must be positive, got {self.id_skew}")
        self.first_day()

    def first_day(self) -> datetime.date:
        try:
            return datetime.date.fromisoformat(self.start_date)
        except ValueError:
            raise BadInput(f"--start_date {self.start_date!r}: expected YYYY-MM-DD") from None

    def day(self, index: int) -> datetime.date:
        return self.first_day() + datetime.timedelta(days=index)


@dataclass
class _IdFeature:
    """One categorical feature of the hidden model: its vocabulary (``base`` ids, then
    for each day a block of ``born_per_day`` catalogue ids, born to live the next
    ``--id_lifetime_days`` days, and ``new_per_day`` ids of that day only) and the
    effects of every id."""

    index: int  # distinguishes the features' raw values
    base: int
    new_per_day: int
    effects: np.ndarray  # (base + days * (born_per_day + new_per_day),)
    null_rate: float
    as_strings: bool
    vectors: np.ndarray | None = None  # (ids, 4) when the feature is in an interaction pair
    born_per_day: int = 0  # 0: the catalogue is the base vocabulary every day
    _live: dict[int, np.ndarray] = field(default_factory=dict)  # day -> its live ids, most popular first

    def draw(self, spec: SyntheticParquetSpec, rng: np.random.Generator, day: int, n: int) -> np.ndarray:
        """n ids of day ``day``: power-law ids of the catalogue (the base vocabulary,
        or the ids alive that day), or (at ``new_id_rate``) ids first seen that day."""
        ranks = np.minimum(np.floor(self.base * rng.random(n) ** spec.id_skew), self.base - 1).astype(np.int64)
        base_ids = self.live(day)[ranks] if self.born_per_day else ranks
        block = self.base + day * (self.born_per_day + self.new_per_day) + self.born_per_day
        new_ids = block + rng.integers(0, self.new_per_day, n)
        return np.where(rng.random(n) < spec.new_id_rate, new_ids, base_ids)

    def live(self, day: int) -> np.ndarray:
        """The ``base`` ids alive on ``day`` (the newest of the base vocabulary and the
        days' births before it), ordered by a popularity fixed per id (a hash of it)."""
        if day not in self._live:
            born = self.born_per_day
            positions = np.arange(day * born, day * born + self.base, dtype=np.int64)  # in order of birth
            later = positions - self.base  # births: day j's k-th id lies in block j
            ids = np.where(
                positions < self.base,
                positions,
                self.base + (later // born) * (born + self.new_per_day) + later % born,
            )
            with np.errstate(over="ignore"):
                popularity = (ids.astype(np.uint64) + np.uint64(self.index)) * np.uint64(0x9E3779B97F4A7C15)
            self._live[day] = ids[np.argsort(popularity, kind="stable")]
        return self._live[day]

    def raw_values(self, ids: np.ndarray, null: np.ndarray | None = None) -> pa.Array:
        """The values a log shows for ids (null where ``null``): 8 hex digits, or an
        int64 in the billions."""
        with np.errstate(over="ignore"):
            mixed = ids.astype(np.uint64) * (_HEX_MULTIPLIER if self.as_strings else _INT_MULTIPLIER) + np.uint64(
                self.index * 7919
            )
        if self.as_strings:
            hex_bytes = (mixed & np.uint64(0xFFFF_FFFF)).astype(">u4").tobytes().hex().encode()
            return pa.array(np.frombuffer(hex_bytes, dtype="S8"), mask=null).cast(pa.string())
        return pa.array((mixed & np.uint64((1 << 40) - 1)).astype(np.int64) + _INT_ID_BASE, mask=null)


def _id_feature(
    spec: SyntheticParquetSpec,
    index: int,
    cardinality: int,
    effect_scale: float,
    null_rate: float,
    as_strings: bool,
    with_vectors: bool,
) -> _IdFeature:
    new_per_day = max(1, cardinality // 10)
    lifetime = spec.id_lifetime_days
    born_per_day = -(-cardinality // lifetime) if lifetime else 0
    # The base vocabulary and each day's new ids draw from their own seeds: day d's ids
    # and effects do not depend on --days.
    blocks = [np.random.default_rng([spec.seed, 2, index])] + [
        np.random.default_rng([spec.seed, 3, index, day]) for day in range(spec.days)
    ]
    sizes = [cardinality] + [born_per_day + new_per_day] * spec.days
    effects = np.concatenate([rng.normal(0.0, effect_scale, size) for rng, size in zip(blocks, sizes)])
    vectors = (
        np.concatenate([rng.normal(0.0, 0.6, (size, 4)) for rng, size in zip(blocks, sizes)]) if with_vectors else None
    )
    return _IdFeature(index, cardinality, new_per_day, effects, null_rate, as_strings, vectors, born_per_day)


@dataclass
class _HiddenModel:
    dense_mu: np.ndarray  # log-normal parameters of the raw counts
    dense_sigma: np.ndarray
    dense_weight: np.ndarray
    sparse: list[_IdFeature]
    multi_hot: list[_IdFeature]
    pairs: list[tuple[int, int]]
    bias: float


def _hidden_model(spec: SyntheticParquetSpec) -> _HiddenModel:
    rng = np.random.default_rng([spec.seed, 0])
    strong = set(rng.choice(NUM_SPARSE, size=10, replace=False).tolist())
    order = rng.permutation(NUM_SPARSE)
    pairs = [(int(order[2 * i]), int(order[2 * i + 1])) for i in range(4)]
    paired = {f for pair in pairs for f in pair}
    null_rates = rng.uniform(0.0, 0.08, NUM_SPARSE)
    dense_mu, dense_sigma = rng.uniform(0.0, 4.0, NUM_DENSE), rng.uniform(0.5, 1.5, NUM_DENSE)
    dense_weight = rng.normal(0.0, 0.5, NUM_DENSE)
    sparse = [
        _id_feature(
            spec,
            f,
            DEFAULT_CARDINALITIES[f],
            0.9 if f in strong else 0.2,
            float(null_rates[f]),
            _is_string_column(f),
            f in paired,
        )
        for f in range(NUM_SPARSE)
    ]
    multi_hot = [
        _id_feature(spec, NUM_SPARSE + m, MULTI_HOT_CARDINALITY, 1.2, 0.05, not _is_string_column(m), False)
        for m in range(spec.multi_hot_columns)
    ]
    return _HiddenModel(dense_mu, dense_sigma, dense_weight, sparse, multi_hot, pairs, bias=-1.2)


def _bag_column(
    spec: SyntheticParquetSpec, feature: _IdFeature, rng: np.random.Generator, day: int, n: int
) -> tuple[pa.Array, np.ndarray]:
    """A multi-hot column of n rows and each row's mean effect (0 for an empty or null bag)."""
    lengths = rng.integers(0, spec.max_bag_size + 1, n)
    null = rng.random(n) < feature.null_rate
    lengths[null] = 0
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ids = feature.draw(spec, rng, day, int(offsets[-1]))
    running = np.concatenate([[0.0], np.cumsum(feature.effects[ids])])
    sums = running[offsets[1:]] - running[offsets[:-1]]
    mean_effect = np.where(lengths > 0, sums / np.maximum(lengths, 1), 0.0)
    column = pa.ListArray.from_arrays(pa.array(offsets), feature.raw_values(ids), mask=pa.array(null))
    return column, mean_effect


def _rows(
    spec: SyntheticParquetSpec, model: _HiddenModel, rng: np.random.Generator, day: int, seconds: np.ndarray
) -> pa.Table:
    """The rows of one row group, at the given seconds of day ``day``."""
    n = len(seconds)
    columns: dict[str, pa.Array] = {}
    start = np.datetime64(spec.day(day).isoformat(), "ms")
    columns[TIME_COLUMN] = pa.array(start + seconds.astype("timedelta64[s]"), type=pa.timestamp("ms", tz="UTC"))

    counts = np.floor(rng.lognormal(model.dense_mu, model.dense_sigma, size=(n, NUM_DENSE)))
    missing = rng.random((n, NUM_DENSE)) < _DENSE_NULL_RATE
    counts[missing] = 0.0  # a null reads as 0 in training: the hidden model sees the same
    centred = (np.log1p(counts) - np.log1p(np.exp(model.dense_mu))) / model.dense_sigma
    logit = model.bias + centred @ model.dense_weight
    for j, name in enumerate(DENSE_COLUMNS):
        columns[name] = pa.array(counts[:, j].astype(np.int64), mask=missing[:, j])

    vectors: dict[int, np.ndarray] = {}
    for feature, name in zip(model.sparse, SPARSE_COLUMNS):
        ids = feature.draw(spec, rng, day, n)
        null = rng.random(n) < feature.null_rate
        logit += np.where(null, 0.0, feature.effects[ids])
        if feature.vectors is not None:
            vectors[feature.index] = np.where(null[:, None], 0.0, feature.vectors[ids])
        columns[name] = feature.raw_values(ids, null)
    for f, g in model.pairs:
        logit += np.einsum("nk,nk->n", vectors[f], vectors[g])
    for feature, name in zip(model.multi_hot, multi_hot_columns(spec.multi_hot_columns)):
        columns[name], mean_effect = _bag_column(spec, feature, rng, day, n)
        logit += mean_effect

    prob = 1.0 / (1.0 + np.exp(-spec.signal_scale * logit))
    labels = (rng.random(n) < prob).astype(np.int8)
    ordered = {TIME_COLUMN: columns.pop(TIME_COLUMN), "label": pa.array(labels), **columns}
    return pa.table(ordered)


def check_replaceable(output_dir: str) -> None:
    """Refuses an output directory that holds anything but an earlier generated log
    (it is replaced as a whole)."""
    if not os.path.isdir(output_dir):
        if os.path.exists(output_dir):
            raise BadInput(f"--output_dir {output_dir}: not a directory")
        return
    for entry in os.listdir(output_dir):
        inside = os.path.join(output_dir, entry)
        parts = os.listdir(inside) if os.path.isdir(inside) and _PARTITION_DIR.fullmatch(entry) else None
        if parts is None or not all(_PART_FILE.fullmatch(p) for p in parts):
            raise BadInput(
                f"--output_dir {output_dir}: holds {entry}, which is no part of a generated log "
                "(the directory is replaced as a whole: give a new or empty one)"
            )


def _write_day(spec: SyntheticParquetSpec, model: _HiddenModel, day_dir: str, day: int) -> int:
    """Writes one day's part files; returns its positives."""
    rng = np.random.default_rng([spec.seed, 1, day])
    seconds = np.sort(rng.integers(0, _SECONDS_PER_DAY, spec.rows_per_day))
    os.makedirs(day_dir)
    positives = 0
    bounds = np.linspace(0, spec.rows_per_day, spec.files_per_day + 1).astype(np.int64)
    for part, (first, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        writer: pq.ParquetWriter | None = None
        for start in range(int(first), int(end), spec.row_group_rows):
            table = _rows(spec, model, rng, day, seconds[start : min(int(end), start + spec.row_group_rows)])
            if writer is None:
                writer = pq.ParquetWriter(os.path.join(day_dir, f"part-{part}.parquet"), table.schema)
            writer.write_table(table, row_group_size=spec.row_group_rows)
            positives += int(np.asarray(table["label"]).sum())
        assert writer is not None  # every part has a row (files_per_day <= rows_per_day)
        writer.close()
    return positives


def generate_synthetic_parquet(spec: SyntheticParquetSpec, output_dir: str) -> dict[str, object]:
    """Writes the log to ``output_dir``: staged beside it and renamed into place when
    complete, replacing an earlier generated log there.

    Returns:
        a summary: rows, positive_rate, and the paths of the days written.

    Raises:
        BadInput: a bad spec, or an output directory that holds other files.

    Example::

        generate_synthetic_parquet(SyntheticParquetSpec(days=3, rows_per_day=10_000), "/tmp/log")
    """
    spec.validate()
    check_replaceable(output_dir)
    model = _hidden_model(spec)
    positives = 0
    days = [f"{PARTITION_COLUMN}={spec.day(d).isoformat()}" for d in range(spec.days)]
    try:
        with atomic_dir(output_dir) as staging:
            for d, name in enumerate(days):
                positives += _write_day(spec, model, os.path.join(staging, name), d)
    except OSError as e:  # a full disk, say
        raise BadInput(f"--output_dir {output_dir}: cannot write ({e.strerror or e})") from e
    rows = spec.days * spec.rows_per_day
    return {"rows": rows, "positive_rate": positives / rows, "days": days}


PROG = "python -m data.synthetic_parquet"


@dataclass
class SyntheticParquetOutput:
    """Where the generated log goes."""

    output_dir: str = flag(
        help="directory of the log (date=YYYY-MM-DD/part-K.parquet); an earlier generated "
        "log there is replaced, anything else refused"
    )


@cli_main(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_flags(parser, SyntheticParquetOutput)
    add_flags(parser, SyntheticParquetSpec)
    args = parser.parse_args(argv)
    spec = SyntheticParquetSpec(**config_values(SyntheticParquetSpec, args))
    output_dir = SyntheticParquetOutput(**config_values(SyntheticParquetOutput, args)).output_dir
    summary = generate_synthetic_parquet(spec, output_dir)
    sparse = "C*,M*" if spec.multi_hot_columns else "C*"
    print(
        f"synthetic Parquet log: {summary['rows']} rows in {spec.days} days at {output_dir} "
        f"(positive rate {summary['positive_rate']:.3f}); train with --parquet_path {output_dir} "
        f"--time_column {PARTITION_COLUMN} --dense_columns 'I*' --sparse_columns '{sparse}'"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
