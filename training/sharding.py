"""Where the run's plan comes from: a saved plan file, or the planner under constraints.

`prepare_sharding` does everything that can fail on bad input (reading the plan
file and checking it against the model and the job, checking the constraints
against the device) before any process-group work, so every rank fails alike and
none waits on another. `ShardingSetup.plan` then plans (collectively) or returns the
loaded plan.
"""

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch.distributed as dist
from torch import nn
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import ModuleSharder, ShardingPlan

from sharding_plans import PlannerConfig, build_sharders, build_sharding_plan
from sharding_plans.constraints import ROW_SHARDING_TYPES
from sharding_plans.plan_check import check_plan_for_run, embedding_tables
from sharding_plans.plan_file import read_plan
from training.config import TrainConfig
from training.distributed import DistributedEnv


@dataclass
class ShardingSetup:
    """The sharders for DistributedModelParallel and either a loaded plan or the
    planner's constraints.

    Example::

        setup = prepare_sharding(config, env, model)   # before the process group
        plan = setup.plan(model, planner_config, process_group)
    """

    sharders: List[ModuleSharder[nn.Module]]
    loaded_plan: Optional[ShardingPlan] = None
    constraints: Optional[Dict[str, ParameterConstraints]] = None

    def plan(self, model: nn.Module, planner_config: PlannerConfig,
             process_group: Optional[dist.ProcessGroup]) -> ShardingPlan:
        """The loaded plan, or the planner's (made on rank 0 and broadcast). Collective
        when planning on several ranks."""
        if self.loaded_plan is not None:
            return self.loaded_plan
        return build_sharding_plan(model, self.sharders, planner_config, process_group, self.constraints)


def prepare_sharding(config: TrainConfig, env: DistributedEnv, model: nn.Module) -> ShardingSetup:
    """Reads and checks ``--sharding_plan``, or checks the constraints for this device.

    Raises BadInput (one line) on a plan that does not match the model or the job,
    or constraints the device cannot meet.
    """
    device_type = env.device.type
    prefetch = config.pipeline == "prefetch"  # the kernels must lock prefetched cache lines
    if config.sharding_plan is not None:
        saved = read_plan(config.sharding_plan)
        check_plan_for_run(saved, config.sharding_plan, embedding_tables(model), env.world_size,
                           env.local_world_size, env.device)
        row_splits = device_type == "cpu" and any(
            ps.sharding_type in ROW_SHARDING_TYPES
            for module_plan in saved.plan.plan.values() for ps in module_plan.values()  # type: ignore[union-attr]
        )
        return ShardingSetup(sharders=build_sharders(row_splits, prefetch), loaded_plan=saved.plan)
    constraints = config.sharding_constraints
    tables = config.model.table_names
    constraints.validate(tables, device_type)
    return ShardingSetup(
        sharders=build_sharders(constraints.row_splits_on_cpu(tables, device_type), prefetch),
        constraints=constraints.parameter_constraints(tables, config.model.embedding_dim, env.world_size, device_type),
    )
