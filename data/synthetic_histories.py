"""A click log whose labels depend on each user's history: what a sequence model learns.

    python -m data.synthetic_histories --output_dir DIR [--days 4 --rows_per_day 25000 --seed 0]

writes ``DIR/date=YYYY-MM-DD/part-K.parquet`` (Hive partitions, as data.synthetic_parquet
lays them out) with the columns ``ts`` (timestamp, milliseconds, UTC, whole seconds:
ties), ``label`` (int8 0/1), ``user_id``, ``item_id`` and ``category`` (int64: the
item's category, a feature of the item alone). The hidden model:

- items: ``--categories`` category centres, unit vectors in 8 dimensions; an item has a
  category and a vector near its centre, a bias ~ N(0, 0.5), and a popularity (ids
  drawn as floor(items * u ** --item_skew));
- users: a bias ~ N(0, 0.3), an activity (a power law too) and a current taste, one of
  the categories, which moves to another at random with probability ``--taste_shift``
  at each of the user's impressions (interests drift: a user id alone goes stale);
- an impression shows an item of the user's current taste with probability 1/2, else a
  popular one;
- it is clicked with probability sigmoid(logit),

      logit = -1.2 + item bias + user bias
              + --history_scale * (max over the user's last --memory clicked items h,
                                   strictly before this impression's time, of
                                   cos(item, h) - 0.5)      (0 without a click before)
              + --taste_scale * cos(item, the user's taste)

So a click depends on how close the candidate is to what the user clicked before (the
target attention of DIN), and the history also tells the current taste: a model of the
user's ordered history can beat a memoryless one over user and item ids. Impressions at
the same second do not see each other's clicks (as data.histories builds histories).
The same flags give the same files; the days are generated in order (a user's history
spans them).
"""

import datetime
import os
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common.atomic import atomic_dir
from common.cli import OneLineParser, cli_main, positive_int
from common.config_flags import add_flags, config_values, flag
from common.errors import BadInput
from data.synthetic_parquet import PARTITION_COLUMN, SyntheticParquetOutput, check_replaceable

DIMENSIONS = 8
COLUMNS = ["ts", "label", "user_id", "item_id", "category"]
_SECONDS_PER_DAY = 86400
_BIAS = -1.2
_SIMILARITY_CENTRE = 0.5  # a history of the candidate's category raises its logit, another lowers it


@dataclass
class SyntheticHistoriesSpec:
    """What to generate (the flags of ``python -m data.synthetic_histories`` but the output)."""

    days: int = flag(4, parse=positive_int, help="day partitions")
    rows_per_day: int = flag(25_000, parse=positive_int, help="impressions of each day")
    start_date: str = flag("2026-11-01", help="the first day, YYYY-MM-DD")
    files_per_day: int = flag(1, parse=positive_int, help="part files per day, in time order")
    row_group_rows: int = flag(10_000, parse=positive_int, help="rows per Parquet row group")
    users: int = flag(1000, parse=positive_int, help="distinct users")
    items: int = flag(2000, parse=positive_int, help="distinct items")
    categories: int = flag(20, parse=positive_int, help="item categories (tastes)")
    item_skew: float = flag(2.0, help="item ids are floor(items * u ** SKEW): larger puts more rows on a few")
    memory: int = flag(10, parse=positive_int, help="the user's last clicks a click depends on")
    history_scale: float = flag(3.0, help="weight of the candidate's similarity to the user's earlier clicks")
    taste_scale: float = flag(1.0, help="weight of the candidate's similarity to the user's current taste")
    taste_shift: float = flag(0.05, help="probability that a user's taste moves at an impression")
    seed: int = flag(0, help="seed of the hidden model and every draw")

    def validate(self) -> None:
        if self.files_per_day > self.rows_per_day:
            raise BadInput(f"--files_per_day {self.files_per_day} is more than --rows_per_day {self.rows_per_day}")
        if not 0.0 <= self.taste_shift <= 1.0:
            raise BadInput(f"--taste_shift must be within [0, 1], got {self.taste_shift}")
        if self.item_skew <= 0:
            raise BadInput(f"--item_skew must be positive, got {self.item_skew}")
        self.day(0)

    def day(self, index: int) -> datetime.date:
        try:
            first = datetime.date.fromisoformat(self.start_date)
        except ValueError:
            raise BadInput(f"--start_date {self.start_date!r}: expected YYYY-MM-DD") from None
        return first + datetime.timedelta(days=index)


@dataclass
class _World:
    """The hidden model: items' categories, vectors and biases, users' biases."""

    item_category: np.ndarray
    item_vector: np.ndarray
    item_bias: np.ndarray
    centre: np.ndarray
    by_category: list[np.ndarray]
    user_bias: np.ndarray


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


def _world(spec: SyntheticHistoriesSpec) -> _World:
    rng = np.random.default_rng([spec.seed, 0])
    centre = _unit(rng.normal(size=(spec.categories, DIMENSIONS)))
    category = rng.integers(0, spec.categories, spec.items)
    vector = _unit(centre[category] + 0.35 * rng.normal(size=(spec.items, DIMENSIONS)))
    by_category = [np.flatnonzero(category == c) for c in range(spec.categories)]
    # A category without items borrows a random one (tiny --items).
    by_category = [ids if len(ids) else rng.integers(0, spec.items, 1) for ids in by_category]
    return _World(
        category,
        vector,
        rng.normal(0.0, 0.5, spec.items),
        centre,
        by_category,
        rng.normal(0.0, 0.3, spec.users),
    )


