"""The nouns of sharding plans, in one place: what each is for, and the names the
other modules of the package (and its users) import.

- `ShardingFlags` -> `ShardingConstraints`: the ``--sharding_type`` / ``--compute_kernel``
  flags as given, and what they allow the planner per table.
- `TopologyFlags`: the plan CLI's hardware flags (GiB, ranks); `PlannerConfig`: the
  hardware and batch a plan is made for, resolved (bytes).
- `PlanRequest`: one dry-run plan's tables, topology and constraints.
- `TableSpec`, `RankEstimate`, `SavedPlan`: a table's shape, one rank's estimated
  share, and a plan with what it was made for (the plan file's content).
- `PlanSummary`: a plan as plain dicts, for the rules a run obeys.
- `Preset`: a published configuration, a recipe (tables, width, batch) plus a topology.
- `PlanDoesNotFit`: the planner found no placement in the ranks' memory.

This module loads without torch and torchrec (the flags' classes are here, and the
entry points answer --help before loading them); torchrec's types are named in
annotations only.
"""

import dataclasses
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from common.config_flags import FlagError, flag, option
from common.errors import BadInput
from models.config import ModelConfig
from models.embedding_optimizer_config import EmbeddingOptimizerConfig
from recipes import Recipe
from sharding_plans.constraints import (
    ALL_TABLES,
    COLUMN_SHARDING_TYPES,
    COMPUTE_KERNELS,
    CPU_SHARDING_TYPES,
    CUDA_ONLY_KERNELS,
    ROW_SHARDING_TYPES,
    SHARDING_TYPES,
    TORCHREC_MIN_COLUMN_SHARD,
    check_table_precision,
    parse_table_choices,
)

if TYPE_CHECKING:
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingPlan

# The checked-in plans of the presets, one ``<name>.json`` each.
PRESET_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets")
# Share of each device's memory kept free for dense parameters, activations and buffers.
STORAGE_RESERVATION_PERCENTAGE = 0.15

# A plan as `sharding_plans.report.plan_summary` writes it: {table: {"sharding_type",
# "compute_kernel", "ranks", "shards"}}.
PlanSummary = dict[str, dict[str, Any]]


class PlanDoesNotFit(RuntimeError):
    """The planner found no placement within the memory of the given ranks."""


# ---------------------------------------------------------------- constraints


@dataclass
class ShardingFlags:
    """The constraint flags as given (the training and the plan command lines share
    them): one value for every table, ``TABLE=VALUE,...``, or both (the default first)."""

    sharding_type: str | None = flag(
        None, help=f"{'|'.join(SHARDING_TYPES)}, for every table or per table: t_cat_0=row_wise,t_cat_1=table_wise"
    )
    compute_kernel: str | None = flag(None, help=f"{'|'.join(COMPUTE_KERNELS)}, for every table or per table")

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
    def from_flags(cls, sharding_type: str | None, compute_kernel: str | None) -> "ShardingConstraints":
        """From the texts of --sharding_type and --compute_kernel (None: not given)."""
        return cls(
            sharding_types=parse_table_choices(sharding_type, _SHARDING_TYPE, SHARDING_TYPES) if sharding_type else {},
            compute_kernels=parse_table_choices(compute_kernel, _COMPUTE_KERNEL, COMPUTE_KERNELS)
            if compute_kernel
            else {},
        )

    @property
    def empty(self) -> bool:
        return not self.sharding_types and not self.compute_kernels

    def sharding_type(self, table: str) -> str | None:
        return self.sharding_types.get(table, self.sharding_types.get(ALL_TABLES))

    def compute_kernel(self, table: str) -> str | None:
        return self.compute_kernels.get(table, self.compute_kernels.get(ALL_TABLES))

    def validate(self, table_names: Sequence[str], compute_device: str | None = None) -> None:
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
                raise FlagError(
                    f"{_COMPUTE_KERNEL}: table {table} is data_parallel, which needs the dense kernel, not {kernel}"
                )
            if kernel == "dense" and sharding not in (None, "data_parallel"):
                raise FlagError(
                    f"{_COMPUTE_KERNEL}: the dense kernel is for data_parallel tables only, {table} is {sharding}"
                )
            if compute_device == "cpu" and kernel in CUDA_ONLY_KERNELS:
                raise FlagError(f"{_COMPUTE_KERNEL}: {kernel} ({table}) needs CUDA, the compute device is cpu")

    def check_precision(self, table_names: Sequence[str], precision: str, source: str) -> None:
        """Raises FlagError (starting with ``source``) when a table with ``precision``
        weights would be data-parallel under these constraints (`check_table_precision`)."""
        for table in table_names:
            kernel = self.compute_kernel(table)
            check_table_precision(
                table, "data_parallel" if kernel == "dense" else self.sharding_type(table), precision, source
            )

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
                sharding_types: list[str] | None = [sharding]
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


