"""Readable summaries of a sharding plan: where each table lives, memory per rank."""

from collections import defaultdict
from typing import Dict, List

from torchrec.distributed.types import EnumerableShardingSpec, ShardingPlan

_GIB = 1024**3


def format_sharding_plan(plan: ShardingPlan, world_size: int, bytes_per_element: int = 4) -> str:
    """One line per table (sharding type, kernel, ranks, shard shapes), then the
    embedding weight bytes per rank (weights only: optimizer state comes on top).

    Example::

        print(format_sharding_plan(plan, world_size=2))
    """
    lines: List[str] = [
        f"{'module':<40} {'table':<12} {'sharding':<18} {'kernel':<12} ranks: shards (rows x cols)"
    ]
    per_rank: Dict[int, int] = defaultdict(int)
    for module_path, module_plan in sorted(plan.plan.items()):
        for table, ps in sorted(module_plan.items()):  # type: ignore[union-attr]
            shards = []
            spec = ps.sharding_spec
            if isinstance(spec, EnumerableShardingSpec):
                for shard in spec.shards:
                    rank = shard.placement.rank()  # type: ignore[union-attr]
                    rows, cols = shard.shard_sizes
                    per_rank[rank] += rows * cols * bytes_per_element
                    shards.append(f"{rank}: {rows}x{cols}")
            else:  # data parallel: a full replica on every rank
                shards.append("all ranks: replicated")
            lines.append(
                f"{module_path or '<root>':<40} {table:<12} {ps.sharding_type:<18} "
                f"{ps.compute_kernel:<12} {', '.join(shards)}"
            )
    lines.append("embedding weights per rank: " + ", ".join(
        f"rank {r}: {per_rank.get(r, 0) / _GIB:.3f} GiB" for r in range(world_size)
    ))
    return "\n".join(lines)
