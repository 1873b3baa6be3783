"""The nouns every data source shares: `DataSource` (what a source is),
`FeatureDescription` (what its rows hold), `BatchLoader` (what it hands the trainer).

Below the registry (data/sources/__init__.py) and every source module, which import
it; it imports neither of them, nor data.config (DataConfig, above it, holds the
sources' flags), nor torch.
"""

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from common.config_flags import FlagError, option
from common.json_fields import FileFieldError, JsonObject, int_list, integer, optional, text_list
from common.sequence_columns import parse_sequence_columns

# The splits every source hands the trainer a loader of.
SPLITS = ("train", "validation", "test")

# Epoch lengths of random data when no --limit_*_batches is given (its source's row
# counts and data/batching/loaders.py's loaders).
RANDOM_DATA_BATCHES = {"train": 1000, "validation": 100, "test": 100}

# --multi_hot_sizes' choices of where a bag's extra ids lie (data/batching/multi_hot.py).
MULTI_HOT_DISTRIBUTIONS = ("uniform", "pareto")

if TYPE_CHECKING:
    from torchrec.datasets.utils import Batch

    from data.config import DataConfig


class BatchLoader(Protocol):
    """What the trainer needs of a split's loader."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator["Batch"]: ...

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None: ...


@dataclass(frozen=True)
class FeatureDescription:
    """What a source's rows hold, as the model and the export need it.

    Args:
        dense_feature_names: the numerical features, in column order.
        sparse_feature_names: the categorical features, in column order.
        cardinalities: table rows the data's ids need (ids are below them); None when
            the table-size flags decide (random data, Criteo without metadata.json,
            hashed raw values).
        hotness: ids per row of each categorical feature when fixed; None when one-hot
            or of varying length.
        sequence_columns: the history features, "HIST:ITEM" each (``--sequence_columns``):
            HIST holds the ids of ITEM's id space (a categorical feature), ordered oldest
            to newest, at most ``max_history`` a row, any number down to none.
        max_history: the longest history a row holds; None without history features.

    The batches' KeyedJaggedTensor holds the categorical features' bags, keys in
    ``sparse_feature_names``' order, then one jagged bag per history feature in
    ``sequence_columns``' order, its length the row's history length (0: no history).
    """

    dense_feature_names: tuple[str, ...]
    sparse_feature_names: tuple[str, ...]
    cardinalities: tuple[int, ...] | None = None
    hotness: tuple[int, ...] | None = None
    sequence_columns: tuple[str, ...] = ()
    max_history: int | None = None

    @property
    def num_dense_features(self) -> int:
        return len(self.dense_feature_names)

    @property
    def sequences(self) -> list[tuple[str, str]]:
        """[(history feature, item feature)]."""
        return parse_sequence_columns(list(self.sequence_columns))

    @property
    def kjt_keys(self) -> list[str]:
        """The batches' KeyedJaggedTensor keys: the categorical features, then the histories."""
        return [*self.sparse_feature_names, *(history for history, _ in self.sequences)]

    def with_sequences(self, sequence_columns: list[str], max_history: int, flag_name: str) -> "FeatureDescription":
        """This description with the history features ``sequence_columns`` ("HIST:ITEM")
        of at most ``max_history`` items each.

        Raises:
            FlagError: an ITEM that is no categorical feature, a HIST that names a
                feature (one line naming ``flag_name``).
        """
        names = set(self.sparse_feature_names) | set(self.dense_feature_names)
        for history, item in parse_sequence_columns(sequence_columns, flag_name):
            if item not in self.sparse_feature_names:
                raise FlagError(
                    f"{flag_name} {history}:{item}: {item!r} is not a categorical feature of the data "
                    f"({', '.join(self.sparse_feature_names[:5])}{', ...' if len(self.sparse_feature_names) > 5 else ''})"
                )
            if history in names:
                raise FlagError(f"{flag_name} {history}:{item}: {history!r} is already a feature of the data")
        return dataclasses.replace(self, sequence_columns=tuple(sequence_columns), max_history=max_history)

    @classmethod
    def read(cls, recorded: JsonObject) -> "FeatureDescription":
        """What ``dataclasses.asdict`` of one gave, as JSON (a checkpoint's meta.json
        records it), checked field by field.

        Raises:
            FileFieldError: one line naming the file and the field.
        """
        sparse = recorded.get("sparse_feature_names", text_list())
        per_feature = optional(int_list(len(sparse), minimum=1))
        # Files written before history features have neither field: none.
        sequence_columns = recorded.get("sequence_columns", text_list(allow_empty=True), [])
        max_history = recorded.get("max_history", optional(integer(1)), None)
        description = cls(
            tuple(recorded.get("dense_feature_names", text_list(allow_empty=True))),
            tuple(sparse),
            as_tuple(recorded.get("cardinalities", per_feature)),
            as_tuple(recorded.get("hotness", per_feature)),
            tuple(sequence_columns),
            max_history,
        )
        try:
            parse_sequence_columns(sequence_columns)
        except FlagError as e:
            raise FileFieldError(f"{recorded.path}: {recorded.where}.sequence_columns: {e}") from None
        if len(set(sparse)) != len(sparse):
            raise FileFieldError(f"{recorded.path}: {recorded.where}.sparse_feature_names has a name twice")
        return description


