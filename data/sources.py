"""Where the data comes from: one `DataSource` class per kind of data, one registry.

The data flags (`data.config.DataConfig`) name at most one source by its path flag
(``--in_memory_binary_criteo_path``, ``--synthetic_multi_hot_criteo_path``,
``--dataset_path``, ...); without one the data is uniform random. Everything that
depends on which source it is asks `source_for(config)`: the features the model is
built for (`DataSource.describe`), the files and per-rank loaders, the serving input
layout an export writes. Adding a source is one class here (or in its own module) and
one line in `SOURCES` (docs/extending.md).

This module imports no torch at import time: flags, sweeps and the
torchx components consult the registry without them.
"""

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from common.config_flags import FlagError, flag_of, option
from common.json_fields import FileFieldError, JsonObject, int_list, optional, text_list
from data.config import BatchLoader, DataConfig


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
    """

    dense_feature_names: tuple[str, ...]
    sparse_feature_names: tuple[str, ...]
    cardinalities: Optional[tuple[int, ...]] = None
    hotness: Optional[tuple[int, ...]] = None

    @property
    def num_dense_features(self) -> int:
        return len(self.dense_feature_names)

    @classmethod
    def read(cls, recorded: JsonObject) -> "FeatureDescription":
        """What ``dataclasses.asdict`` of one gave, as JSON (a checkpoint's meta.json
        records it), checked field by field.

        Raises:
            FileFieldError: one line naming the file and the field.
        """
        sparse = recorded.get("sparse_feature_names", text_list())
        per_feature = optional(int_list(len(sparse), minimum=1))
        description = cls(tuple(recorded.get("dense_feature_names", text_list(allow_empty=True))), tuple(sparse),
                          _tuple(recorded.get("cardinalities", per_feature)), _tuple(recorded.get("hotness", per_feature)))
        if len(set(sparse)) != len(sparse):
            raise FileFieldError(f"{recorded.path}: {recorded.where}.sparse_feature_names has a name twice")
        return description


def _tuple(values: Optional[list[int]]) -> Optional[tuple[int, ...]]:
    return None if values is None else tuple(values)


class DataSource(ABC):
    """One kind of data: its flag, its feature description, its files and loaders.

    Args:
        config: the data flags; ``getattr(config, self.path_field)`` names the data.
    """

    # Unique key in `SOURCES`.
    name: ClassVar[str]
    # The DataConfig field whose flag names this source's data; None: needs no path.
    path_field: ClassVar[Optional[str]]
    # The serving input layout (a key of serving.layouts.LAYOUTS) of a model
    # trained on it.
    serving_layout: ClassVar[str]
    # Whether its rows can carry sample weights (--weight_column).
    has_weights: ClassVar[bool] = False
    # Whether its labels can be predicted at all (random data's are coin flips): the
    # end-of-run divergence check (training/divergence.py) compares with a constant predictor.
    labels_carry_signal: ClassVar[bool] = True
    # The DataConfig fields only this source reads: given with another source, refused.
    own_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: DataConfig) -> None:
        self.config = config

    @property
    def path(self) -> Optional[str]:
        return getattr(self.config, self.path_field) if self.path_field else None

    def check_flags(self) -> None:
        """Refuses flag combinations this source cannot honour (FlagError, one line);
        `DataConfig.validate` calls it after the checks every source shares. A source
        checks its path, then calls this."""
        config = self.config
        for other in SOURCES.values():
            for name in other.own_fields if other is not type(self) else ():
                if getattr(config, name) != flag_of(DataConfig, name).default:
                    raise FlagError(f"{option(config, name)} is for {other.name} data: it needs "
                                    f"{option(config, other.path_field)}")
        if config.weight_column is not None and not self.has_weights:
            weighted = " or ".join(option(config, s.path_field) for s in SOURCES.values() if s.has_weights)
            raise FlagError(f"{option(config, 'weight_column')} needs data with sample weights ({weighted}); "
                            f"{self.name} data has none")
        if config.multi_hot_sizes is not None:
            self.check_multi_hot_sizes()

    def check_multi_hot_sizes(self) -> None:
        """--multi_hot_sizes is given: refused unless the source expands one-hot ids."""
        raise FlagError(f"{option(self.config, 'multi_hot_sizes')} expands one-hot Criteo data, "
                        f"not {self.name} data")

    @abstractmethod
    def describe(self) -> FeatureDescription:
        """The features, from the source's own description (spec, metadata, schema),
        without reading the data.

        Raises:
            BadInput: one line naming the file.
        """

    def serving_facts(self, dataset: Any) -> dict[str, Any]:
        """What a model trained on this data needs at serving besides `describe`'s
        features, read from what `open` returned (JSON values): a checkpoint's meta.json
        records it, so that an export never opens the training data again. Its fields
        are those the serving input layout (``serving_layout``) reads; {} for none."""
        return {}

    @abstractmethod
    def open(self, check_values: bool = True) -> Any:
        """The data set (files opened and checked against their layout); with
        ``check_values``, `check_values` too.

        Raises:
            BadInput: one line naming the file (and row and column of a bad value).
        """

    def check_values(self, dataset: Any) -> None:
        """Checks every value of what `open` returned where the source can do it up
        front (the trainer calls it after its start-up report: it may read every file);
        a source that checks values as it reads them does nothing here.

        Raises:
            BadInput: one line naming the file, row and column of a bad value.
        """

    @abstractmethod
    def loaders(self, dataset: Any, num_embeddings_per_feature: list[int], rank: int,
                world_size: int) -> dict[str, BatchLoader]:
        """One loader per split ("train", "validation", "test") for this rank, from
        what `open` returned."""

    def time_ranges(self, dataset: Any) -> dict[str, tuple[str, str]]:
        """{split: (first time, end time exclusive)} of what `open` returned, for data
        split by time (with --rolling_windows N the splits are the windows "window 0"
        ... "window N"); {} otherwise (the start-up report prints them)."""
        return {}

    def statistics(self, train_loader: BatchLoader) -> Optional[tuple[dict[str, Any], str]]:
        """What the trainer logs of the data once per evaluation, from this rank's
        training loader: (the run log record's fields, one console line); None when
        the source counts nothing."""
        return None

    def window_loaders(self, dataset: Any, window: int, num_windows: int, num_embeddings_per_feature: list[int],
                       rank: int, world_size: int) -> dict[str, BatchLoader]:
        """``--rolling_windows N`` (``num_windows`` = N + 1 consecutive time windows):
        {"train": window ``window``, "validation": window ``window + 1``}."""
        raise FlagError(f"--rolling_windows needs time-ordered data (--parquet_path with --time_column), "
                        f"not {self.name} data")


def _check_multi_hot_expansion(config: DataConfig) -> None:
    """--multi_hot_sizes expands one-hot Criteo-shaped data: one positive bag size per
    categorical feature."""
    from data.criteo_layout import NUM_SPARSE_FEATURES
    sizes = option(config, "multi_hot_sizes")
    assert config.multi_hot_sizes is not None
    if len(config.multi_hot_sizes) != NUM_SPARSE_FEATURES:
        raise FlagError(f"{sizes} has {len(config.multi_hot_sizes)} values but the data has "
                        f"{NUM_SPARSE_FEATURES} categorical features")
    if min(config.multi_hot_sizes) <= 0:
        raise FlagError(f"{sizes} values must be positive, got {min(config.multi_hot_sizes)}")


def _criteo_description(cardinalities: Optional[list[int]], hotness: Optional[list[int]]) -> FeatureDescription:
    from data.criteo_layout import DENSE_FEATURE_NAMES, SPARSE_FEATURE_NAMES
    return FeatureDescription(tuple(DENSE_FEATURE_NAMES), tuple(SPARSE_FEATURE_NAMES), _tuple(cardinalities),
                              _tuple(hotness))


class RandomData(DataSource):
    """Uniform random rows of Criteo's shape (no path flag)."""

    name = "random"
    path_field = None
    labels_carry_signal = False
    serving_layout = "criteo_raw"

    def check_multi_hot_sizes(self) -> None:
        _check_multi_hot_expansion(self.config)

    def describe(self) -> FeatureDescription:
        return _criteo_description(None, self.config.multi_hot_sizes)

    def open(self, check_values: bool = True) -> Any:
        return None

    def loaders(self, dataset: Any, num_embeddings_per_feature: list[int], rank: int,
                world_size: int) -> dict[str, BatchLoader]:
        from data.loaders import build_loaders
        return build_loaders(self.config, None, num_embeddings_per_feature, rank, world_size)


class _BinaryDataSource(DataSource):
    """The sources whose files data/criteo_binary.py and data/split_binary.py read and
    data/loaders.py batches (Criteo day binaries, MLPerf multi-hot, split_binary
    feature specs)."""

    @abstractmethod
    def _dataset(self) -> Any:
        """The files opened and checked against their layout."""

    def open(self, check_values: bool = True) -> Any:
        dataset = self._dataset()
        if check_values:
            self.check_values(dataset)
        return dataset

    def check_values(self, dataset: Any) -> None:
        from data.loaders import check_dataset_values
        check_dataset_values(self.config, dataset)

    def loaders(self, dataset: Any, num_embeddings_per_feature: list[int], rank: int,
                world_size: int) -> dict[str, BatchLoader]:
        from data.loaders import build_loaders
        return build_loaders(self.config, dataset, num_embeddings_per_feature, rank, world_size)


class CriteoDays(_BinaryDataSource):
    """The public TorchRec example's layout: day_{i}_{dense,sparse,labels}.npy."""

    name = "criteo_binary"
    path_field = "in_memory_binary_criteo_path"
    serving_layout = "criteo_raw"
    multi_hot = False

    def check_flags(self) -> None:
        if not os.path.isdir(str(self.path)):
            raise FlagError(f"{option(self.config, self.path_field)} {self.path}: no such directory")
        super().check_flags()

    def check_multi_hot_sizes(self) -> None:
        _check_multi_hot_expansion(self.config)

    def describe(self) -> FeatureDescription:
        from data.criteo_layout import read_metadata
        metadata = read_metadata(str(self.path))
        return _criteo_description(metadata.num_embeddings_per_feature if metadata else None,
                                   self._hotness(metadata))

    def _hotness(self, metadata: Any) -> Optional[list[int]]:
        """Ids per row of each feature: --multi_hot_sizes' bags, else one."""
        return self.config.multi_hot_sizes

    def serving_facts(self, dataset: Any) -> dict[str, Any]:
        """The preprocessing that made the day files (its metadata.json), which raw
        Criteo lines go through at serving: frequency threshold and table-size modulo."""
        from data.criteo_layout import read_metadata
        metadata = read_metadata(str(self.path))
        return {"frequency_threshold": metadata.frequency_threshold if metadata else 0,
                "modulo_num_embeddings_per_feature": metadata.modulo_num_embeddings_per_feature if metadata else None}

    def _dataset(self) -> Any:
        from data.criteo_binary import CriteoBinaryDataset
        return CriteoBinaryDataset(str(self.path), multi_hot=self.multi_hot)


class CriteoMultiHotDays(CriteoDays):
    """The MLPerf DLRM-DCNv2 layout: day_{i}_sparse_multi_hot.npz + dense + labels."""

    name = "criteo_multi_hot"
    path_field = "synthetic_multi_hot_criteo_path"
    multi_hot = True

    def check_multi_hot_sizes(self) -> None:
        raise FlagError(f"{option(self.config, 'multi_hot_sizes')} expands one-hot data; "
                        f"{option(self.config, self.path_field)} data is multi-hot already")

    def _hotness(self, metadata: Any) -> Optional[list[int]]:
        """The bags' sizes metadata.json records (the dataset checks its files hold them)."""
        return metadata.multi_hot_sizes if metadata else None

    def serving_facts(self, dataset: Any) -> dict[str, Any]:
        """None: its models serve raw lines without the preprocessing's transforms, as before."""
        return {}


class SplitBinarySpec(_BinaryDataSource):
    """A feature_spec.yaml over split_binary files (any numbers of features)."""

    name = "split_binary"
    path_field = "dataset_path"
    serving_layout = "feature_spec_csv"
    has_weights = True  # the spec's channel_spec weight

    def check_flags(self) -> None:
        if not os.path.isfile(str(self.path)):
            raise FlagError(f"{option(self.config, self.path_field)} {self.path}: no such file "
                            "(give PATH/feature_spec.yaml)")
        super().check_flags()

    def check_multi_hot_sizes(self) -> None:
        raise FlagError(f"{option(self.config, 'multi_hot_sizes')} expands Criteo data; "
                        f"with {option(self.config, self.path_field)} give hotness in the spec")

    def describe(self) -> FeatureDescription:
        from data.feature_spec import FeatureSpec
        spec = FeatureSpec.load(str(self.path))
        return FeatureDescription(tuple(spec.numerical), tuple(spec.categorical), tuple(spec.cardinalities),
                                  tuple(spec.hotness(name) for name in spec.categorical))

    def serving_facts(self, dataset: Any) -> dict[str, Any]:
        """The label column's name (the predictor's CSV rows may start with it)."""
        from data.feature_spec import FeatureSpec
        return {"label_name": FeatureSpec.load(str(self.path)).label}

    def _dataset(self) -> Any:
        from data.split_binary import SplitBinaryDataset
        return SplitBinaryDataset(str(self.path), self.config.weight_column)


# Here, after DataSource: its module subclasses it (and imports no pyarrow until used).
from data.parquet_source import ParquetSource  # noqa: E402

SOURCES: dict[str, type[DataSource]] = {
    source.name: source for source in (RandomData, CriteoDays, CriteoMultiHotDays, SplitBinarySpec, ParquetSource)
}
# The DataConfig fields that name data (one of them at most).
DATA_PATH_FIELDS: tuple[str, ...] = tuple(s.path_field for s in SOURCES.values() if s.path_field)


def source_for(config: DataConfig) -> DataSource:
    """The source the flags name: the one whose path flag is set, else random data.

    Raises:
        FlagError: when more than one path flag is set.
    """
    named = [source for source in SOURCES.values() if source.path_field and getattr(config, source.path_field)]
    if len(named) > 1:
        raise FlagError(f"give one data path, not {' and '.join(option(config, s.path_field) for s in named)}")
    return named[0](config) if named else RandomData(config)
