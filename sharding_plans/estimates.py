"""The planner's own estimates for a plan: memory and step time per rank.

torchrec's planner estimates, for every shard it places, the HBM and host memory
(DDR) the shard needs (weights, optimizer state, input/output buffers) and its time
per step (lookups, all-to-alls, backward). `PlanRecorder` keeps the chosen shards
so these estimates can be summed per rank.
"""

from dataclasses import dataclass
from typing import Any, List, Optional

from torchrec.distributed.planner.types import ShardingOption, Stats


@dataclass
class RankEstimate:
    """One rank's share of a plan, as the planner estimates it.

    Args:
        rank: the rank.
        hbm_bytes: GPU memory of its embedding shards (0 on CPU).
        ddr_bytes: host memory of its embedding shards (all of it on CPU; UVM on CUDA).
        step_time_ms: its embedding work per training step, in milliseconds.

    Example::

        RankEstimate(rank=0, hbm_bytes=2**30, ddr_bytes=0, step_time_ms=1.25)
    """

    rank: int
    hbm_bytes: int
    ddr_bytes: int
    step_time_ms: float

    @property
    def total_bytes(self) -> int:
        return self.hbm_bytes + self.ddr_bytes


class PlanRecorder(Stats):
    """A planner `Stats` hook that keeps the chosen sharding options (and prints nothing).

    Example::

        recorder = PlanRecorder()
        EmbeddingShardingPlanner(..., stats=[recorder]).plan(module, sharders)
        estimates = recorder.rank_estimates(world_size)
    """

    def __init__(self) -> None:
        self.best_plan: Optional[List[ShardingOption]] = None

    def log(self, sharding_plan: Any, topology: Any, batch_size: int, storage_reservation: Any,
            num_proposals: int, num_plans: int, run_time: float, best_plan: List[ShardingOption],
            **kwargs: Any) -> None:
        # Also called with the last failed proposal (empty plan) just before the
        # planner raises: keep only real plans.
        if sharding_plan.plan:
            self.best_plan = best_plan

    def rank_estimates(self, world_size: int) -> List[RankEstimate]:
        """Sums the recorded shards' estimates per rank."""
        if self.best_plan is None:
            raise RuntimeError("no plan was recorded")
        ranks = [RankEstimate(rank=r, hbm_bytes=0, ddr_bytes=0, step_time_ms=0.0) for r in range(world_size)]
        for option in self.best_plan:
            for shard in option.shards:
                estimate = ranks[shard.rank]  # type: ignore[index]
                if shard.storage is not None:
                    estimate.hbm_bytes += int(shard.storage.hbm)
                    estimate.ddr_bytes += int(shard.storage.ddr)
                if shard.perf is not None:
                    estimate.step_time_ms += shard.perf.total
        return ranks
