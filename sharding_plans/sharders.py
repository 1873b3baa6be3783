"""The sharders handed to the planner and to DistributedModelParallel.

torchrec's EmbeddingBagCollection sharder offers row_wise and table_row_wise only on
CUDA, although the CPU kernels run them (measured here: a row-wise plan trains on CPU
and matches an unsharded run). The sharder below offers them on CPU as well; it is
used only when a constraint asks for a row split on CPU, so default plans are
unchanged.
"""

import torch
from torch import nn
from torchrec.distributed.embedding import EmbeddingCollectionSharder, ShardedEmbeddingCollection
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import get_default_sharders
from torchrec.distributed.types import ModuleSharder, ParameterSharding, ShardingEnv, ShardingType
from torchrec.modules.embedding_modules import EmbeddingCollection

from sharding_plans.constraints import ROW_SHARDING_TYPES
from sharding_plans.sequence_lookup import use_bags_for_sequences


class RowSplitsOnCpuSharder(EmbeddingBagCollectionSharder):
    """An EmbeddingBagCollection sharder that also offers row splits on CPU.

    Example::

        sharders = [RowSplitsOnCpuSharder()]
    """

    def sharding_types(self, compute_device_type: str) -> list[str]:
        types = super().sharding_types(compute_device_type)
        if compute_device_type == "cpu":
            types += [t for t in ROW_SHARDING_TYPES if t not in types]
        return types


class ShardedOnlyEmbeddingCollectionSharder(EmbeddingCollectionSharder):
    """torchrec's EmbeddingCollection sharder without data_parallel: torchrec 1.8's
    data-parallel sequence lookup (the dense kernel) returns fewer rows than a table
    shared by an item and its history looks up, and the output split fails on the first
    step (measured on CPU/gloo, 2 ranks; table_wise, row_wise and column_wise train and
    match one process). The item tables of a model with histories are small beside
    their lookups anyway (models/sequence_arch.py).

    On CPU its fused kernels look the ids up as one-id bags, through FBGEMM's pooled
    kernels: the same rows and updates at a tenth of the unpooled backward's cost
    (sharding_plans/sequence_lookup.py)."""

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return [t for t in super().sharding_types(compute_device_type) if t != ShardingType.DATA_PARALLEL.value]

    def shard(
        self,
        module: EmbeddingCollection,
        params: dict[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device | None = None,
        module_fqn: str | None = None,
    ) -> ShardedEmbeddingCollection:
        sharded = super().shard(module, params, env, device, module_fqn)
        use_bags_for_sequences(sharded)
        return sharded


def build_sharders(row_splits_on_cpu: bool = False, prefetch_pipeline: bool = False) -> list[ModuleSharder[nn.Module]]:
    """torchrec's default sharders, with the EmbeddingBagCollection one replaced by
    `RowSplitsOnCpuSharder` when ``row_splits_on_cpu``, and given the fused parameter
    ``prefetch_pipeline=True`` when ``prefetch_pipeline``.

    A pipeline that prefetches batch i+1 into FBGEMM's UVM cache (`fused_uvm_caching`)
    between the forward and the backward of batch i needs cache-line locking, or the
    prefetch can evict or stale rows that backward(i) updates (wrong results; torchrec
    only warns). ``prefetch_pipeline`` turns the locking on. The planner must be given
    the same sharders as DistributedModelParallel: it reads the flag too (its
    estimates of a prefetched cache differ).

    Example::

        sharders = build_sharders(constraints.row_splits_on_cpu(tables, "cpu"))
        sharders = build_sharders(prefetch_pipeline=config.pipeline == "prefetch")
    """
    sharders: list[ModuleSharder[nn.Module]] = [
        ShardedOnlyEmbeddingCollectionSharder() if type(s) is EmbeddingCollectionSharder else s
        for s in get_default_sharders()
    ]
    if not row_splits_on_cpu and not prefetch_pipeline:
        return sharders
    cls = RowSplitsOnCpuSharder if row_splits_on_cpu else EmbeddingBagCollectionSharder
    fused_params = {"prefetch_pipeline": True} if prefetch_pipeline else None
    return [cls(fused_params=fused_params) if type(s) is EmbeddingBagCollectionSharder else s for s in sharders]
