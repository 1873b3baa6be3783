"""The base of the sources whose files data/binary/ reads and data/batching/loaders.py
batches. Apart from data/sources/types.py because it calls the loaders, which use
those nouns: the nouns import nothing of data/."""

from abc import abstractmethod
from typing import Any

from data.sources.types import BatchLoader, DataSource


class BinaryFilesSource(DataSource):
    """The sources whose files data/binary/criteo.py and data/binary/split.py read and
    data/batching/loaders.py batches (Criteo day binaries, MLPerf multi-hot, split_binary
    feature specs)."""

    @abstractmethod
    def _dataset(self) -> Any:
        """The files opened and checked against their layout."""

    def open(self, check_values: bool = True) -> Any:
        dataset = self._dataset()
        if check_values:
            self.check_values(dataset)
        return dataset

    def split_rows(self, dataset: Any, world_size: int) -> dict[str, int]:
        return {split: stop - start for split, (start, stop) in dataset.split_ranges().items()}

    def check_values(self, dataset: Any) -> None:
        from data.batching.loaders import check_dataset_values

        check_dataset_values(self.config, dataset)

    def loaders(
        self, dataset: Any, num_embeddings_per_feature: list[int], rank: int, world_size: int
    ) -> dict[str, BatchLoader]:
        from data.batching.loaders import build_loaders

        return build_loaders(self.config, dataset, num_embeddings_per_feature, rank, world_size)
