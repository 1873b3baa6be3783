"""Where the data comes from and how it is batched: `DataConfig` (the data flags).

Imports neither torch nor torchrec, so that the entry points answer --help and bad
flags before loading them; the loaders are built by data/batching/loaders.py.
"""

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from common.config_flags import FlagError, check_choices, config_values, flag, flags_of, option, variants
from common.sequence_columns import parse_sequence_columns
from data.binary.criteo_layout import NUM_SPARSE_FEATURES
from data.sources import DEFAULT_SOURCE, SOURCE_OPTIONS, check_source_flags, chosen_source, refuse_flag_of_other_source
from data.sources.parquet import DENSE_TRANSFORMS, ID_HASHING  # noqa: F401  (their old home)
from data.sources.random import RANDOM_DATA_BATCHES  # noqa: F401  (its old home)
from data.sources.types import MULTI_HOT_DISTRIBUTIONS, SPLITS, BatchLoader, DataSource  # noqa: F401  (BatchLoader's and MULTI_HOT_DISTRIBUTIONS' old home)

# Offsets of the extra ids of --multi_hot_sizes bags (data/batching/multi_hot.py draws them).

DATASET_NAMES = ("criteo_1t", "criteo_kaggle")


@dataclass
class DataConfig:
    """The data flags: which source (at most one path flag; none: uniform random data),
    how it is split and batched.

    Args:
        source_options: the chosen source's flags (its options dataclass, one of
            ``data.sources.SOURCE_OPTIONS``; its path flag chose it); None: random data's.
            Another source's flags have no place here: given, they are refused.
        seed: seed of the data order and of random data (the run's ``--seed``).

    Example::

        DataConfig(source_options=ParquetOptions(parquet_path="s3://b/t", sparse_columns="C*"), batch_size=64)
        DataConfig.from_flags(parquet_path="s3://b/t", sparse_columns="C*", batch_size=64)  # the same
    """

    # First: the path flags come first in --help.
    source_options: Any = variants(chosen_source, SOURCE_OPTIONS, refuse_others=refuse_flag_of_other_source)
    dataset_name: str = flag("criteo_1t", choices=DATASET_NAMES, help="which Criteo data set the files are")
    batch_size: int = flag(32, help="training rows per rank per step")
    test_batch_size: int | None = flag(None, help="validation/test rows per rank (default --batch_size)")
    drop_last_training_batch: bool = flag(False, help="drop the last partial training batch")
    limit_train_batches: int | None = flag(None, help="training batches per epoch at most")
    limit_val_batches: int | None = flag(None, help="validation batches at most")
    limit_test_batches: int | None = flag(None, help="test batches at most")
    shuffle_batches: bool = flag(False, help="shuffle the order of training batches every epoch")
    shuffle_training_set: bool = flag(False, help="visit training rows in one random order (same on every rank)")
    mmap_mode: bool = flag(
        False, help="read batches lazily from memory-mapped files instead of loading this rank's rows"
    )
    pin_memory: bool = flag(False, help="pin host batches (CUDA)")
    seed: int = 0
    multi_hot_sizes: list[int] | None = flag(
        None, help=f"expand one-hot data into multi-hot bags of these sizes ({NUM_SPARSE_FEATURES} values)"
    )
    multi_hot_distribution_type: str | None = flag(
        None, choices=MULTI_HOT_DISTRIBUTIONS, help="offsets of the extra ids in a bag (default uniform)"
    )
    weight_column: str | None = flag(
        None,
        help="column of per-row sample weights (with --dataset_path: the spec's channel_spec weight), "
        "used in the loss (sum(w*loss)/sum(w)) and the evaluation metrics; default unweighted",
    )
    sequence_columns: list[str] = flag(
        [],
        help="HIST:ITEM: the history feature HIST (the items of the row's user before it, newest last) "
        "looked up in the embedding table of the categorical feature ITEM and pooled by "
        "--sequence_interaction; repeat the flag or comma-separate pairs for several",
        metavar="HIST:ITEM",
    )
    max_history: int = flag(20, help="longest history a row keeps (its newest items) with --sequence_columns")

    def __post_init__(self) -> None:
        if self.source_options is None:
            self.source_options = SOURCE_OPTIONS[DEFAULT_SOURCE]()
        elif not isinstance(self.source_options, tuple(SOURCE_OPTIONS.values())):
            raise TypeError(f"source_options takes a data source's options, got a {type(self.source_options).__name__}")

    def __getattr__(self, name: str) -> Any:
        """A source's flag (``config.parquet_path``, ``config.rolling_windows``): the
        chosen source's value, else the flag's default (another source's flags are
        never set). Read only: a source's flags are set through ``source_options``."""
        if name.startswith("__") or name == "source_options":
            raise AttributeError(name)
        item = _SOURCE_FLAGS.get(name)
        if item is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.source_options, name, item.default)

    def __getstate__(self) -> dict[str, Any]:
        """The fields only: the checked source (`validate`) stays with this object
        (it may hold an open file system), not in pickles and copies."""
        return {name: value for name, value in self.__dict__.items() if name != "_checked"}

    @classmethod
    def from_flags(cls, seed: int = 0, **values: Any) -> "DataConfig":
        """The config of these flags' values, given as the command line would ({field:
        value}, a source's flags among them; the others their defaults).

        Raises:
            FlagError: two path flags, or a flag of a source the paths do not choose.
        """
        unknown = set(values) - {item.field.name for item in flags_of(cls)}
        if unknown:
            raise TypeError(f"DataConfig has no flag field {sorted(unknown)[0]!r}")
        return cls(**config_values(cls, argparse.Namespace(**values)), seed=seed)

    @property
    def eval_batch_size(self) -> int:
        return self.test_batch_size or self.batch_size

    def validate(self) -> DataSource:
        """The source the flags name, its flags checked: the run's one source object
        (the trainer and its start-up report take it). Asked again with the same
        values (`TrainConfig.validate`), the same object, not checked again.

        Raises:
            FlagError: one line naming the offending flag.
        """
        values = dataclasses.astuple(self)
        checked = self.__dict__.get("_checked")
        if checked is not None and checked[0] == values:
            return checked[1]
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
        if self.max_history <= 0:
            raise FlagError(f"{option(self, 'max_history')} must be positive, got {self.max_history}")
        parse_sequence_columns(self.sequence_columns, option(self, "sequence_columns"))
        # What depends on the source: its path, and the flags it can honour.
        source = check_source_flags(self)
        self.__dict__["_checked"] = (values, source)  # not a field: no flag, not recorded
        return source

    def limit(self, split: str) -> int | None:
        return {
            "train": self.limit_train_batches,
            "validation": self.limit_val_batches,
            "test": self.limit_test_batches,
        }[split]


# The flags of the sources' options, by field name (`DataConfig.__getattr__`).
_SOURCE_FLAGS = {item.field.name: item for item in flags_of(DataConfig) if item.within == "source_options"}
