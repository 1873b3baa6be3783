"""``--parquet_path``: a Parquet click log read in place (the "parquet" data source).

Which columns mean what: data/parquet/columns.py; the files and their partitions:
data/parquet/files.py; the splits: data/parquet/split.py; the per-rank streaming
loader: data/parquet/loader.py (docs/data.md tells the whole story).

This module imports neither pyarrow nor torch at import time (the registry imports
it): the flags are checked without them.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any

from common.config_flags import FlagError, flag, option
from common.errors import BadInput
from common.url_paths import check_url_path
from data.parquet.windows import Window, parse_window
from data.sources.types import BatchLoader, DataSource, FeatureDescription, FeedJob

# Choices of the Parquet flags (data/parquet/columns.py implements them; that module
# needs pyarrow, this one must not).
DENSE_TRANSFORMS = ("log1p", "none")
ID_HASHING = ("hash", "modulo", "zch", "vocabulary")
ZCH_EVICTION_POLICIES = ("lfu", "lru")  # models/zch.py's


@dataclass
class ParquetOptions:
    """The Parquet source's flags (given with another source's data, refused)."""

    parquet_path: str | None = flag(
        None,
        help="Parquet click log: a file, a directory (read recursively; Hive partitions such as "
        "date=2026-11-01/ become columns) or a glob; local or a URL (s3://, gs://, hdfs://, file://)",
    )
    label_column: str = flag("label", help="Parquet: the 0/1 label column")
    dense_columns: str | None = flag(
        None, help="Parquet: comma list of numerical columns (a prefix pattern such as I* allowed)"
    )
    sparse_columns: str | None = flag(
        None,
        help="Parquet: comma list of categorical columns of raw ids: integers, strings or lists of them "
        "(a prefix pattern such as C* allowed)",
    )
    dense_transform: str = flag(
        "log1p",
        choices=DENSE_TRANSFORMS,
        help="Parquet: log1p (negatives clamped to 0, as Criteo's preprocessing) or none",
    )
    id_hashing: str = flag(
        "hash",
        choices=ID_HASHING,
        help="Parquet: raw id to embedding row; hash: a stable seeded 64-bit hash modulo the "
        "table size (docs/data.md); modulo: integer ids already mapped, taken modulo the "
        "table size; zch: zero-collision tables of torchrec's managed-collision modules, admitting and "
        "evicting ids as training reads them (docs/zch.md); vocabulary: the ids of the training split read at least "
        "--min_id_count times get rows 1..K, every other id the out-of-vocabulary row 0",
    )
    min_id_count: int | None = flag(
        None,
        help="Parquet, --id_hashing vocabulary: ids read fewer times in the training split share the "
        "out-of-vocabulary row with new ids (default 1: every id read gets a row)",
    )
    hash_seed: int = flag(0, help="Parquet: the seed of --id_hashing hash")
    zch_eviction_policy: str = flag(
        "lfu",
        choices=ZCH_EVICTION_POLICIES,
        help="Parquet, --id_hashing zch: which ids keep their rows when a table is full: lfu (most frequent) "
        "or lru (most recent)",
    )
    zch_eviction_interval: int = flag(
        100, help="Parquet, --id_hashing zch: training steps between admissions (and evictions) of ids"
    )
    max_buffered_row_groups: int = flag(
        4, help="Parquet: row groups a rank holds in memory at most (also the --shuffle_training_set window)"
    )
    data_workers: int | None = flag(
        None,
        help="Parquet: threads per rank converting batches (default: the rank's share of the host's cores; "
        "on CPU they run below training's priority)",
    )
    epoch_shares: int | None = flag(
        None,
        help="Parquet: cut each epoch's rows into this many equal shares, a multiple of the ranks dividing "
        "the global batch; each global batch is a block of every share, so a run reads the same batches "
        "at every world size that divides it (default: the world size; a resume keeps the checkpoint's)",
    )
    time_column: str | None = flag(
        None,
        help="Parquet: timestamp, date or integer column (a Hive partition column such as date counts); "
        "validation and test are then the latest rows",
    )
    validation_window: str | None = flag(
        None,
        help="Parquet: the validation split, just before the test split: a duration (1d, 6h; needs "
        "--time_column) or a fraction (0.1) of the time range, or of the rows without --time_column "
        "(default 1d; 0.1 for an integer time column; 0.05 of the rows without one)",
    )
    test_window: str | None = flag(
        None,
        help="Parquet: the test split, the latest rows: a duration (1d, 6h; needs --time_column) or a "
        "fraction (0.1) of the time range, or of the rows without --time_column (defaults as "
        "--validation_window)",
    )
    rolling_windows: int | None = flag(
        None,
        help="with --time_column: N+1 consecutive time windows; train on window k, evaluate on k+1, "
        "continue on k+1 ...",
    )
    user_column: str | None = flag(
        None,
        help="Parquet: with --sequence_columns and --time_column, the user column: before training every "
        "row's history is checked against the table's own events, and a history item the row's user first "
        "had at or after the row's time (the row's own future) is refused (reads the table twice more)",
    )


class ParquetSource(DataSource):
    """A Parquet table: a file, a directory (Hive partitions become columns) or a glob,
    local or on object storage; raw ids hashed into the tables."""

    name = "parquet"
    options = ParquetOptions
    path_field = "parquet_path"
    serving_layout = "parquet_columns"
    has_weights = True  # --weight_column names a column
    has_sequences = True  # --sequence_columns names list columns (data/parquet/columns.py)
    uses_feed_group = True  # the ranks agree on each batch (data/parquet/feed.py)

    def check_flags(self) -> None:
        config = self.config
        # Before anything is written: the path is printed and recorded.
        check_url_path(config.parquet_path or "", option(config, "parquet_path"), FlagError)
        if not config.sparse_columns:
            raise FlagError(
                f"{option(config, 'parquet_path')} needs {option(config, 'sparse_columns')} "
                "(the categorical columns, e.g. C1,C2 or C*)"
            )
        if config.multi_hot_sizes is not None:
            raise FlagError(
                f"{option(config, 'multi_hot_sizes')} expands one-hot data; Parquet list columns are multi-hot already"
            )
        if config.shuffle_batches:
            raise FlagError(
                f"{option(config, 'shuffle_batches')} reads batches in random order, which a Parquet "
                f"stream cannot; use {option(config, 'shuffle_training_set')}"
            )
        if config.mmap_mode:
            raise FlagError(f"{option(config, 'mmap_mode')} is for binary files; Parquet is always streamed")
        if config.max_buffered_row_groups < 1:
            raise FlagError(
                f"{option(config, 'max_buffered_row_groups')} must be at least 1, got {config.max_buffered_row_groups}"
            )
        if config.data_workers is not None and config.data_workers < 1:
            raise FlagError(f"{option(config, 'data_workers')} must be at least 1, got {config.data_workers}")
        if config.zch_eviction_interval < 1:
            raise FlagError(
                f"{option(config, 'zch_eviction_interval')} must be at least 1, got {config.zch_eviction_interval}"
            )
        if config.epoch_shares is not None and config.epoch_shares < 1:
            raise FlagError(f"{option(config, 'epoch_shares')} must be at least 1, got {config.epoch_shares}")
        self._check_vocabulary_flags()
        validation, test = self.windows()
        if config.time_column is None:
            for window, name in ((validation, "validation_window"), (test, "test_window")):
                if window is not None and window.is_duration:
                    raise FlagError(
                        f"{option(config, name)} {window.text} is a duration, which needs "
                        f"{option(config, 'time_column')}; give a fraction of the rows (0.05)"
                    )
            if validation and test and validation.fraction + test.fraction >= 1:  # type: ignore[operator]
                raise FlagError(
                    f"{option(config, 'validation_window')} + {option(config, 'test_window')} leave no training rows"
                )
        if config.rolling_windows is not None:  # what the windows are; training/config.py: how they are run
            rolling = option(config, "rolling_windows")
            if config.rolling_windows < 1:
                raise FlagError(
                    f"{rolling} must be at least 1 (train on window 0, evaluate on window 1), "
                    f"got {config.rolling_windows}"
                )
            if config.time_column is None:
                raise FlagError(f"{rolling} splits the data by time: give {option(config, 'time_column')}")
            if validation is not None or test is not None:
                raise FlagError(
                    f"{rolling} evaluates each window on the next one: "
                    f"{option(config, 'validation_window')} and {option(config, 'test_window')} "
                    "do not apply"
                )
        if config.user_column is not None:
            user = option(config, "user_column")
            if not config.sequence_columns:
                raise FlagError(f"{user} checks the histories of {option(config, 'sequence_columns')}: give them")
            if config.time_column is None:
                raise FlagError(
                    f"{user} checks histories against the rows' times: give {option(config, 'time_column')}"
                )
        super().check_flags()

    def _check_vocabulary_flags(self) -> None:
        """--min_id_count needs --id_hashing vocabulary, which builds its vocabulary from
        one training split (not the windows of --rolling_windows N > 1)."""
        config = self.config
        if config.min_id_count is not None:
            if config.id_hashing != "vocabulary":
                raise FlagError(
                    f"{option(config, 'min_id_count')} builds a vocabulary of the training split's ids: "
                    f"it needs {option(config, 'id_hashing')} vocabulary, not {config.id_hashing}"
                )
            if config.min_id_count < 1:
                raise FlagError(f"{option(config, 'min_id_count')} must be at least 1, got {config.min_id_count}")
        # --rolling_windows 1 trains on one window (the daily loop's day): its vocabulary's.
        if config.id_hashing == "vocabulary" and (config.rolling_windows or 1) > 1:
            raise FlagError(
                f"{option(config, 'id_hashing')} vocabulary is built from one training split before training: "
                f"{option(config, 'rolling_windows')} {config.rolling_windows} trains on several (use 1, or hash)"
            )

    def windows(self) -> "tuple[Window | None, Window | None]":
        """(validation window, test window) as given; None: the default."""
        config = self.config
        return tuple(
            None
            if getattr(config, name) is None  # type: ignore[return-value]
            else parse_window(getattr(config, name), option(config, name))
            for name in ("validation_window", "test_window")
        )

    # describe()'s answer and the table's listing: the flags describe, the trainer
    # opens (which describes too), and each listing of the table is a recursive one
    # (round trips on object storage): once per source object, one per run.
    _description: FeatureDescription | None = None
    _files: tuple[Any, str, list[str]] | None = None
    # What the trainer said of the job (`join_job`); the loaders ask it when an epoch starts.
    _job: FeedJob = FeedJob()

    def join_job(self, job: FeedJob) -> str | None:
        """Keeps the job, and resolves ``--epoch_shares`` (`resolve_epoch_shares`) into
        the flags, where the run log and the checkpoints record it; returns the line
        saying that a resume re-shares the rest of its epoch, or None."""
        self._job = job
        config = self.config
        given = config.epoch_shares
        check_epoch_shares(config, job.world_size)
        resumed = job.resumed_epoch_shares or job.resumed_world_size
        shares, note = resolve_epoch_shares(
            given, job.world_size, self._global_batches(job.world_size), resumed, option(config, "epoch_shares")
        )
        config.source_options.epoch_shares = shares
        return note

    def _global_batches(self, world_size: int) -> tuple[int, int]:
        """The training and the evaluation global batch."""
        return self.config.batch_size * world_size, self.config.eval_batch_size * world_size

    def _listing(self) -> tuple[Any, str, list[str]]:
        """(filesystem, root, files) of the table, listed once."""
        if self._files is None:
            from data.parquet.files import list_files

            self._files = list_files(self.config.parquet_path)  # type: ignore[arg-type]
        return self._files

    def describe(self) -> FeatureDescription:
        """Dense and sparse names from the patterns and the first file's columns (and
        partition keys); cardinalities None: the table-size flags decide. Read once per
        source object.

        Raises:
            BadInput: a pattern matching no column, a column in two roles, a file
                that is not Parquet.
        """
        if self._description is None:
            self._description = self._read_description()
        return self._description

    def _read_description(self) -> FeatureDescription:
        from data.parquet.columns import resolve_column_patterns
        from data.parquet.files import column_names

        config = self.config
        names = column_names(config.parquet_path, self._listing())  # type: ignore[arg-type]
        dense = resolve_column_patterns(_patterns(config.dense_columns), names, option(config, "dense_columns"))
        sparse = resolve_column_patterns(_patterns(config.sparse_columns), names, option(config, "sparse_columns"))
        histories = _histories(config.sequence_columns, names, option(config, "sequence_columns"))
        # A pattern (C*) leaves out the history columns (C1_history); a name given exactly
        # is refused below, as a history that is also a feature.
        given = set(_patterns(config.sparse_columns))
        sparse = tuple(c for c in sparse if c not in histories or c in given)
        roles = {
            option(config, "label_column"): config.label_column,
            option(config, "weight_column"): config.weight_column,
            option(config, "time_column"): config.time_column,
        }
        for flag_name, column in roles.items():
            if column is not None and column in dense + sparse:
                raise FlagError(
                    f"{flag_name} {column} is also a feature column "
                    f"({option(config, 'dense_columns')}/{option(config, 'sparse_columns')})"
                )
        both = set(dense) & set(sparse)
        if both:
            raise FlagError(
                f"column {sorted(both)[0]} is both in {option(config, 'dense_columns')} and "
                f"{option(config, 'sparse_columns')}"
            )
        description = FeatureDescription(dense, sparse)
        if not histories:
            return description
        return description.with_sequences(
            config.sequence_columns, config.max_history, option(config, "sequence_columns")
        )

    def open(self, check_values: bool = True) -> Any:
        """The table (`data.parquet.loader.ParquetDataset`): footers read, every file's
        schema checked, the splits (with --rolling_windows N: the N + 1 windows)
        computed. Values are checked as they are read (``check_values`` has nothing to
        read up front)."""
        from data.parquet.columns import ParquetColumns
        from data.parquet.loader import ParquetDataset

        description = self.describe()
        # The table sizes do not matter to the schema checks; `loaders` sets the model's.
        columns = ParquetColumns.from_flags(self.config, description, [1] * len(description.sparse_feature_names))
        if self._vocabulary is not None:
            columns = dataclasses.replace(columns, vocabulary=self._vocabulary)
        validation, test = self.windows()
        rolling = self.config.rolling_windows
        return ParquetDataset(
            self.config.parquet_path,
            columns,
            self.config.time_column,  # type: ignore[arg-type]
            validation,
            test,
            None if rolling is None else rolling + 1,
            self._listing(),
        )

    def check_values(self, dataset: Any) -> None:
        """With ``--user_column``: no row's history holds the row's own future, every row of
        the table checked (data/parquet/history_checks.py `check_table_histories`); every
        rank checks alike, so every rank refuses the same row before any collective.

        Raises:
            BadInput: one line naming the file, row group, row and history column.
        """
        config = self.config
        if config.user_column is None:
            return
        from data.parquet.history_checks import check_table_histories

        if config.user_column not in dataset.schema.names:
            raise BadInput(
                f"{option(config, 'user_column')} {config.user_column}: no such column "
                f"(the table has {', '.join(dataset.schema.names)})"
            )
        index = {footer.path: i for i, footer in enumerate(dataset.footers)}
        check_table_histories(
            dataset.footers,
            dataset.schema,
            lambda footer, g, names: dataset.read_row_group(index[footer.path], g, names),
            self.describe().sequences,
            config.user_column,
            config.time_column,
        )

    def split_rows(self, dataset: Any, world_size: int) -> dict[str, int]:
        return {split: stop - start for split, (start, stop) in dataset.split_ranges().items()}

    def serving_facts(self, dataset: Any) -> dict[str, Any]:
        """The label column and each sparse column's value type (the ids' type decides
        their hash), from the schema `open` read: {"label_name": ..., "sparse_value_types":
        {column: one of data.parquet.columns.SPARSE_VALUE_TYPES}}, the history columns' after the
        sparse columns'."""
        from data.parquet.columns import sparse_value_type

        description = self.describe()
        return {
            "label_name": self.config.label_column,
            # The history columns too (after the features): a list of the item's kind.
            "sparse_value_types": {
                name: sparse_value_type(dataset.schema.field(name).type)
                for name in (*description.sparse_feature_names, *(h for h, _ in description.sequences))
            },
        }

    _seen: Any = None  # the SeenIds the training loaders feed: one per source object, one per run
    # --id_hashing vocabulary: the run's IdVocabulary (data/parquet/id_vocabulary.py), set
    # before `open` by the entry point (built from the training split, or a checkpoint's).
    _vocabulary: Any = None

    def set_vocabulary(self, vocabulary: Any) -> None:
        """The IdVocabulary the loaders map ids through (--id_hashing vocabulary)."""
        self._vocabulary = vocabulary

    def vocabulary(self) -> Any:
        """The run's IdVocabulary under --id_hashing vocabulary, else None."""
        return self._vocabulary

    def seen_ids(self) -> Any:
        """The filters of the ids the training loaders have read (data/parquet/id_sketch.py's
        `SeenIds`), under --id_hashing hash once a training loader exists; under
        --id_hashing vocabulary the IdVocabulary (it knows every id of the training split,
        exactly: its ``unseen`` and ``holds_any`` answer alike); else None."""
        return self._seen if self._seen is not None else self._vocabulary

    def time_ranges(self, dataset: Any) -> dict[str, tuple[str, str]]:
        """{"train": ..., "validation": ..., "test": ...}, or with --rolling_windows
        {"window 0": ..., "window 1": ...}: what the run reads."""
        return dataset.time_ranges()

    def statistics(self, train_loader: BatchLoader) -> tuple[dict[str, Any], str] | None:
        """The id collisions and dense nulls of this rank's training rows so far
        (data.parquet.loader.ParquetLoader.statistics), and `statistics_lines`; None
        before any training row was read (--mode test|validate reads none)."""
        statistics = train_loader.statistics()  # type: ignore[attr-defined]
        lines = statistics_lines(statistics)
        return None if lines is None else (statistics, lines)

    def loaders(
        self, dataset: Any, num_embeddings_per_feature: list[int], rank: int, world_size: int
    ) -> dict[str, BatchLoader]:
        return {
            split: self._loader(dataset, dataset.splits[split], split, num_embeddings_per_feature, rank, world_size)
            for split in ("train", "validation", "test")
        }

    def window_loaders(
        self,
        dataset: Any,
        window: int,
        num_windows: int,
        num_embeddings_per_feature: list[int],
        rank: int,
        world_size: int,
    ) -> dict[str, BatchLoader]:
        assert len(dataset.splits) == num_windows, "open() cut the windows of --rolling_windows"
        return {
            split: self._loader(
                dataset, dataset.splits[f"window {w}"], split, num_embeddings_per_feature, rank, world_size
            )
            for split, w in (("train", window), ("validation", window + 1))
        }

    def _loader(
        self, dataset: Any, segments: Any, split: str, table_sizes: list[int], rank: int, world_size: int
    ) -> BatchLoader:
        from data.parquet.loader import ParquetLoader

        config = self.config
        check_epoch_shares(config, world_size)  # before any collective where the loaders come first
        columns = dataclasses.replace(dataset.columns, table_sizes=tuple(int(s) for s in table_sizes))
        is_train = split == "train"
        return ParquetLoader(
            dataset,
            segments,
            columns,
            batch_size=config.batch_size if is_train else config.eval_batch_size,
            rank=rank,
            world_size=world_size,
            drop_last=config.drop_last_training_batch and is_train,
            shuffle_seed=config.seed if (is_train and config.shuffle_training_set) else None,
            limit_batches=config.limit(split),
            max_buffered_row_groups=config.max_buffered_row_groups,
            collisions=self._training_counter(columns) if is_train else self._evaluation_counter(split, columns),
            workers=config.data_workers,
            job=lambda: self._job,
            epoch_shares=lambda: config.epoch_shares,  # resolved when the job joins (`join_job`)
        )

    def _training_counter(self, columns: Any) -> Any:
        """The training loader's CollisionCounter; under --id_hashing hash it also feeds
        the run's `SeenIds` (serving counts the ids they lack as unseen)."""
        from data.parquet.id_collisions import CollisionCounter
        from data.parquet.id_sketch import SeenIds, seen_ids_counter

        args = (columns.sparse, columns.table_sizes, columns.id_hashing, columns.hash_seed)
        if columns.id_hashing in ("vocabulary", "zch"):
            # no hash collisions: a kept id owns its row, the others share row 0 by design
            # (zch: the managed-collision modules count theirs, models/zch.py)
            return None
        if columns.id_hashing != "hash":
            return CollisionCounter(*args)
        if self._seen is None:
            self._seen = SeenIds(columns.sparse, columns.table_sizes)
        return seen_ids_counter(self._seen, *args)

    def _evaluation_counter(self, split: str, columns: Any) -> Any:
        """An evaluation loader's counter of the ids the training loaders have not read
        (None under --id_hashing modulo, or without a training loader); under
        --id_hashing vocabulary, the ids the vocabulary never read (exact)."""
        seen = self._vocabulary if self._vocabulary is not None else self._seen
        if seen is None:
            return None
        from data.parquet.id_sketch import unseen_ids_counter

        args = (columns.sparse, columns.table_sizes, columns.id_hashing, columns.hash_seed)
        counter = unseen_ids_counter(seen, *args)
        self._unseen_counters = {**getattr(self, "_unseen_counters", {}), split: counter}
        return counter

    def unseen_counts(self, split: str) -> "tuple[list[str], Any, Any] | None":
        """(features, unseen ids, ids) of this rank's ``split`` rows read since the last
        call, the unseen ones those the training loaders had not read; None without a count."""
        counter = getattr(self, "_unseen_counters", {}).get(split)
        if counter is None:
            return None
        seen = self._vocabulary if self._vocabulary is not None else self._seen
        return (list(seen.names), *counter.take())


