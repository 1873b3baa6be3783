"""The per-rank loaders of the binary data sets and of random data (the sources of
data/sources/ that open them call these)."""

from typing import TYPE_CHECKING

from common.sequence_columns import parse_sequence_columns
from data.batching.multi_hot import MultiHotExpander
from data.batching.value_checks import check_value_files
from data.binary.criteo import CriteoBinaryDataset, CriteoBinaryLoader
from data.binary.criteo_layout import NUM_DENSE_FEATURES, SPARSE_FEATURE_NAMES
from data.binary.split import SplitBinaryDataset
from data.sources.types import RANDOM_DATA_BATCHES, SPLITS, BatchLoader
from data.synthetic.random_data import RandomCriteoLoader

if TYPE_CHECKING:  # the flags' module imports the sources, whose loaders are these
    from data.config import DataConfig


def check_dataset_values(config: "DataConfig", dataset: CriteoBinaryDataset | SplitBinaryDataset | None) -> None:
    """Unless ``mmap_mode`` (whose loaders check each batch as they read it), checks
    every value: labels 0 or 1, finite dense values, ids from 0 to the declared
    cardinality - 1 (`data.batching.value_checks`); it reads every file (minutes on Criteo 1TB).

    Raises:
        BadInput: one line naming the file, row and column of a bad value.
    """
    if dataset is not None and not config.mmap_mode:
        check_value_files(dataset.value_files())


def build_loaders(
    config: "DataConfig",
    dataset: CriteoBinaryDataset | SplitBinaryDataset | None,
    num_embeddings_per_feature: list[int],
    rank: int,
    world_size: int,
) -> dict[str, BatchLoader]:
    """One loader per split ("train", "validation", "test") for this rank.

    Example::

        loaders = build_loaders(DataConfig(batch_size=512), None, [1000] * 26, rank=0, world_size=1)
    """
    loaders: dict[str, BatchLoader] = {}
    expand = None
    if config.multi_hot_sizes is not None:
        expand = MultiHotExpander(
            config.multi_hot_sizes,
            num_embeddings_per_feature,
            config.multi_hot_distribution_type or "uniform",
            config.seed,
        )
    sequences = parse_sequence_columns(config.sequence_columns)
    histories = [(history, SPARSE_FEATURE_NAMES.index(item)) for history, item in sequences]
    for stream, split in enumerate(SPLITS):
        is_train = split == "train"
        batch_size = config.batch_size if is_train else config.eval_batch_size
        limit = config.limit(split)
        if dataset is None:
            loaders[split] = RandomCriteoLoader(
                num_batches=RANDOM_DATA_BATCHES[split] if limit is None else limit,
                batch_size=batch_size,
                rank=rank,
                world_size=world_size,
                num_embeddings_per_feature=num_embeddings_per_feature,
                sparse_feature_names=SPARSE_FEATURE_NAMES,
                num_dense_features=NUM_DENSE_FEATURES,
                seed=config.seed,
                stream=stream,
                expand=expand,
                histories=histories,
                max_history=config.max_history,
            )
            continue
        loaders[split] = CriteoBinaryLoader(
            dataset,
            split,
            batch_size=batch_size,
            rank=rank,
            world_size=world_size,
            drop_last=config.drop_last_training_batch and is_train,
            row_permutation_seed=config.seed if (is_train and config.shuffle_training_set) else None,
            shuffle_batches_seed=config.seed if (is_train and config.shuffle_batches) else None,
            mmap_mode=config.mmap_mode,
            num_embeddings_per_feature=num_embeddings_per_feature,
            limit_batches=limit,
            expand=expand,
        )
    return loaders
