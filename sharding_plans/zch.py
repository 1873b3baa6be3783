"""The sharding of a managed-collision bag collection (``--id_hashing zch``, models/zch.py).

Row-wise is the only layout torchrec's managed-collision sharder takes, on every device.
With torchrec 1.8's own sharders the planner cannot plan one on CPU (models/zch.py says
why); `zch_sharder` makes it plannable there: its bag sharder offers row splits on CPU
(`sharding_plans.sharders.RowSplitsOnCpuSharder`) and it offers only the fused kernel on
CPU (torchrec's lists the UVM kernels on every device, which the planner's estimator
refuses on CPU: "Unrecognized or unsupported compute kernel: fused_uvm"). The modules
need a number of buckets that the world size divides (`models.zch.ZCH_BUCKETS`).
`zch_plan` builds the same plan by hand, without the planner.
"""

import torch
from torch import nn
from torchrec.distributed.types import ModuleSharder, ShardingPlan


def zch_sharder() -> ModuleSharder[nn.Module]:
    """The sharder of `models.zch.build_zch_collection`'s module, plannable on CPU."""
    from torchrec.distributed.mc_embeddingbag import ManagedCollisionEmbeddingBagCollectionSharder

    from sharding_plans.sharders import RowSplitsOnCpuSharder

    class ZchSharder(ManagedCollisionEmbeddingBagCollectionSharder):
        def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
            if compute_device_type == "cpu":
                return ["fused"]  # the only kernel FBGEMM runs on CPU for these tables
            return super().compute_kernels(sharding_type, compute_device_type)

    return ZchSharder(ebc_sharder=RowSplitsOnCpuSharder())


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
