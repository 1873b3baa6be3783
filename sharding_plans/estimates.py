"""The planner's own estimates for a plan: memory and step time per rank.

torchrec's planner estimates, for every shard it places, the HBM and host memory
(DDR) the shard needs (weights, optimizer state, input/output buffers) and its time
per step (lookups, all-to-alls, backward). `PlanRecorder` keeps the chosen shards
so these estimates can be summed per rank. `FullPrecisionOptimizerState` corrects
torchrec's estimate of the fused optimizers' state for fp16 tables.
"""

import math
from dataclasses import replace
from typing import Any

import torch
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.types import (
    ParameterConstraints,
    SharderDataMap,
    ShardEstimator,
    ShardingOption,
    Stats,
    Topology,
)
from torchrec.optim import RowWiseAdagrad

from sharding_plans.types import RankEstimate

# FBGEMM keeps its fused optimizers' state in fp32 whatever the weights' precision
# (fbgemm_gpu 1.8, split_table_batched_embeddings_ops_training.py: momentum1 and
# momentum2 are float32 unless optimizer_state_dtypes is given, which only the
# partial row-wise Adam and ensemble row-wise Adagrad accept).
OPTIMIZER_STATE_BYTES_PER_ELEMENT = 4
# The fused kernels: their state is on the GPU for fused on CUDA, in host memory
# otherwise (fused_uvm; and fused_uvm_caching, whose state FBGEMM does not cache:
# construct_split_state(cacheable=False) places it in UVM). The data-parallel dense
# kernel's state is the dense optimizer's, at the weights' precision.
_FUSED_KERNELS = (
    EmbeddingComputeKernel.FUSED.value,
    EmbeddingComputeKernel.FUSED_UVM.value,
    EmbeddingComputeKernel.FUSED_UVM_CACHING.value,
)


class PlanRecorder(Stats):
    """A planner `Stats` hook that keeps the chosen sharding options (and prints nothing).

    Example::

        recorder = PlanRecorder()
        EmbeddingShardingPlanner(..., stats=[recorder]).plan(module, sharders)
        estimates = recorder.rank_estimates(world_size)
    """

    def __init__(self) -> None:
        self.best_plan: list[ShardingOption] | None = None

    def log(
        self,
        sharding_plan: Any,
        topology: Any,
        batch_size: int,
        storage_reservation: Any,
        num_proposals: int,
        num_plans: int,
        run_time: float,
        best_plan: list[ShardingOption],
        **kwargs: Any,
    ) -> None:
        # Also called with the last failed proposal (empty plan) just before the
        # planner raises: keep only real plans.
        if sharding_plan.plan:
            self.best_plan = best_plan

    def rank_estimates(self, world_size: int) -> list[RankEstimate]:
        """Sums the recorded shards' estimates per rank."""
        if self.best_plan is None:
            raise RuntimeError("no plan was recorded")
        ranks = [RankEstimate(rank=r, hbm_bytes=0, ddr_bytes=0, step_time_ms=0.0) for r in range(world_size)]
        for option in self.best_plan:
            for shard in option.shards:
                estimate = ranks[shard.rank]
                if shard.storage is not None:
                    estimate.hbm_bytes += int(shard.storage.hbm)
                    estimate.ddr_bytes += int(shard.storage.ddr)
                if shard.perf is not None:
                    estimate.step_time_ms += shard.perf.total
        return ranks


def _state_values_per_weight(optimizer: type | None, embedding_dim: int) -> float:
    """The fused optimizer's state values per weight, as torchrec counts them."""
    if optimizer is None or issubclass(optimizer, torch.optim.SGD):
        return 0.0
    if issubclass(optimizer, RowWiseAdagrad):
        return 1.0 / embedding_dim  # one value per row
    if issubclass(optimizer, torch.optim.Adam):
        return 2.0
    return 1.0  # Adagrad


class FullPrecisionOptimizerState(ShardEstimator):
    """Runs after torchrec's storage estimator and adds the optimizer state that it
    misses on tables narrower than fp32: torchrec sizes the state at the weights'
    precision (an fp16 table's Adagrad state as 2 bytes a value), FBGEMM allocates it
    in fp32 (measured on CPU: an fp16 Adagrad plan's estimate was 0.66x what the
    tables took before this; see docs/sharding_plans.md).

    Example::

        EmbeddingEnumerator(topology, batch_size, constraints,
                            estimator=[perf, EmbeddingStorageEstimator(topology, constraints),
                                       FullPrecisionOptimizerState(topology)])
    """

    def __init__(self, topology: Topology, constraints: dict[str, ParameterConstraints] | None = None) -> None:
        self._on_gpu = topology.compute_device == "cuda"

    def estimate(self, sharding_options: list[ShardingOption], sharder_data_map: SharderDataMap | None = None) -> None:
        for option in sharding_options:
            narrowing = OPTIMIZER_STATE_BYTES_PER_ELEMENT - option.tensor.element_size()
            if narrowing <= 0 or option.compute_kernel not in _FUSED_KERNELS:
                continue
            optimizer = getattr(option.tensor, "_optimizer_classes", [None])[0]
            per_weight = _state_values_per_weight(optimizer, option.tensor.shape[-1])
            in_hbm = self._on_gpu and option.compute_kernel == EmbeddingComputeKernel.FUSED.value
            for shard in option.shards:
                if shard.storage is None:
                    continue
                missing = math.ceil(per_weight * math.prod(shard.size) * narrowing)
                shard.storage = (
                    replace(shard.storage, hbm=shard.storage.hbm + missing)
                    if in_hbm
                    else replace(shard.storage, ddr=shard.storage.ddr + missing)
                )