# ---------------------------------------------------------------- hardware


@dataclass
class TopologyFlags:
    """The plan CLI's hardware flags; unset ones are resolved on the machine that plans
    (`sharding_plans.cli`), a preset sets them all."""

    world_size: int = flag(1, help="ranks")
    local_world_size: int | None = flag(None, help="ranks per host (default 8, at most the world size)")
    compute_device: str = flag("cuda", choices=("cuda", "cpu"), help="where the tables live")
    hbm_gb: float | None = flag(None, help="GiB of memory per GPU (cuda; default: this machine's GPU)")
    ddr_gb: float | None = flag(
        None, help="GiB of host memory per rank (default: this machine's memory / --local_world_size)"
    )
    intra_node_bandwidth: float | None = flag(None, help="GiB/s between ranks of a host (default torchrec's)")
    inter_node_bandwidth: float | None = flag(None, help="GiB/s between hosts, per rank (default torchrec's)")

    def validate(self) -> None:
        """Raises FlagError naming the flag: sizes and bandwidths must be positive, a
        host no larger than the job, and --hbm_gb is for cuda."""
        for name in (
            "world_size",
            "local_world_size",
            "hbm_gb",
            "ddr_gb",
            "intra_node_bandwidth",
            "inter_node_bandwidth",
        ):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise FlagError(f"{option(self, name)} must be positive, got {value:g}")
        if self.local_world_size is not None and self.local_world_size > self.world_size:
            raise FlagError(
                f"{option(self, 'local_world_size')} ({self.local_world_size}) must not exceed "
                f"the world size ({self.world_size})"
            )
        if self.compute_device == "cpu" and self.hbm_gb is not None:
            raise FlagError("--hbm_gb is for --compute_device cuda; with cpu the tables live in --ddr_gb")


@dataclass
class PlannerConfig:
    """The hardware and batch the plan is made for.

    Args:
        world_size: ranks in the job.
        local_world_size: ranks per host.
        compute_device: "cuda" or "cpu".
        batch_size: training rows per rank per step.
        hbm_cap_bytes: memory per GPU (CUDA only; None: queried from the device).
        ddr_cap_bytes: host memory per rank (None: this host's memory / local_world_size).
        intra_host_bw_gib_s: bandwidth between ranks of one host, GiB/s (None: torchrec's default).
        inter_host_bw_gib_s: bandwidth between hosts per rank, GiB/s (None: torchrec's default).
    """

    world_size: int
    local_world_size: int
    compute_device: str
    batch_size: int
    hbm_cap_bytes: int | None = None
    ddr_cap_bytes: int | None = None
    intra_host_bw_gib_s: float | None = None
    inter_host_bw_gib_s: float | None = None

    def validate(self) -> None:
        if self.compute_device not in ("cuda", "cpu"):
            raise BadInput(f"compute device must be cuda or cpu, got {self.compute_device!r}")
        if self.world_size <= 0 or self.local_world_size <= 0:
            raise BadInput("world size and local world size must be positive")
        for name, value in (("hbm", self.hbm_cap_bytes), ("ddr", self.ddr_cap_bytes)):
            if value is not None and value <= 0:
                raise BadInput(f"{name} capacity must be positive, got {value}")
        for name, bandwidth in (("intra-host", self.intra_host_bw_gib_s), ("inter-host", self.inter_host_bw_gib_s)):
            if bandwidth is not None and not bandwidth > 0:
                raise BadInput(f"{name} bandwidth must be positive, got {bandwidth}")

    @property
    def usable_fraction(self) -> float:
        """Share of each rank's memory the planner may fill with embeddings."""
        return 1.0 - STORAGE_RESERVATION_PERCENTAGE


# ---------------------------------------------------------------- plans


@dataclass
class TableSpec:
    """One embedding table: rows x dim of the given precision ("fp32" or "fp16")."""

    rows: int
    dim: int
    precision: str = "fp32"

    @property
    def num_bytes(self) -> int:
        return self.rows * self.dim * (2 if self.precision == "fp16" else 4)