def check_epoch_shares(config: Any, world_size: int) -> None:
    """``--epoch_shares`` given: a multiple of the world size dividing the training and
    the evaluation global batch (every share's block of a batch the same size).

    Raises:
        FlagError: one line naming the flag.
    """
    shares = config.epoch_shares
    if shares is None:
        return
    name = option(config, "epoch_shares")
    if shares % world_size:
        raise FlagError(f"{name} {shares} must be a multiple of the {world_size} ranks")
    for flag_name, batch in (("batch_size", config.batch_size), ("test_batch_size", config.eval_batch_size)):
        if (batch * world_size) % shares:
            raise FlagError(
                f"{name} {shares} must divide the global batch: {option(config, flag_name)} {batch} x "
                f"{world_size} rank(s) = {batch * world_size} rows"
            )


def resolve_epoch_shares(
    given: int | None, world_size: int, global_batches: tuple[int, ...], resumed: int | None, name: str
) -> tuple[int, str | None]:
    """(S, a line or None): the shares this run cuts its epochs into. Given (``name``,
    checked by `check_epoch_shares`): that. Else on a resume (``resumed``: the saving
    run's S) that S when the world size divides it and it divides ``global_batches``, so
    that the run goes on in the order the saving run would have read; else the world
    size, and the line says that the rest of the resumed epoch is shared anew."""
    if given is not None:
        return given, None
    if resumed is None or resumed == world_size:
        return world_size, None
    if resumed % world_size == 0 and all(batch % resumed == 0 for batch in global_batches):
        return resumed, None
    return world_size, (
        f"the checkpoint's run cut its epochs into {resumed} shares ({name}), which {world_size} rank(s) "
        "cannot keep (a multiple of the ranks dividing the global batch): the rest of the resumed epoch is "
        "shared anew, each row still read once but in other batches"
    )


