"""Where the data comes from and how it is batched: `DataConfig` (the data flags).

Imports neither torch nor torchrec, so that the entry points answer --help and bad
flags before loading them; the loaders are built by data/loaders.py.
"""

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, List, Optional, Protocol

from common.config_flags import FlagError, check_choices, flag, flag_of, option
from data.criteo_layout import NUM_SPARSE_FEATURES
from data.multi_hot import MULTI_HOT_DISTRIBUTIONS

# Choices of the Parquet flags (data/parquet_columns.py implements them; that module
# needs pyarrow, this one must not).
DENSE_TRANSFORMS = ("log1p", "none")
ID_HASHING = ("hash", "modulo")

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


# The flags that name the data (one of them at most).
DATA_SOURCE_FIELDS = ("in_memory_binary_criteo_path", "synthetic_multi_hot_criteo_path", "dataset_path", "parquet_path")
# The flags only Parquet data reads (data.parquet_source checks them with --parquet_path).
PARQUET_ONLY_FIELDS = ("label_column", "dense_columns", "sparse_columns", "dense_transform", "id_hashing", "hash_seed",
                       "max_buffered_row_groups", "time_column", "validation_window", "test_window", "rolling_windows")


@dataclass
class DataConfig:
    """The data flags.

    Args:
        in_memory_binary_criteo_path: directory of day_{i}_*.npy files; None for
            uniform random data.
        synthetic_multi_hot_criteo_path: directory of the MLPerf multi-hot layout
            (day_{i}_sparse_multi_hot.npz + dense + labels).
        dataset_path: a feature_spec.yaml of split_binary files (any feature counts).
        dataset_name: criteo_1t or criteo_kaggle.
        batch_size: training rows per rank per step.
        test_batch_size: validation/test rows per rank per step (default batch_size).
        drop_last_training_batch: drop the final partial training batch.
        limit_train_batches, limit_val_batches, limit_test_batches: cap each split.
        shuffle_batches: shuffle the order of training batches every epoch.
        shuffle_training_set: visit training rows in one random order.
        mmap_mode: read batches lazily from memory-mapped files.
        pin_memory: pin host batches (CUDA only).
        seed: seed of the data order and of random data.
        multi_hot_sizes: bag size per feature, to expand one-hot data into multi-hot.
        multi_hot_distribution_type: uniform (default) or pareto offsets for the bags.
        weight_column: the column of per-row sample weights (with ``dataset_path``, the
            spec's channel_spec weight); None trains and evaluates unweighted.
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
    max_buffered_row_groups: int = flag(4, help="Parquet: row groups a rank holds in memory at most")
    time_column: Optional[str] = flag(
        None, help="Parquet: timestamp, date or integer column (a Hive partition column such as date counts); "
                   "validation and test are then the latest rows")
    validation_window: Optional[str] = flag(
        None, help="with --time_column: the validation split, a duration (1d, 6h) or a fraction (0.1)")
    test_window: Optional[str] = flag(
        None, help="with --time_column: the test split, the latest rows: a duration (1d, 6h) or a fraction (0.1)")
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
    multi_hot_sizes: Optional[List[int]] = flag(
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
        for name in ("in_memory_binary_criteo_path", "synthetic_multi_hot_criteo_path"):
            path = getattr(self, name)
            if path is not None and not os.path.isdir(path):
                raise FlagError(f"{option(self, name)} {path}: no such directory")
        if self.dataset_path is not None and not os.path.isfile(self.dataset_path):
            raise FlagError(f"{option(self, 'dataset_path')} {self.dataset_path}: no such file "
                            "(give PATH/feature_spec.yaml)")
        given = [option(self, name) for name in DATA_SOURCE_FIELDS if getattr(self, name)]
        if len(given) > 1:
            raise FlagError(f"give one data path, not {' and '.join(given)}")
        sizes, distribution = option(self, "multi_hot_sizes"), option(self, "multi_hot_distribution_type")
        if self.weight_column is not None and not (self.dataset_path or self.parquet_path):
            raise FlagError(f"{option(self, 'weight_column')} needs {option(self, 'dataset_path')} or "
                            f"{option(self, 'parquet_path')} (Criteo and random data have no weights)")
        if self.parquet_path is None:
            for name in PARQUET_ONLY_FIELDS:
                if getattr(self, name) != flag_of(DataConfig, name).default:
                    raise FlagError(f"{option(self, name)} is for Parquet data: it needs {option(self, 'parquet_path')}")
        from data.sources import source_for  # here: data.sources imports this module
        source_for(self).check_flags()
        if self.multi_hot_sizes is not None and self.dataset_path:
            raise FlagError(f"{sizes} expands Criteo data; with --dataset_path give hotness in the spec")
        if self.multi_hot_sizes is not None:
            if self.synthetic_multi_hot_criteo_path:
                raise FlagError(f"{sizes} expands one-hot data; "
                                "--synthetic_multi_hot_criteo_path data is multi-hot already")
            if len(self.multi_hot_sizes) != NUM_SPARSE_FEATURES:
                raise FlagError(f"{sizes} has {len(self.multi_hot_sizes)} values but the data has "
                                f"{NUM_SPARSE_FEATURES} categorical features")
            if min(self.multi_hot_sizes) <= 0:
                raise FlagError(f"{sizes} values must be positive, got {min(self.multi_hot_sizes)}")
        elif self.multi_hot_distribution_type is not None:
            raise FlagError(f"{distribution} needs {sizes}")

    def limit(self, split: str) -> Optional[int]:
        return {"train": self.limit_train_batches, "validation": self.limit_val_batches,
                "test": self.limit_test_batches}[split]