@dataclass
class RankEstimate:
    """One rank's share of a plan, as the planner estimates it.

    Args:
        rank: the rank.
        hbm_bytes: GPU memory of its embedding shards (0 on CPU).
        ddr_bytes: host memory of its embedding shards (all of it on CPU; UVM on CUDA).
        step_time_ms: its embedding work per training step, in milliseconds.

    Example::

        RankEstimate(rank=0, hbm_bytes=2**30, ddr_bytes=0, step_time_ms=1.25)
    """

    rank: int
    hbm_bytes: int
    ddr_bytes: int
    step_time_ms: float

    @property
    def total_bytes(self) -> int:
        return self.hbm_bytes + self.ddr_bytes


@dataclass
class SavedPlan:
    """A sharding plan with what it was made for (`sharding_plans.plan_file` writes
    and reads it).

    Args:
        topology: ranks, device, memory and batch the plan was made for.
        tables: {table name: shape}, in model order.
        plan: torchrec's plan.
        estimates: the planner's per-rank estimates (None when not planned here).

    Example::

        write_plan("plan.json", SavedPlan(topology, tables, plan, estimates))
        assert read_plan("plan.json") == SavedPlan(topology, tables, plan, estimates)
    """

    topology: PlannerConfig
    tables: dict[str, TableSpec]
    plan: "ShardingPlan"
    estimates: list[RankEstimate] | None = None


@dataclass
class PlanRequest:
    """Tables, hardware and constraints of one dry-run plan (`sharding_plans.dry_run`).

    Args:
        feature_names: categorical features; table i is ``t_<feature_names[i]>``.
        num_embeddings_per_feature: rows of each table.
        embedding_dim: width of every table.
        embedding_precision: "fp32" or "fp16".
        optimizer: the fused embedding optimizer (its state takes memory too).
        topology: ranks, device, memory and batch.
        constraints: sharding types and kernels the planner may use.
        pooling_factors: ids a sample in each table's bags (``--multi_hot_sizes``;
            None: one id), the traffic the planner costs each table by.

    Example::

        request = PlanRequest(["cat_0"], [1000], 64, "fp32", "sgd",
                              PlannerConfig(2, 2, "cuda", 512, hbm_cap_bytes=2**34, ddr_cap_bytes=2**36))
        saved = plan_request(request)
    """

    feature_names: list[str]
    num_embeddings_per_feature: list[int]
    embedding_dim: int
    embedding_precision: str
    optimizer: str
    topology: PlannerConfig
    constraints: ShardingConstraints = field(default_factory=ShardingConstraints)
    pooling_factors: list[float] | None = None

    @property
    def model_config(self) -> ModelConfig:
        # The dense layers do not change the plan: the smallest valid ones.
        return ModelConfig(
            num_embeddings_per_feature=list(self.num_embeddings_per_feature),
            sparse_feature_names=list(self.feature_names),
            dense_in_features=1,
            embedding_dim=self.embedding_dim,
            embedding_precision=self.embedding_precision,
            dense_arch_layer_sizes=[self.embedding_dim],
            over_arch_layer_sizes=[1, 1],
        )

    @property
    def tables(self) -> dict[str, TableSpec]:
        """{table: TableSpec} in model order."""
        config = self.model_config
        return {
            name: TableSpec(rows, self.embedding_dim, self.embedding_precision)
            for name, rows in zip(config.table_names, self.num_embeddings_per_feature)
        }

    def validate(self) -> None:
        """Raises BadInput (one line naming the flag) for bad tables or constraints."""
        self.model_config.validate()
        EmbeddingOptimizerConfig(optimizer=self.optimizer).validate()
        self.topology.validate()
        self.constraints.validate(self.model_config.table_names, self.topology.compute_device)

    def with_world_size(self, world_size: int) -> "PlanRequest":
        """The same request on ``world_size`` ranks (hosts keep their size, up to the world size)."""
        topology = dataclasses.replace(
            self.topology, world_size=world_size, local_world_size=min(self.topology.local_world_size, world_size)
        )
        return dataclasses.replace(self, topology=topology)


# ---------------------------------------------------------------- presets


@dataclass(frozen=True)
class Preset:
    """A published configuration: a recipe (the tables, their width, the batch) plus a
    topology (`sharding_plans.presets` has them).

    Args:
        name: what the CLI calls it (``--preset mlperf``); its recipe has the same name.
        title: its name in the published table.
        recipe: what it trains (``--recipe NAME``).
        topology: the hardware it ran on.

    Example::

        PRESETS["mlperf"].topology.world_size
    """

    name: str
    title: str
    recipe: Recipe
    topology: TopologyFlags

    @property
    def plan_path(self) -> str:
        """The checked-in plan of this preset."""
        return os.path.join(PRESET_DIR, f"{self.name}.json")
