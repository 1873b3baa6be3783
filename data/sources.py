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

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Type

from common.config_flags import FlagError
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

    dense_feature_names: Tuple[str, ...]
    sparse_feature_names: Tuple[str, ...]
    cardinalities: Optional[Tuple[int, ...]] = None
    hotness: Optional[Tuple[int, ...]] = None

    @property
    def num_dense_features(self) -> int:
        return len(self.dense_feature_names)


class DataSource(ABC):
    """One kind of data: its flag, its feature description, its files and loaders.

    Args:
        config: the data flags; ``getattr(config, self.path_field)`` names the data.
    """

    # Unique key in `SOURCES`.
    name: ClassVar[str]
    # The DataConfig field whose flag names this source's data; None: needs no path.
    path_field: ClassVar[Optional[str]]
    # The serving input layout (a key of serving.input_layouts.LAYOUTS) of a model
    # trained on it.
    serving_layout: ClassVar[str]

    def __init__(self, config: DataConfig) -> None:
        self.config = config

    @property
    def path(self) -> Optional[str]:
        return getattr(self.config, self.path_field) if self.path_field else None

    def check_flags(self) -> None:
        """Refuses flag combinations this source cannot honour (FlagError, one line)."""

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
        ``check_values`` every value is checked where the source can do it up front.

        Raises:
            BadInput: one line naming the file (and row and column of a bad value).
        """

    @abstractmethod
    def loaders(self, dataset: Any, num_embeddings_per_feature: List[int], rank: int,
                world_size: int) -> Dict[str, BatchLoader]:
        """One loader per split ("train", "validation", "test") for this rank, from
        what `open` returned."""

    def window_loaders(self, dataset: Any, window: int, num_windows: int, num_embeddings_per_feature: List[int],
                       rank: int, world_size: int) -> Dict[str, BatchLoader]:
        """``--rolling_windows N`` (``num_windows`` = N + 1 consecutive time windows):
        {"train": window ``window``, "validation": window ``window + 1``}."""
        raise FlagError(f"--rolling_windows needs time-ordered data (--parquet_path with --time_column), "
                        f"not {self.name} data")


class RandomData(DataSource):
    """Uniform random rows of Criteo's shape (no path flag)."""

    name = "random"
    path_field = None
    serving_layout = "criteo_raw"

    def describe(self) -> FeatureDescription:
        from data.criteo_layout import DENSE_FEATURE_NAMES, SPARSE_FEATURE_NAMES
        return FeatureDescription(tuple(DENSE_FEATURE_NAMES), tuple(SPARSE_FEATURE_NAMES))

    def open(self, check_values: bool = True) -> Any:
        return None

    def loaders(self, dataset: Any, num_embeddings_per_feature: List[int], rank: int,
                world_size: int) -> Dict[str, BatchLoader]:
        from data.loaders import build_loaders
        return build_loaders(self.config, None, num_embeddings_per_feature, rank, world_size)


class _BinaryDataSource(DataSource):
    """The sources data/loaders.py opens (Criteo day binaries, MLPerf multi-hot,
    split_binary feature specs)."""

    def open(self, check_values: bool = True) -> Any:
        from data.loaders import open_dataset
        return open_dataset(self.config, check_values)

    def loaders(self, dataset: Any, num_embeddings_per_feature: List[int], rank: int,
                world_size: int) -> Dict[str, BatchLoader]:
        from data.loaders import build_loaders
        return build_loaders(self.config, dataset, num_embeddings_per_feature, rank, world_size)


class CriteoDays(_BinaryDataSource):
    """The public TorchRec example's layout: day_{i}_{dense,sparse,labels}.npy."""

    name = "criteo_binary"
    path_field = "in_memory_binary_criteo_path"
    serving_layout = "criteo_raw"

    def describe(self) -> FeatureDescription:
        from data.criteo_layout import DENSE_FEATURE_NAMES, SPARSE_FEATURE_NAMES, read_metadata
        metadata = read_metadata(self.path) or {}
        sizes = metadata.get("num_embeddings_per_feature")
        return FeatureDescription(tuple(DENSE_FEATURE_NAMES), tuple(SPARSE_FEATURE_NAMES),
                                  tuple(int(v) for v in sizes) if sizes else None)


class CriteoMultiHotDays(CriteoDays):
    """The MLPerf DLRM-DCNv2 layout: day_{i}_sparse_multi_hot.npz + dense + labels."""

    name = "criteo_multi_hot"
    path_field = "synthetic_multi_hot_criteo_path"


class SplitBinarySpec(_BinaryDataSource):
    """A feature_spec.yaml over split_binary files (any numbers of features)."""

    name = "split_binary"
    path_field = "dataset_path"
    serving_layout = "feature_spec_csv"

    def describe(self) -> FeatureDescription:
        from data.feature_spec import FeatureSpec
        spec = FeatureSpec.load(self.path)
        return FeatureDescription(tuple(spec.numerical), tuple(spec.categorical), tuple(spec.cardinalities))


# Here, after DataSource: its module subclasses it (and imports no pyarrow until used).
from data.parquet_source import ParquetSource  # noqa: E402

SOURCES: Dict[str, Type[DataSource]] = {
    source.name: source for source in (RandomData, CriteoDays, CriteoMultiHotDays, SplitBinarySpec, ParquetSource)
}
# The DataConfig fields that name data (one of them at most).
DATA_PATH_FIELDS: Tuple[str, ...] = tuple(s.path_field for s in SOURCES.values() if s.path_field)


def source_for(config: DataConfig) -> DataSource:
    """The source the flags name: the one whose path flag is set, else random data."""
    for source in SOURCES.values():
        if source.path_field and getattr(config, source.path_field):
            return source(config)
    return RandomData(config)
