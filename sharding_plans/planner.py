"""Builds the embedding sharding plan for the real hardware.

The planner is told the real memory (CUDA: the device's; CPU: host memory shared by
the ranks of a node) instead of TorchRec's 32 GiB HBM / 128 GiB DDR defaults, and
reserves a fixed share for the dense part and activations.
"""

import contextlib
import logging
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.constants import DEFAULT_PERF_ESTIMATOR
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.estimator import EmbeddingPerfEstimatorFactory
from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import (
    HardwareConfig,
    KernelConfig,
    ParameterConstraints,
    PlannerError,
    PlannerErrorType,
    Topology,
    TopologyFactory,
    TrainerConfig,
)
from torchrec.distributed.types import ModuleSharder, ShardingPlan

from common.errors import BadInput
from sharding_plans.estimates import FullPrecisionOptimizerState, PlanRecorder
from sharding_plans.types import STORAGE_RESERVATION_PERCENTAGE, PlanDoesNotFit, PlannerConfig, RankEstimate

# torchrec's bandwidths are in bytes per millisecond.
_GIB_PER_S = 1024**3 / 1000


def host_memory_bytes() -> int:
    """Physical memory of this host."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def build_topology(config: PlannerConfig) -> Topology:
    """A `Topology` with the real (or given) memory per rank."""
    config.validate()
    hbm = config.hbm_cap_bytes
    if config.compute_device == "cuda" and hbm is None:
        hbm = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    ddr = config.ddr_cap_bytes or host_memory_bytes() // config.local_world_size
    bandwidths = {
        key: value * _GIB_PER_S
        for key, value in (("intra_host_bw", config.intra_host_bw_gib_s), ("inter_host_bw", config.inter_host_bw_gib_s))
        if value is not None
    }
    return TopologyFactory.create_topology(
        TrainerConfig(
            world_size=config.world_size,
            local_world_size=config.local_world_size,
            hbm_cap_bytes=hbm if config.compute_device == "cuda" else None,
            ddr_cap_bytes=ddr,
        ),
        hardware_config=HardwareConfig(**bandwidths),
        kernel_config=KernelConfig(compute_device=config.compute_device),
    )


def _planner(
    config: PlannerConfig,
    constraints: dict[str, ParameterConstraints] | None,
    recorder: PlanRecorder,
) -> EmbeddingShardingPlanner:
    topology = build_topology(config)
    # torchrec's own estimators, then the optimizer state it misses on fp16 tables.
    estimators = [
        EmbeddingPerfEstimatorFactory.create(DEFAULT_PERF_ESTIMATOR, topology=topology, constraints=constraints),
        EmbeddingStorageEstimator(topology=topology, constraints=constraints),
        FullPrecisionOptimizerState(topology),
    ]
    return EmbeddingShardingPlanner(
        topology=topology,
        batch_size=config.batch_size,
        enumerator=EmbeddingEnumerator(
            topology=topology, batch_size=config.batch_size, constraints=constraints, estimator=estimators
        ),
        storage_reservation=FixedPercentageStorageReservation(STORAGE_RESERVATION_PERCENTAGE),
        constraints=constraints,
        stats=[recorder],  # instead of torchrec's, which prints its own report
    )


class _DataParallelSpecNotice(logging.Filter):
    """torchrec warns, on the root logger, that data-parallel tables have no
    sharding spec: they never have one."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Sharding spec not found for")


@contextlib.contextmanager
def _quiet_planner() -> Iterator[None]:
    notice = _DataParallelSpecNotice()
    logging.getLogger().addFilter(notice)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(notice)


def build_sharding_plan(
    module: nn.Module,
    sharders: list[ModuleSharder[nn.Module]],
    config: PlannerConfig,
    process_group: dist.ProcessGroup | None = None,
    constraints: dict[str, ParameterConstraints] | None = None,
) -> tuple[ShardingPlan, list[RankEstimate]]:
    """Plans the sharding of every embedding module in ``module``; returns the plan
    and the planner's per-rank estimates.

    With a process group the plan is made on rank 0 and broadcast with its
    estimates, so every rank uses the same plan; without one (a dry run, or one
    process) it is made locally.
    ``constraints`` maps table names to allowed sharding types / kernels.

    Args:
        module: the model, tables on the meta device.
        sharders: the sharders DistributedModelParallel will use.
        config: hardware and batch.
        process_group: the job's group (None: plan locally).
        constraints: per-table constraints (see `ShardingConstraints.parameter_constraints`).

    Raises:
        PlanDoesNotFit: no placement fits the ranks' memory (on every rank alike).

    Example::

        plan, estimates = build_sharding_plan(model, get_default_sharders(),
                                   PlannerConfig(world_size=2, local_world_size=2,
                                                 compute_device="cpu", batch_size=512))
    """
    recorder = PlanRecorder()
    planner = _planner(config, constraints, recorder)
    if process_group is None or dist.get_world_size(process_group) == 1:
        return _plan(planner, module, sharders), recorder.rank_estimates(config.world_size)
    # Plan on rank 0 and broadcast, as torchrec's collective_plan does; but broadcast a
    # failure too, so the other ranks raise it instead of waiting for the plan until
    # the collective times out.
    outcome: list[object] = [None]
    if dist.get_rank(process_group) == 0:
        try:
            plan = _plan(planner, module, sharders)
            outcome = [(plan, recorder.rank_estimates(config.world_size))]
        except PlanDoesNotFit as e:
            outcome = [("does not fit", str(e))]
        except Exception as e:
            outcome = [("failed", f"rank 0 failed to plan: {type(e).__name__}: {e}")]
            dist.broadcast_object_list(outcome, group=process_group, group_src=0)
            raise
    dist.broadcast_object_list(outcome, group=process_group, group_src=0)
    if isinstance(outcome[0], tuple) and isinstance(outcome[0][0], str):
        kind, message = outcome[0]
        raise PlanDoesNotFit(message) if kind == "does not fit" else RuntimeError(message)
    return outcome[0]  # type: ignore[return-value]


def _plan(
    planner: EmbeddingShardingPlanner, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]
) -> ShardingPlan:
    """The planner's plan; PlanDoesNotFit or a one-line BadInput when it finds none."""
    try:
        with _quiet_planner():
            return planner.plan(module, sharders)
    except PlannerError as e:
        if e.error_type == PlannerErrorType.INSUFFICIENT_STORAGE:
            raise PlanDoesNotFit("the tables need more memory than the ranks have") from e
        if e.error_type in (PlannerErrorType.STRICT_CONSTRAINTS, PlannerErrorType.PARTITION):
            raise PlanDoesNotFit("no placement allowed by the constraints fits in the ranks' memory") from e
        raise BadInput(f"the planner failed: {str(e).strip().splitlines()[0]}") from e


def plan_with_estimates(
    module: nn.Module,
    sharders: list[ModuleSharder[nn.Module]],
    config: PlannerConfig,
    constraints: dict[str, ParameterConstraints] | None = None,
) -> tuple[ShardingPlan, list[RankEstimate]]:
    """Plans locally (no process group) and returns the plan with the planner's
    per-rank memory and step-time estimates.

    Raises:
        PlanDoesNotFit: no placement fits the ranks' memory.
        BadInput: the constraints cannot be met (one line).

    Example::

        plan, ranks = plan_with_estimates(model, build_sharders(), config)
        print(max(r.hbm_bytes for r in ranks))
    """
    recorder = PlanRecorder()
    plan = _plan(_planner(config, constraints, recorder), module, sharders)
    return plan, recorder.rank_estimates(config.world_size)
