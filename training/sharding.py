"""The run's sharding setup from its config (the rules live in `sharding_plans.setup`)."""

from torch import nn

from sharding_plans.setup import ShardingSetup
from sharding_plans.setup import prepare_sharding as prepare
from sharding_plans.types import PlanSummary
from training.config import TrainConfig
from training.distributed import DistributedEnv


def prepare_sharding(
    config: TrainConfig, env: DistributedEnv, model: nn.Module, resumed_plan: PlanSummary | None = None
) -> ShardingSetup:
    """`sharding_plans.setup.prepare_sharding` for this config and job.

    Example::

        setup = prepare_sharding(config, env, model)   # before the process group
    """
    setup = prepare(
        model,
        config.model.table_names,
        config.model.embedding_dim,
        config.model.embedding_precision,
        env.device,
        env.world_size,
        env.local_world_size,
        plan_path=config.sharding_plan,
        constraints=config.sharding_constraints,
        prefetch_pipeline=config.pipeline == "prefetch",
        resumed_plan=resumed_plan,
        pooling_factors=config.data.multi_hot_sizes,
    )
    if config.model.zch_eviction_policy is not None:  # --id_hashing zch: planner and DistributedModelParallel alike
        from sharding_plans.zch import zch_sharder

        zch = zch_sharder()  # in place of torchrec's (one sharder per module type)
        setup.sharders = [*(s for s in setup.sharders if s.module_type is not zch.module_type), zch]
    return setup
