"""Where the data comes from and how it is batched: `DataConfig` (the data flags).

Imports neither torch nor torchrec, so that the entry points answer --help and bad
flags before loading them; the loaders are built by data/loaders.py.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Protocol
from collections.abc import Iterator

from common.config_flags import FlagError, check_choices, flag, option
from data.criteo_layout import NUM_SPARSE_FEATURES

# Choices of the Parquet flags (data/parquet_columns.py implements them; that module
# needs pyarrow, this one must not).
DENSE_TRANSFORMS = ("log1p", "none")
ID_HASHING = ("hash", "modulo")
# Offsets of the extra ids of --multi_hot_sizes bags (data/multi_hot.py draws them).
MULTI_HOT_DISTRIBUTIONS = ("uniform", "pareto")

if TYPE_CHECKING:
    from torchrec.datasets.utils import Batch

DATASET_NAMES = ("criteo_1t", "criteo_kaggle")
SPLITS = ("train", "validation", "test")
# Epoch lengths of random data when no --limit_*_batches is given.
RANDOM_DATA_BATCHES = {"train": 1000, "validation": 100, "test": 100}


class BatchLoader(Protocol):
    """What the trainer needs of a split's loader."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator["Batch"]: ...

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None: ...


@dataclass
class DataConfig:
    """The data flags: which source (at most one path flag; none: uniform random data),
    how it is split and batched.

    Args:
        seed: seed of the data order and of random data (the run's ``--seed``).
    """

    in_memory_binary_criteo_path: Optional[str] = flag(
        None, help="directory of day_{i}_{dense,sparse,labels}.npy files; without it, uniform random data")
    synthetic_multi_hot_criteo_path: Optional[str] = flag(
        None, help="directory of the MLPerf DLRM-DCNv2 multi-hot layout (day_{i}_sparse_multi_hot.npz)")
    dataset_path: Optional[str] = flag(
        None, help="PATH/feature_spec.yaml of a split_binary data set (any numbers of numerical and "
                   "categorical features)")
    parquet_path: Optional[str] = flag(
        None, help="Parquet click log: a file, a directory (read recursively; Hive partitions such as "
                   "date=2026-11-01/ become columns) or a glob; local or a URL (s3://, gs://, hdfs://, file://)")
    label_column: str = flag("label", help="Parquet: the 0/1 label column")
    dense_columns: Optional[str] = flag(
        None, help="Parquet: comma list of numerical columns (a prefix pattern such as I* allowed)")
    sparse_columns: Optional[str] = flag(
        None, help="Parquet: comma list of categorical columns of raw ids: integers, strings or lists of them "
                   "(a prefix pattern such as C* allowed)")
    dense_transform: str = flag("log1p", choices=DENSE_TRANSFORMS,
                                help="Parquet: log1p (negatives clamped to 0, as Criteo's preprocessing) or none")
    id_hashing: str = flag("hash", choices=ID_HASHING,
                           help="Parquet: raw id to embedding row; hash: a stable seeded 64-bit hash modulo the "
                                "table size (docs/data.md); modulo: integer ids already mapped, taken modulo the "
                                "table size")
    hash_seed: int = flag(0, help="Parquet: the seed of --id_hashing hash")
    max_buffered_row_groups: int = flag(4, help="Parquet: row groups a rank holds in memory at most (also the "
                                                "--shuffle_training_set window)")
    time_column: Optional[str] = flag(
        None, help="Parquet: timestamp, date or integer column (a Hive partition column such as date counts); "
                   "validation and test are then the latest rows")
    validation_window: Optional[str] = flag(
        None, help="Parquet: the validation split, just before the test split: a duration (1d, 6h; needs "
                   "--time_column) or a fraction (0.1) of the time range, or of the rows without --time_column "
                   "(default 1d; 0.1 for an integer time column; 0.05 of the rows without one)")
    test_window: Optional[str] = flag(
        None, help="Parquet: the test split, the latest rows: a duration (1d, 6h; needs --time_column) or a "
                   "fraction (0.1) of the time range, or of the rows without --time_column (defaults as "
                   "--validation_window)")
    rolling_windows: Optional[int] = flag(
        None, help="with --time_column: N+1 consecutive time windows; train on window k, evaluate on k+1, "
                   "continue on k+1 ...")
    dataset_name: str = flag("criteo_1t", choices=DATASET_NAMES, help="which Criteo data set the files are")
    batch_size: int = flag(32, help="training rows per rank per step")
    test_batch_size: Optional[int] = flag(None, help="validation/test rows per rank (default --batch_size)")
    drop_last_training_batch: bool = flag(False, help="drop the last partial training batch")
    limit_train_batches: Optional[int] = flag(None, help="training batches per epoch at most")
    limit_val_batches: Optional[int] = flag(None, help="validation batches at most")
    limit_test_batches: Optional[int] = flag(None, help="test batches at most")
    shuffle_batches: bool = flag(False, help="shuffle the order of training batches every epoch")
    shuffle_training_set: bool = flag(False, help="visit training rows in one random order (same on every rank)")
    mmap_mode: bool = flag(False, help="read batches lazily from memory-mapped files instead of loading this "
                                       "rank's rows")
    pin_memory: bool = flag(False, help="pin host batches (CUDA)")
    seed: int = 0
    multi_hot_sizes: Optional[list[int]] = flag(
        None, help=f"expand one-hot data into multi-hot bags of these sizes ({NUM_SPARSE_FEATURES} values)")
    multi_hot_distribution_type: Optional[str] = flag(
        None, choices=MULTI_HOT_DISTRIBUTIONS, help="offsets of the extra ids in a bag (default uniform)")
    weight_column: Optional[str] = flag(
        None, help="column of per-row sample weights (with --dataset_path: the spec's channel_spec weight), "
                   "used in the loss (sum(w*loss)/sum(w)) and the evaluation metrics; default unweighted")

    @property
    def eval_batch_size(self) -> int:
        return self.test_batch_size or self.batch_size

    def validate(self) -> None:
        """Raises FlagError with one line naming the offending flag."""
        check_choices(self)
        for name in ("batch_size", "test_batch_size"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise FlagError(f"{option(self, name)} must be positive, got {value}")
        for name in ("limit_train_batches", "limit_val_batches", "limit_test_batches"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise FlagError(f"{option(self, name)} must not be negative, got {value}")
        if self.multi_hot_distribution_type is not None and self.multi_hot_sizes is None:
            raise FlagError(f"{option(self, 'multi_hot_distribution_type')} needs {option(self, 'multi_hot_sizes')}")
        # What depends on the source: its path, and the flags it can honour. Imported
        # here: data.sources imports this module.
        from data.sources import source_for
        source_for(self).check_flags()

    def limit(self, split: str) -> Optional[int]:
        return {"train": self.limit_train_batches, "validation": self.limit_val_batches,
                "test": self.limit_test_batches}[split]