def statistics_lines(statistics: dict[str, Any]) -> str | None:
    """The console's lines of `ParquetLoader.statistics`: the features whose values
    share rows most, and the dense nulls read as 0 per column, each where something
    was counted; None where nothing was (no line of "0 values")."""
    from data.parquet.id_collisions import collision_summary

    lines = []
    if any(int(s["distinct"]) for s in statistics["id_collisions"].values()):
        lines.append(collision_summary(statistics["id_collisions"]))
    nulls = {name: count for name, count in statistics["dense_nulls"].items() if count}
    if nulls:
        lines.append(
            "dense nulls read as 0 (this rank's training rows): "
            + ", ".join(f"{name} {count:,}" for name, count in nulls.items())
        )
    return "\n".join(lines) if lines else None


def _histories(sequence_columns: list[str], names: list[str], flag_name: str) -> set[str]:
    """The history columns of ``--sequence_columns``, each a column of the table.

    Raises:
        FlagError: a history that is no column (one line naming the flag).
    """
    from common.sequence_columns import parse_sequence_columns

    histories = set()
    for history, item in parse_sequence_columns(sequence_columns, flag_name):
        if history not in names:
            raise FlagError(f"{flag_name} {history}:{item}: no column {history} (the table has {', '.join(names)})")
        histories.add(history)
    return histories


def _patterns(text: str | None) -> list[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]
