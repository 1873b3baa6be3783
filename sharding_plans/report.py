"""Readable summaries of a sharding plan: where each table lives, memory per rank."""

import re
from collections import defaultdict
from typing import Dict, List, Mapping, Optional, Tuple

from torchrec.distributed.types import EnumerableShardingSpec, ShardingPlan

_GIB = 1024**3
_MIB = 1024**2


def format_bytes(n: int) -> str:
    """GiB from 1 GiB up, else MiB."""
    return f"{n / _GIB:.2f} GiB" if n >= _GIB else f"{n / _MIB:.2f} MiB"


def _natural_key(name: str) -> List[object]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def format_sharding_plan(
    plan: ShardingPlan,
    world_size: int,
    table_shapes: Optional[Mapping[str, Tuple[int, int]]] = None,
    bytes_per_element: int = 4,
) -> str:
    """One line per table (sharding type, kernel, ranks, shard shapes), then the
    embedding weight memory per rank (weights only: optimizer state comes on top).

    Args:
        plan: the plan.
        world_size: ranks.
        table_shapes: {table: (rows, dim)}, to count replicated (data-parallel)
            tables on every rank.
        bytes_per_element: 4 for fp32 tables.

    Example::

        print(format_sharding_plan(plan, world_size=2))
    """
    lines: List[str] = [
        f"{'module':<40} {'table':<12} {'sharding':<18} {'kernel':<12} ranks: shards (rows x cols)"
    ]
    per_rank: Dict[int, int] = defaultdict(int)
    for module_path, module_plan in sorted(plan.plan.items()):
        for table, ps in sorted(module_plan.items(), key=lambda kv: _natural_key(kv[0])):  # type: ignore[union-attr]
            shards = []
            spec = ps.sharding_spec
            if isinstance(spec, EnumerableShardingSpec):
                for shard in spec.shards:
                    rank = shard.placement.rank()  # type: ignore[union-attr]
                    rows, cols = shard.shard_sizes
                    per_rank[rank] += rows * cols * bytes_per_element
                    shards.append(f"{rank}: {rows}x{cols}")
            else:  # data parallel: a full replica on every rank
                shards.append("every rank: full replica")
                if table_shapes and table in table_shapes:
                    rows, cols = table_shapes[table]
                    for rank in range(world_size):
                        per_rank[rank] += rows * cols * bytes_per_element
            lines.append(
                f"{module_path or '<root>':<40} {table:<12} {ps.sharding_type:<18} "
                f"{ps.compute_kernel:<12} {', '.join(shards)}"
            )
    lines.append("embedding weights per rank: " + ", ".join(
        f"rank {r}: {format_bytes(per_rank.get(r, 0))}" for r in range(world_size)
    ))
    return "\n".join(lines)


def plan_summary(plan: ShardingPlan) -> Dict[str, Dict[str, object]]:
    """{table: {"sharding_type", "compute_kernel", "shards": [[row, col, rows, cols, rank], ...]}}
    (data-parallel tables have no shards: every rank holds all of them). JSON-ready."""
    summary: Dict[str, Dict[str, object]] = {}
    for module_plan in plan.plan.values():
        for table, ps in module_plan.items():  # type: ignore[union-attr]
            shards = []
            if isinstance(ps.sharding_spec, EnumerableShardingSpec):
                shards = [[*shard.shard_offsets, *shard.shard_sizes, shard.placement.rank()]  # type: ignore[union-attr]
                          for shard in ps.sharding_spec.shards]
            summary[table] = {"sharding_type": ps.sharding_type, "compute_kernel": ps.compute_kernel,
                              "shards": shards}
    return summary
