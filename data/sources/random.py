"""Uniform random rows of Criteo's shape: the data when no path flag names any.

Imports no torch at import time (the registry imports it to list the flags).
"""

from dataclasses import dataclass
from typing import Any

from common.config_flags import option
from data.sources.criteo_binary import check_multi_hot_expansion, criteo_description
from data.sources.types import RANDOM_DATA_BATCHES, SPLITS, BatchLoader, DataSource, FeatureDescription


@dataclass
class RandomOptions:
    """Random data has no flags of its own (the batch and table-size flags size it)."""


class RandomData(DataSource):
    """Uniform random rows of Criteo's shape (no path flag)."""

    name = "random"
    options = RandomOptions
    path_field = None
    labels_carry_signal = False
    has_sequences = True  # random histories of --sequence_columns' item ids
    serving_layout = "criteo_raw"

    def check_multi_hot_sizes(self) -> None:
        check_multi_hot_expansion(self.config)

    def describe(self) -> FeatureDescription:
        description = criteo_description(None, self.config.multi_hot_sizes)
        if not self.config.sequence_columns:
            return description
        config = self.config
        return description.with_sequences(
            config.sequence_columns, config.max_history, option(config, "sequence_columns")
        )

    def open(self, check_values: bool = True) -> Any:
        return None

    def split_rows(self, dataset: Any, world_size: int) -> dict[str, int]:
        """What its batches hold."""
        config = self.config
        return {
            split: RANDOM_DATA_BATCHES[split]
            * world_size
            * (config.batch_size if split == "train" else config.eval_batch_size)
            for split in SPLITS
        }

    def loaders(
        self, dataset: Any, num_embeddings_per_feature: list[int], rank: int, world_size: int
    ) -> dict[str, BatchLoader]:
        from data.batching.loaders import build_loaders

        return build_loaders(self.config, None, num_embeddings_per_feature, rank, world_size)
