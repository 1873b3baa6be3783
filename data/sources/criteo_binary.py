"""``--in_memory_binary_criteo_path`` and ``--synthetic_multi_hot_criteo_path``: Criteo's
day files, one-hot (the public TorchRec example's layout) or multi-hot (MLPerf's).

Imports no torch at import time (the registry imports it to list the flags).
"""

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common.config_flags import FlagError, flag, option
from data.sources.binary_files import BinaryFilesSource
from data.sources.types import FeatureDescription, as_tuple

if TYPE_CHECKING:
    from data.config import DataConfig


def check_multi_hot_expansion(config: "DataConfig") -> None:
    """--multi_hot_sizes expands one-hot Criteo-shaped data: one positive bag size per
    categorical feature."""
    from data.binary.criteo_layout import NUM_SPARSE_FEATURES

    sizes = option(config, "multi_hot_sizes")
    assert config.multi_hot_sizes is not None
    if len(config.multi_hot_sizes) != NUM_SPARSE_FEATURES:
        raise FlagError(
            f"{sizes} has {len(config.multi_hot_sizes)} values but the data has "
            f"{NUM_SPARSE_FEATURES} categorical features"
        )
    if min(config.multi_hot_sizes) <= 0:
        raise FlagError(f"{sizes} values must be positive, got {min(config.multi_hot_sizes)}")


def criteo_description(cardinalities: list[int] | None, hotness: list[int] | None) -> FeatureDescription:
    from data.binary.criteo_layout import DENSE_FEATURE_NAMES, SPARSE_FEATURE_NAMES

    return FeatureDescription(
        tuple(DENSE_FEATURE_NAMES), tuple(SPARSE_FEATURE_NAMES), as_tuple(cardinalities), as_tuple(hotness)
    )


@dataclass
class CriteoDaysOptions:
    in_memory_binary_criteo_path: str | None = flag(
        None, help="directory of day_{i}_{dense,sparse,labels}.npy files; without it, uniform random data"
    )


@dataclass
class CriteoMultiHotDaysOptions:
    synthetic_multi_hot_criteo_path: str | None = flag(
        None, help="directory of the MLPerf DLRM-DCNv2 multi-hot layout (day_{i}_sparse_multi_hot.npz)"
    )


class CriteoDays(BinaryFilesSource):
    """The public TorchRec example's layout: day_{i}_{dense,sparse,labels}.npy."""

    name = "criteo_binary"
    options = CriteoDaysOptions
    path_field = "in_memory_binary_criteo_path"
    serving_layout = "criteo_raw"
    multi_hot = False

    def check_flags(self) -> None:
        if not os.path.isdir(str(self.path)):
            raise FlagError(f"{option(self.config, self.path_field)} {self.path}: no such directory")
        super().check_flags()

    def check_multi_hot_sizes(self) -> None:
        check_multi_hot_expansion(self.config)

    def describe(self) -> FeatureDescription:
        from data.binary.criteo_layout import read_metadata

        metadata = read_metadata(str(self.path))
        return criteo_description(metadata.num_embeddings_per_feature if metadata else None, self._hotness(metadata))

    def _hotness(self, metadata: Any) -> list[int] | None:
        """Ids per row of each feature: --multi_hot_sizes' bags, else one."""
        return self.config.multi_hot_sizes

    def serving_facts(self, dataset: Any) -> dict[str, Any]:
        """The preprocessing that made the day files (its metadata.json), which raw
        Criteo lines go through at serving: frequency threshold and table-size modulo."""
        from data.binary.criteo_layout import read_metadata

        metadata = read_metadata(str(self.path))
        return {
            "frequency_threshold": metadata.frequency_threshold if metadata else 0,
            "modulo_num_embeddings_per_feature": metadata.modulo_num_embeddings_per_feature if metadata else None,
        }

    def _dataset(self) -> Any:
        from data.binary.criteo import CriteoBinaryDataset

        return CriteoBinaryDataset(str(self.path), multi_hot=self.multi_hot)


class CriteoMultiHotDays(CriteoDays):
    """The MLPerf DLRM-DCNv2 layout: day_{i}_sparse_multi_hot.npz + dense + labels."""

    name = "criteo_multi_hot"
    options = CriteoMultiHotDaysOptions
    path_field = "synthetic_multi_hot_criteo_path"
    multi_hot = True

    def check_multi_hot_sizes(self) -> None:
        raise FlagError(
            f"{option(self.config, 'multi_hot_sizes')} expands one-hot data; "
            f"{option(self.config, self.path_field)} data is multi-hot already"
        )

    def _hotness(self, metadata: Any) -> list[int] | None:
        """The bags' sizes metadata.json records (the dataset checks its files hold them)."""
        return metadata.multi_hot_sizes if metadata else None

    def serving_facts(self, dataset: Any) -> dict[str, Any]:
        """None: its models serve raw lines without the preprocessing's transforms, as before."""
        return {}
