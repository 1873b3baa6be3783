"""``--dataset_path``: a feature_spec.yaml over split_binary files (any numbers of
numerical and categorical features).

Imports no torch at import time (the registry imports it to list the flags).
"""

import os
from dataclasses import dataclass
from typing import Any

from common.config_flags import FlagError, flag, option
from data.sources.binary_files import BinaryFilesSource
from data.sources.types import FeatureDescription


@dataclass
class SplitBinaryOptions:
    dataset_path: str | None = flag(
        None,
        help="PATH/feature_spec.yaml of a split_binary data set (any numbers of numerical and categorical features)",
    )


class SplitBinarySpec(BinaryFilesSource):
    """A feature_spec.yaml over split_binary files (any numbers of features)."""

    name = "split_binary"
    options = SplitBinaryOptions
    path_field = "dataset_path"
    serving_layout = "feature_spec_csv"
    has_weights = True  # the spec's channel_spec weight

    def check_flags(self) -> None:
        if not os.path.isfile(str(self.path)):
            raise FlagError(
                f"{option(self.config, self.path_field)} {self.path}: no such file (give PATH/feature_spec.yaml)"
            )
        super().check_flags()

    def check_multi_hot_sizes(self) -> None:
        raise FlagError(
            f"{option(self.config, 'multi_hot_sizes')} expands Criteo data; "
            f"with {option(self.config, self.path_field)} give hotness in the spec"
        )

    def describe(self) -> FeatureDescription:
        from data.binary.feature_spec import FeatureSpec

        spec = FeatureSpec.load(str(self.path))
        return FeatureDescription(
            tuple(spec.numerical),
            tuple(spec.categorical),
            tuple(spec.cardinalities),
            tuple(spec.hotness(name) for name in spec.categorical),
        )

    def serving_facts(self, dataset: Any) -> dict[str, Any]:
        """The label column's name (the predictor's CSV rows may start with it)."""
        from data.binary.feature_spec import FeatureSpec

        return {"label_name": FeatureSpec.load(str(self.path)).label}

    def _dataset(self) -> Any:
        from data.binary.split import SplitBinaryDataset

        return SplitBinaryDataset(str(self.path), self.config.weight_column)
