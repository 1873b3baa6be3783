"""The plan of a managed-collision bag collection (``--id_hashing zch``, models/zch.py).

torchrec 1.8's planner cannot plan one on CPU (models/zch.py says why), but a plan built
by hand, every table row-wise with the fused kernel, shards and trains on CPU with gloo:
this module builds that plan. Row-wise is the only layout the managed-collision sharder
takes, on every device.
"""

import torch
from torch import nn
from torchrec.distributed.types import ModuleSharder, ShardingPlan


def zch_sharder() -> ModuleSharder[nn.Module]:
    """The sharder of `models.zch.build_zch_collection`'s module."""
    from torchrec.distributed.mc_embeddingbag import ManagedCollisionEmbeddingBagCollectionSharder

    return ManagedCollisionEmbeddingBagCollectionSharder()


def zch_plan(model: nn.Module, world_size: int, local_world_size: int, device: torch.device) -> ShardingPlan:
    """Every managed-collision bag collection of ``model`` (found by type), each table
    row-wise over ``world_size`` ranks with the fused kernel."""
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
    from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection

    sharder = zch_sharder()
    plans = {}
    for path, module in model.named_modules():
        if isinstance(module, ManagedCollisionEmbeddingBagCollection):
            tables = [c.name for c in module._embedding_module.embedding_bag_configs()]
            plans[path] = construct_module_sharding_plan(
                module,
                per_param_sharding={t: row_wise(compute_kernel="fused") for t in tables},
                local_size=local_world_size,
                world_size=world_size,
                device_type=device.type,
                sharder=sharder,
            )
    if not plans:
        raise ValueError("the model has no managed-collision bag collection to plan (--id_hashing zch)")
    return ShardingPlan(plans)
