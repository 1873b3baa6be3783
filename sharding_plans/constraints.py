"""Sharding constraints from flags: `--sharding_type` and `--compute_kernel`, global or per table.

Both flags take either one value for every table (``row_wise``) or per-table
assignments (``t_cat_0=row_wise,t_cat_3=table_wise``), or both (a default first:
``table_wise,t_cat_0=row_wise``). The planner then only considers the given
choices for each table.
"""

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional
from collections.abc import Sequence

from common.config_flags import FlagError, flag, option

if TYPE_CHECKING:
    from torchrec.distributed.planner.types import ParameterConstraints

SHARDING_TYPES = (
    "data_parallel",
    "table_wise",
    "row_wise",
    "column_wise",
    "table_row_wise",
    "table_column_wise",
)
COMPUTE_KERNELS = ("dense", "fused", "fused_uvm", "fused_uvm_caching")
# What torchrec's sharder offers on CPU; the row splits run on CPU too (see
# `sharding_plans.sharders`) but the planner is only given them when asked for.
CPU_SHARDING_TYPES = ("data_parallel", "table_wise", "column_wise", "table_column_wise")
ROW_SHARDING_TYPES = ("row_wise", "table_row_wise")
COLUMN_SHARDING_TYPES = ("column_wise", "table_column_wise")
CUDA_ONLY_KERNELS = ("fused_uvm", "fused_uvm_caching")
# Compute kernels without an embedding cache: dense (data parallel) and FBGEMM's
# fused kernels in HBM or UVM. The others (fused_uvm_caching, key_value, the virtual
# tables) keep rows in a cache that prefetches and forwards fill.
UNCACHED_KERNELS = ("dense", "fused", "fused_uvm")
# Every sharding type but data_parallel: these run the fused FBGEMM kernels.
FUSED_SHARDING_TYPES = tuple(t for t in SHARDING_TYPES if t != "data_parallel")
# torchrec keeps column shards at least this wide unless told otherwise.
TORCHREC_MIN_COLUMN_SHARD = 32
ALL_TABLES = "*"


def check_table_precision(table: str, sharding_type: Optional[str], precision: str, source: str) -> None:
    """Raises FlagError (one line starting with ``source``) for an fp16 table that is
    data-parallel: FBGEMM's dense kernel has no fp16 backward, its updates are wrong."""
    if precision == "fp16" and sharding_type == "data_parallel":
        raise FlagError(f"{source}: table {table} is data_parallel with fp16 weights, and FBGEMM's dense "
                         "kernel has no fp16 backward (its updates are wrong): give it a fused sharding "
                         "type, or keep fp32 tables")


def parse_table_choices(text: str, flag: str, choices: Sequence[str]) -> dict[str, str]:
    """Parses ``VALUE`` / ``TABLE=VALUE,...`` / ``VALUE,TABLE=VALUE,...``.

    Returns {table or "*": value}. Raises FlagError naming the flag on an empty item,
    a repeated table or a value not in ``choices``.

    Example::

        parse_table_choices("table_wise,t_cat_0=row_wise", "--sharding_type", SHARDING_TYPES)
        # {"*": "table_wise", "t_cat_0": "row_wise"}
    """
    result: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise FlagError(f"{flag}: malformed list {text!r}: empty item")
        table, sep, value = item.rpartition("=")
        table = table.strip() if sep else ALL_TABLES
        value = value.strip()
        if sep and not table:
            raise FlagError(f"{flag}: malformed item {item!r}: expected TABLE=VALUE")
        if value not in choices:
            raise FlagError(f"{flag}: unknown value {value!r} (choose from {', '.join(choices)})")
        if table in result:
            what = "a default for every table" if table == ALL_TABLES else f"table {table}"
            raise FlagError(f"{flag}: {what} is given twice in {text!r}")
        result[table] = value
    return result


@dataclass
class ShardingFlags:
    """The constraint flags as given (the training and the plan command lines share them).

    Args:
        sharding_type: ``VALUE`` / ``TABLE=VALUE,...`` / ``VALUE,TABLE=VALUE,...``.
        compute_kernel: likewise.
    """

    sharding_type: Optional[str] = flag(
        None, help=f"{'|'.join(SHARDING_TYPES)}, for every table or per table: t_cat_0=row_wise,t_cat_1=table_wise")
    compute_kernel: Optional[str] = flag(None, help=f"{'|'.join(COMPUTE_KERNELS)}, for every table or per table")

    def constraints(self) -> "ShardingConstraints":
        return ShardingConstraints.from_flags(self.sharding_type, self.compute_kernel)


_SHARDING_TYPE, _COMPUTE_KERNEL = option(ShardingFlags, "sharding_type"), option(ShardingFlags, "compute_kernel")