@dataclass(frozen=True)
class FeedJob:
    """What the trainer tells a source of the job once its ranks have joined
    (`DataSource.join_job`); the defaults are one process on CPU.

    Args:
        device_type: "cpu" or "cuda", where the batches go.
        local_world_size: ranks on this host (they share its cores).
        group: a gloo process group of every rank for the source's own collectives,
            made only from the thread that iterates the loaders; None on one rank.
        resumed_world_size: on a resume, the world size of the run that saved the
            checkpoint (it read the resumed epoch's first batches); else None.
        resumed_epoch_shares: on a resume, the ``--epoch_shares`` that run cut its epochs
            into (recorded in its config; a source without the flag: None).
        world_size: the ranks of the job.
    """

    device_type: str = "cpu"
    local_world_size: int = 1
    group: Any = None
    resumed_world_size: int | None = None
    resumed_epoch_shares: int | None = None
    world_size: int = 1


def as_tuple(values: list[int] | None) -> tuple[int, ...] | None:
    return None if values is None else tuple(values)


class DataSource(ABC):
    """One kind of data: its flags, its feature description, its files and loaders.

    Args:
        config: the data flags; ``config.source_options`` is this source's `options`.
    """

    # Unique key in `SOURCES`.
    name: ClassVar[str]
    # Its flags: a dataclass of `common.config_flags.flag` fields, each with a default
    # (the registry adds them to DataConfig's; given with another source, refused).
    options: ClassVar[type[Any]]
    # The field of `options` whose flag names this source's data (giving it chooses
    # this source); None: chosen when no path is given (random data).
    path_field: ClassVar[str | None]
    # The serving input layout (a key of serving.layouts.LAYOUTS) of a model
    # trained on it.
    serving_layout: ClassVar[str]
    # Whether its rows can carry sample weights (--weight_column).
    has_weights: ClassVar[bool] = False
    # Whether it reads history features (--sequence_columns; `FeatureDescription`).
    has_sequences: ClassVar[bool] = False
    # Whether its labels can be predicted at all (random data's are coin flips): the
    # end-of-run divergence check (training/divergence.py) compares with a constant predictor.
    labels_carry_signal: ClassVar[bool] = True
    # Whether its loaders make collectives of their own (`join_job` then gets a group).
    uses_feed_group: ClassVar[bool] = False

    def __init__(self, config: "DataConfig") -> None:
        self.config = config

    @property
    def path(self) -> str | None:
        return getattr(self.config.source_options, self.path_field) if self.path_field else None

    def check_flags(self) -> None:
        """Refuses flag combinations this source cannot honour (FlagError, one line);
        `DataConfig.validate` calls it after the checks every source shares (another
        source's flags cannot be set: DataConfig holds this source's only). A source
        checks its path, then calls this."""
        config = self.config
        if config.multi_hot_sizes is not None:
            self.check_multi_hot_sizes()

    def check_multi_hot_sizes(self) -> None:
        """--multi_hot_sizes is given: refused unless the source expands one-hot ids."""
        raise FlagError(f"{option(self.config, 'multi_hot_sizes')} expands one-hot Criteo data, not {self.name} data")

    def join_job(self, job: FeedJob) -> str | None:
        """The trainer, once the ranks have joined (before any batch is read): what the
        loaders, made before or after, may know of the job. Returns a line the run's log
        prints once (what the source decided of the job), or None; most sources need
        nothing of it.

        Raises:
            FlagError: a flag the job cannot honour (one line naming it).
        """
        return None

    def serving_facts(self, dataset: Any) -> dict[str, Any]:
        """What a model trained on this data needs at serving besides `describe`'s
        features, read from what `open` returned (JSON values): a checkpoint's meta.json
        records it, so that an export never opens the training data again. Its fields
        are those the serving input layout (``serving_layout``) reads; {} for none."""
        return {}

    def unseen_counts(self, split: str) -> "tuple[list[str], Any, Any] | None":
        """(features, unseen ids, ids) per feature of this rank's evaluation ``split`` rows
        read since the last call; None when the source counts none."""
        return None

    def seen_ids(self) -> Any:
        """The filters of the ids training has read, for serving to count unseen ones
        (data/parquet/id_sketch.py's `SeenIds`: each checkpoint saves them); None when the
        source's ids need none."""
        return None

    @abstractmethod
    def describe(self) -> FeatureDescription:
        """The features, from the source's own description (spec, metadata, schema),
        without reading the data.

        Raises:
            BadInput: one line naming the file.
        """

    @abstractmethod
    def open(self, check_values: bool = True) -> Any:
        """The data set (files opened and checked against their layout); with
        ``check_values``, `check_values` too.

        Raises:
            BadInput: one line naming the file (and row and column of a bad value).
        """

    def check_values(self, dataset: Any) -> None:  # noqa: B027 (optional: a source with nothing to check keeps it)
        """Checks every value of what `open` returned where the source can do it up
        front (the trainer calls it after its start-up report: it may read every file);
        a source that checks values as it reads them does nothing here.

        Raises:
            BadInput: one line naming the file, row and column of a bad value.
        """

    @abstractmethod
    def loaders(
        self, dataset: Any, num_embeddings_per_feature: list[int], rank: int, world_size: int
    ) -> dict[str, BatchLoader]:
        """One loader per split ("train", "validation", "test") for this rank, from
        what `open` returned."""

    def split_rows(self, dataset: Any, world_size: int) -> dict[str, int]:
        """Rows of each split of what `open` returned, before any --limit_*_batches
        (the start-up report prints them); {} when the source does not know them
        before reading."""
        return {}

    def time_ranges(self, dataset: Any) -> dict[str, tuple[str, str]]:
        """{split: (first time, end time exclusive)} of what `open` returned, for data
        split by time (with --rolling_windows N the splits are the windows "window 0"
        ... "window N"); {} otherwise (the start-up report prints them)."""
        return {}

    def statistics(self, train_loader: BatchLoader) -> tuple[dict[str, Any], str] | None:
        """What the trainer logs of the data once per evaluation, from this rank's
        training loader: (the run log record's fields, one console line); None when
        the source counts nothing."""
        return None

    def window_loaders(
        self,
        dataset: Any,
        window: int,
        num_windows: int,
        num_embeddings_per_feature: list[int],
        rank: int,
        world_size: int,
    ) -> dict[str, BatchLoader]:
        """``--rolling_windows N`` (``num_windows`` = N + 1 consecutive time windows):
        {"train": window ``window``, "validation": window ``window + 1``}."""
        raise FlagError(
            f"--rolling_windows needs time-ordered data (--parquet_path with --time_column), not {self.name} data"
        )
