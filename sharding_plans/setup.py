"""Where a run's plan comes from: a saved plan file, or the planner under constraints.

`prepare_sharding` does everything that can fail on bad input (reading the plan
file and checking it against the model and the job, checking the constraints
against the device) before any process-group work, so every rank fails alike and
none waits on another. `ShardingSetup.plan` then plans (collectively) or returns the
loaded plan.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import ModuleSharder, ShardingPlan

from sharding_plans.constraints import ROW_SHARDING_TYPES
from sharding_plans.plan_check import check_plan_for_run, check_plan_locks_cache_lines, embedding_tables
from sharding_plans.plan_file import read_plan
from sharding_plans.planner import build_sharding_plan
from sharding_plans.rules import planner_constraints
from sharding_plans.sharders import build_sharders
from sharding_plans.types import PlannerConfig, PlanSummary, RankEstimate, ShardingConstraints


@dataclass
class ShardingSetup:
    """The sharders for DistributedModelParallel and either a loaded plan or the
    planner's constraints.

    Example::

        setup = prepare_sharding(model, ...)   # before the process group
        plan, estimates = setup.plan(model, planner_config, process_group)
    """

    sharders: list[ModuleSharder[nn.Module]]
    loaded_plan: ShardingPlan | None = None
    loaded_estimates: list[RankEstimate] | None = None
    constraints: dict[str, ParameterConstraints] | None = None

    def plan(
        self, model: nn.Module, planner_config: PlannerConfig, process_group: dist.ProcessGroup | None
    ) -> tuple[ShardingPlan, list[RankEstimate] | None]:
        """The loaded plan, or the planner's (made on rank 0 and broadcast), with the
        planner's per-rank estimates (None for a plan file written without them).
        Collective when planning on several ranks."""
        if self.loaded_plan is not None:
            return self.loaded_plan, self.loaded_estimates
        return build_sharding_plan(model, self.sharders, planner_config, process_group, self.constraints)


def prepare_sharding(
    model: nn.Module,
    table_names: Sequence[str],
    embedding_dim: int,
    embedding_precision: str,
    device: torch.device,
    world_size: int,
    local_world_size: int,
    plan_path: str | None = None,
    constraints: ShardingConstraints | None = None,
    prefetch_pipeline: bool = False,
    resumed_plan: PlanSummary | None = None,
    pooling_factors: Sequence[float] | None = None,
) -> ShardingSetup:
    """Reads and checks the plan file ``plan_path``, or checks the constraints for this
    device and adds the run's own (`sharding_plans.rules.planner_constraints`).

    Args:
        model: the unsharded model (tables on the meta device).
        table_names, embedding_dim, embedding_precision: its tables.
        device, world_size, local_world_size: the job.
        plan_path: a saved plan to use instead of planning.
        constraints: the flags' constraints (without a plan file).
        prefetch_pipeline: the kernels must lock prefetched cache lines (a plan file
            that turns the locking off is refused).
        resumed_plan: the plan summary of the checkpoint a run resumes.
        pooling_factors: ids a sample in each table's bags (``--multi_hot_sizes``),
            for the planner's cost of each table (None: one id).

    Raises:
        BadInput or ValueError: one line, on a plan that does not match the model or
            the job, or constraints the device cannot meet.
    """
    if plan_path is not None:
        saved = read_plan(plan_path)
        check_plan_for_run(saved, plan_path, embedding_tables(model), world_size, local_world_size, device)
        if prefetch_pipeline:
            check_plan_locks_cache_lines(saved, plan_path)
        row_splits = device.type == "cpu" and any(
            ps.sharding_type in ROW_SHARDING_TYPES
            for module_plan in saved.plan.plan.values()
            for ps in module_plan.values()
        )
        return ShardingSetup(
            sharders=build_sharders(row_splits, prefetch_pipeline),
            loaded_plan=saved.plan,
            loaded_estimates=saved.estimates,
        )
    constraints = constraints or ShardingConstraints()
    constraints.validate(table_names, device.type)
    return ShardingSetup(
        sharders=build_sharders(constraints.row_splits_on_cpu(table_names, device.type), prefetch_pipeline),
        constraints=planner_constraints(
            constraints.parameter_constraints(table_names, embedding_dim, world_size, device.type),
            table_names,
            embedding_precision,
            resumed_plan,
            pooling_factors,
        ),
    )