@dataclass
class ShardingConstraints:
    """Which sharding types and compute kernels the planner may use, per table.

    Args:
        sharding_types: {table: sharding type}; the key "*" applies to every table
            without its own entry.
        compute_kernels: {table: compute kernel}, likewise.

    Example::

        constraints = ShardingConstraints(sharding_types={"*": "row_wise"})
        constraints.validate(["t_cat_0", "t_cat_1"], compute_device="cpu")
    """

    sharding_types: dict[str, str] = field(default_factory=dict)
    compute_kernels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_flags(cls, sharding_type: Optional[str], compute_kernel: Optional[str]) -> "ShardingConstraints":
        """From the texts of --sharding_type and --compute_kernel (None: not given)."""
        return cls(
            sharding_types=parse_table_choices(sharding_type, _SHARDING_TYPE, SHARDING_TYPES)
            if sharding_type else {},
            compute_kernels=parse_table_choices(compute_kernel, _COMPUTE_KERNEL, COMPUTE_KERNELS)
            if compute_kernel else {},
        )

    @property
    def empty(self) -> bool:
        return not self.sharding_types and not self.compute_kernels

    def sharding_type(self, table: str) -> Optional[str]:
        return self.sharding_types.get(table, self.sharding_types.get(ALL_TABLES))

    def compute_kernel(self, table: str) -> Optional[str]:
        return self.compute_kernels.get(table, self.compute_kernels.get(ALL_TABLES))

    def validate(self, table_names: Sequence[str], compute_device: Optional[str] = None) -> None:
        """Raises FlagError (one line naming the flag) for unknown tables and for
        choices that cannot work together or on ``compute_device`` (None: skip those)."""
        known = set(table_names)
        for name, given in ((_SHARDING_TYPE, self.sharding_types), (_COMPUTE_KERNEL, self.compute_kernels)):
            for table in given:
                if table != ALL_TABLES and table not in known:
                    raise FlagError(f"{name}: unknown table {table!r} (tables: {_describe_tables(table_names)})")
        for table in table_names:
            sharding, kernel = self.sharding_type(table), self.compute_kernel(table)
            if sharding == "data_parallel" and kernel not in (None, "dense"):
                raise FlagError(f"{_COMPUTE_KERNEL}: table {table} is data_parallel, which needs the dense kernel, not {kernel}")
            if kernel == "dense" and sharding not in (None, "data_parallel"):
                raise FlagError(f"{_COMPUTE_KERNEL}: the dense kernel is for data_parallel tables only, {table} is {sharding}")
            if compute_device == "cpu" and kernel in CUDA_ONLY_KERNELS:
                raise FlagError(f"{_COMPUTE_KERNEL}: {kernel} ({table}) needs CUDA, the compute device is cpu")

    def check_precision(self, table_names: Sequence[str], precision: str, source: str) -> None:
        """Raises FlagError (starting with ``source``) when a table with ``precision``
        weights would be data-parallel under these constraints (`check_table_precision`)."""
        for table in table_names:
            kernel = self.compute_kernel(table)
            check_table_precision(table, "data_parallel" if kernel == "dense" else self.sharding_type(table),
                                  precision, source)

    def row_splits_on_cpu(self, table_names: Sequence[str], compute_device: str) -> bool:
        """True when some table asks for a row split the stock CPU sharder does not offer."""
        return compute_device == "cpu" and any(self.sharding_type(t) in ROW_SHARDING_TYPES for t in table_names)

    def parameter_constraints(
        self, table_names: Sequence[str], embedding_dim: int, world_size: int, compute_device: str
    ) -> dict[str, "ParameterConstraints"]:
        """The planner's per-table constraints.

        A table asked to be column-split may be cut into as many shards as there are
        ranks (down to 4 columns): torchrec's default minimum of 32 columns would keep
        narrow tables in one piece. When row splits are offered on CPU, tables
        without a constraint keep the stock CPU choices.
        """
        # Here, not at the top: the flags (this module) load without torchrec, for --help.
        from torchrec.distributed.planner.types import ParameterConstraints

        row_splits_offered = self.row_splits_on_cpu(table_names, compute_device)
        result: dict[str, ParameterConstraints] = {}
        for table in table_names:
            sharding, kernel = self.sharding_type(table), self.compute_kernel(table)
            if sharding is None and kernel is None and not row_splits_offered:
                continue
            if sharding is not None:
                sharding_types: Optional[list[str]] = [sharding]
            elif kernel is not None or row_splits_offered:
                # The types the kernel can run (the planner warns per table otherwise).
                offered = CPU_SHARDING_TYPES if compute_device == "cpu" else SHARDING_TYPES
                sharding_types = [t for t in offered if kernel is None or (t == "data_parallel") == (kernel == "dense")]
            else:
                sharding_types = None
            min_partition = None
            if sharding in COLUMN_SHARDING_TYPES:
                per_rank = 4 * math.ceil(embedding_dim / world_size / 4)
                min_partition = max(4, min(TORCHREC_MIN_COLUMN_SHARD, per_rank))
            result[table] = ParameterConstraints(
                sharding_types=sharding_types,
                compute_kernels=[kernel] if kernel is not None else None,
                min_partition=min_partition,
            )
        return result


def _describe_tables(names: Sequence[str]) -> str:
    if len(names) > 4:
        return f"{names[0]}, {names[1]}, ..., {names[-1]}"
    return ", ".join(names)
