"""sharding_plans/zch.py: the planner plans managed-collision tables on CPU with the zch
sharder (row-wise, fused), as `zch_plan` builds by hand; torchrec's own sharder cannot."""

import pytest
import torch
from torchrec.distributed.mc_embeddingbag import ManagedCollisionEmbeddingBagCollectionSharder
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from models.zch import ZchOptions, build_zch_collection
from sharding_plans.planner import build_sharding_plan
from sharding_plans.types import PlannerConfig
from sharding_plans.zch import zch_plan, zch_sharder


def _collection():
    configs = [EmbeddingBagConfig(name=f"t_{f}", embedding_dim=8, num_embeddings=1000, feature_names=[f]) for f in "ab"]
    return build_zch_collection(configs, ZchOptions(), torch.device("meta"))


def _layout(plan):
    return {
        (path, table): (
            p.sharding_type,
            p.compute_kernel,
            tuple(p.ranks),
            str([s.shard_sizes for s in p.sharding_spec.shards]),
        )
        for path, module_plan in plan.plan.items()
        for table, p in module_plan.items()
    }


def test_the_planner_shards_zch_tables_row_wise_on_cpu_as_the_hand_built_plan():
    collection = _collection()
    config = PlannerConfig(world_size=2, local_world_size=2, compute_device="cpu", batch_size=64)
    planned, _ = build_sharding_plan(collection, [zch_sharder()], config)
    layout = _layout(planned)
    assert {v[:3] for v in layout.values()} == {("row_wise", "fused", (0, 1))}
    assert layout == _layout(zch_plan(collection, 2, 2, torch.device("cpu")))


def test_torchrec_s_own_sharder_cannot_plan_them_on_cpu():
    config = PlannerConfig(world_size=2, local_world_size=2, compute_device="cpu", batch_size=64)
    with pytest.raises(Exception, match="No available sharding type and compute kernel combination"):
        build_sharding_plan(_collection(), [ManagedCollisionEmbeddingBagCollectionSharder()], config)
