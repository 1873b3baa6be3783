"""A test-only data source with time windows, for the trainer's --rolling_windows protocol
until a real time-ordered source (Parquet with --time_column) serves windows.

`WindowedRandomData` answers ``--parquet_path`` (any string) with Criteo-shaped random
windows: window w holds batches drawn from seed ``1000 * --seed + w``, so every window
is distinct, the same on every run and world size, and the window validated after
training window k is the window trained next. `main` is dlrm_main.main with this source
registered first (a picklable entry point for `tests.support.launch.launch`).
"""

from typing import Any, Dict, List, Optional, Sequence

from data.config import BatchLoader
from data.criteo_layout import DENSE_FEATURE_NAMES, NUM_DENSE_FEATURES, SPARSE_FEATURE_NAMES
from data.random_data import RandomCriteoLoader
from data.sources import SOURCES, DataSource, FeatureDescription

BATCHES_PER_WINDOW = 4


class WindowedRandomData(DataSource):
    name = "windowed_random_test"
    path_field = "parquet_path"
    serving_layout = "criteo_raw"

    def describe(self) -> FeatureDescription:
        return FeatureDescription(tuple(DENSE_FEATURE_NAMES), tuple(SPARSE_FEATURE_NAMES))

    def open(self, check_values: bool = True) -> Any:
        return None

    def _window(self, window: int, batch_size: int, limit: Optional[int], num_embeddings_per_feature: List[int],
                rank: int, world_size: int) -> RandomCriteoLoader:
        return RandomCriteoLoader(BATCHES_PER_WINDOW if limit is None else min(limit, BATCHES_PER_WINDOW),
                                  batch_size, rank, world_size, num_embeddings_per_feature, SPARSE_FEATURE_NAMES,
                                  NUM_DENSE_FEATURES, seed=1000 * self.config.seed + window)

    def loaders(self, dataset: Any, num_embeddings_per_feature: List[int], rank: int,
                world_size: int) -> Dict[str, BatchLoader]:
        """Without --rolling_windows: windows 0, 1 and 2 are train, validation and test."""
        config = self.config
        return {split: self._window(w, config.batch_size if split == "train" else config.eval_batch_size,
                                    config.limit(split), num_embeddings_per_feature, rank, world_size)
                for w, split in enumerate(("train", "validation", "test"))}

    def window_loaders(self, dataset: Any, window: int, num_windows: int, num_embeddings_per_feature: List[int],
                       rank: int, world_size: int) -> Dict[str, BatchLoader]:
        assert 0 <= window < num_windows - 1, (window, num_windows)
        config = self.config
        return {"train": self._window(window, config.batch_size, config.limit_train_batches,
                                      num_embeddings_per_feature, rank, world_size),
                "validation": self._window(window + 1, config.eval_batch_size, config.limit_val_batches,
                                           num_embeddings_per_feature, rank, world_size)}


def register() -> None:
    """Puts the source first in the registry, ahead of any real --parquet_path source."""
    others = {name: source for name, source in SOURCES.items() if name != WindowedRandomData.name}
    SOURCES.clear()
    SOURCES.update({WindowedRandomData.name: WindowedRandomData, **others})


def main(argv: Sequence[str]) -> int:
    import dlrm_main

    register()
    return dlrm_main.main(list(argv))
