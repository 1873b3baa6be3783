"""The CPU sequence lookup through FBGEMM's pooled kernels (sharding_plans/sequence_lookup.py)
against FBGEMM's unpooled kernel itself: the same rows, the same updated weights and
optimizer state, for every layout of features over tables it handles."""

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
from torchrec.distributed.types import ShardingEnv, ShardingPlan
from torchrec.modules.embedding_configs import EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from sharding_plans.sequence_lookup import BagsForSequenceLookup, lookup_as_bags
from sharding_plans.sharders import build_sharders

ROWS, DIM, BATCH = 300, 8, 6

# name: (feature -> table, lengths of each feature's rows)
LAYOUTS = {
    "one feature": ([0], [[3, 0, 5, 1, 2, 4]]),
    "an item and its history in one table": ([0, 0], [[1] * BATCH, [5, 0, 3, 5, 1, 2]]),
    "two items, one history each": ([0, 0, 1, 1], [[1] * BATCH, [2, 4, 0, 1, 5, 3], [1] * BATCH, [0] * BATCH]),
    "a feature without ids": ([0, 0], [[0] * BATCH, [2, 1, 0, 3, 1, 1]]),
    "no ids": ([0, 0], [[0] * BATCH, [0] * BATCH]),
}


def _kernel(
    feature_table_map: list[int], optimizer: EmbOptimType, precision: SparseType = SparseType.FP32
) -> SplitTableBatchedEmbeddingBagsCodegen:
    tables = max(feature_table_map) + 1
    torch.manual_seed(0)
    return SplitTableBatchedEmbeddingBagsCodegen(
        [(ROWS, DIM, EmbeddingLocation.HOST, ComputeDevice.CPU)] * tables,
        feature_table_map=feature_table_map,
        optimizer=optimizer,
        learning_rate=0.1,
        pooling_mode=PoolingMode.NONE,
        weights_precision=precision,
    )


@pytest.mark.parametrize(
    "optimizer, precision",
    [
        (EmbOptimType.EXACT_SGD, SparseType.FP32),
        (EmbOptimType.EXACT_ROWWISE_ADAGRAD, SparseType.FP32),
        (EmbOptimType.EXACT_SGD, SparseType.FP16),
    ],
)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bags_equal_the_unpooled_kernel(layout, optimizer, precision):
    """Two steps, duplicate ids included: outputs, weights and optimizer state equal to
    float rounding (row-wise Adagrad sums a row's squares in another order)."""
    feature_table_map, lengths = LAYOUTS[layout]
    unpooled, bags = _kernel(feature_table_map, optimizer, precision), _kernel(feature_table_map, optimizer, precision)
    assert torch.equal(unpooled.weights_host, bags.weights_host)
    generator = torch.Generator().manual_seed(1)
    for _ in range(2):
        counts = torch.tensor([n for feature in lengths for n in feature])
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
        indices = torch.randint(0, 20, (int(offsets[-1]),), generator=generator)  # 20 rows: ids repeat
        grad = torch.randn(indices.numel(), DIM, generator=generator)
        expected, got = unpooled(indices=indices, offsets=offsets), lookup_as_bags(bags, indices, offsets)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
        expected.backward(grad)
        got.backward(grad)
        torch.testing.assert_close(bags.weights_host, unpooled.weights_host, rtol=1e-6, atol=1e-7)
        for mine, theirs in zip(bags.split_optimizer_states(), unpooled.split_optimizer_states()):
            torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7)
    assert bags.pooling_mode == PoolingMode.NONE and bags.is_nobag  # switched back after each call


@pytest.fixture
def one_rank():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_the_sharded_collection_looks_up_through_bags(one_rank):
    """The project's sharder swaps the fused CPU kernel, and the sharded collection
    returns each id's row of its table."""
    collection = EmbeddingCollection(
        tables=[EmbeddingConfig(name="t", embedding_dim=DIM, num_embeddings=ROWS, feature_names=["item", "hist"])],
        device=torch.device("meta"),
    )
    plan = construct_module_sharding_plan(
        collection, {"t": table_wise(rank=0, compute_kernel="fused")}, world_size=1, device_type="cpu"
    )
    sharded = DistributedModelParallel(
        collection,
        device=torch.device("cpu"),
        env=ShardingEnv.from_process_group(one_rank),
        plan=ShardingPlan({"": plan}),
        sharders=build_sharders(),
    )
    kernels = [k for lookup in sharded.module._lookups for k in lookup.modules()]
    assert any(type(k) is BagsForSequenceLookup for k in kernels)
    features = KeyedJaggedTensor(
        keys=["item", "hist"],
        values=torch.tensor([4, 7, 9, 4, 4, 250, 1]),
        lengths=torch.tensor([1, 1, 3, 2], dtype=torch.int32),  # a batch of 2: items, then histories
    )
    out = sharded(features).wait()
    weight = sharded.state_dict()["embeddings.t.weight"].local_shards()[0].tensor
    assert torch.equal(out["item"].values(), weight[[4, 7]])
    assert torch.equal(out["hist"].values(), weight[[9, 4, 4, 250, 1]])