class _Users:
    """Every user's state across days: the last ``memory`` clicked items and the taste."""

    def __init__(self, spec: SyntheticHistoriesSpec) -> None:
        rng = np.random.default_rng([spec.seed, 1])
        self.taste = rng.integers(0, spec.categories, spec.users)
        self.clicked: list[deque[int]] = [deque(maxlen=spec.memory) for _ in range(spec.users)]


def _day_rows(spec: SyntheticHistoriesSpec, world: _World, users: _Users, day: int) -> pa.Table:
    """One day's impressions, in time order, with their labels."""
    rng = np.random.default_rng([spec.seed, 2, day])
    n = spec.rows_per_day
    seconds = np.sort(rng.integers(0, _SECONDS_PER_DAY, n))
    who = np.minimum(np.floor(spec.users * rng.random(n) ** 2.0), spec.users - 1).astype(np.int64)
    popular = np.minimum(np.floor(spec.items * rng.random(n) ** spec.item_skew), spec.items - 1).astype(np.int64)
    from_taste = rng.random(n) < 0.5
    shift, new_taste, pick, draw = rng.random(n), rng.integers(0, spec.categories, n), rng.random(n), rng.random(n)
    items = np.empty(n, dtype=np.int64)
    labels = np.empty(n, dtype=np.int8)
    pending: list[tuple[int, int]] = []  # clicks at the current second, seen from the next one
    for r in range(n):
        if r and seconds[r] != seconds[r - 1]:
            for user, item in pending:
                users.clicked[user].append(item)
            pending.clear()
        u = int(who[r])
        if shift[r] < spec.taste_shift:
            users.taste[u] = new_taste[r]
        taste = int(users.taste[u])
        if from_taste[r]:
            choices = world.by_category[taste]
            item = int(choices[int(pick[r] * len(choices))])
        else:
            item = int(popular[r])
        logit = _BIAS + world.item_bias[item] + world.user_bias[u]
        history = users.clicked[u]
        if history:
            similarity = float(np.max(world.item_vector[list(history)] @ world.item_vector[item]))
            logit += spec.history_scale * (similarity - _SIMILARITY_CENTRE)
        logit += spec.taste_scale * float(world.centre[taste] @ world.item_vector[item])
        items[r] = item
        labels[r] = draw[r] < 1.0 / (1.0 + np.exp(-logit))
        if labels[r]:
            pending.append((u, item))
    for user, item in pending:
        users.clicked[user].append(item)
    start = np.datetime64(spec.day(day).isoformat(), "ms")
    return pa.table(
        {
            "ts": pa.array(start + seconds.astype("timedelta64[s]"), type=pa.timestamp("ms", tz="UTC")),
            "label": pa.array(labels),
            "user_id": pa.array(who),
            "item_id": pa.array(items),
            "category": pa.array(world.item_category[items]),
        }
    )


def generate_synthetic_histories(spec: SyntheticHistoriesSpec, output_dir: str) -> dict[str, object]:
    """Writes the log to ``output_dir`` (staged beside it, renamed into place when
    complete; an earlier generated log there is replaced, anything else refused).

    Returns:
        a summary: rows, positive_rate, and the days written.

    Example::

        generate_synthetic_histories(SyntheticHistoriesSpec(days=3, rows_per_day=5000), "/tmp/clicks")
    """
    spec.validate()
    check_replaceable(output_dir)
    world, users = _world(spec), _Users(spec)
    days = [f"{PARTITION_COLUMN}={spec.day(d).isoformat()}" for d in range(spec.days)]
    positives = 0
    try:
        with atomic_dir(output_dir) as staging:
            for d, name in enumerate(days):
                table = _day_rows(spec, world, users, d)
                positives += int(np.asarray(table["label"]).sum())
                os.makedirs(os.path.join(staging, name))
                bounds = np.linspace(0, table.num_rows, spec.files_per_day + 1).astype(np.int64)
                for part, (first, end) in enumerate(zip(bounds[:-1], bounds[1:])):
                    pq.write_table(
                        table.slice(int(first), int(end - first)),
                        os.path.join(staging, name, f"part-{part}.parquet"),
                        row_group_size=spec.row_group_rows,
                    )
    except OSError as e:  # a full disk, say
        raise BadInput(f"--output_dir {output_dir}: cannot write ({e.strerror or e})") from e
    rows = spec.days * spec.rows_per_day
    return {"rows": rows, "positive_rate": positives / rows, "days": days}


PROG = "python -m data.synthetic_histories"


@cli_main(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_flags(parser, SyntheticParquetOutput)
    add_flags(parser, SyntheticHistoriesSpec)
    args = parser.parse_args(argv)
    spec = SyntheticHistoriesSpec(**config_values(SyntheticHistoriesSpec, args))
    output_dir = SyntheticParquetOutput(**config_values(SyntheticParquetOutput, args)).output_dir
    summary = generate_synthetic_histories(spec, output_dir)
    print(
        f"synthetic click log with histories: {summary['rows']} rows in {spec.days} days at {output_dir} "
        f"(positive rate {summary['positive_rate']:.3f}); add histories with python -m data.histories "
        f"--parquet_path {output_dir} --user_column user_id --item_column item_id --time_column ts "
        "--positive_column label"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
