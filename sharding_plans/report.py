"""Readable summaries of a sharding plan: where each table lives, memory per rank."""

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence

from torchrec.distributed.types import EnumerableShardingSpec, ParameterSharding, ShardingPlan

from common.byte_sizes import GIB, format_bytes
from sharding_plans.types import RankEstimate, SavedPlan


def _natural_key(name: str) -> list[object]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def format_sharding_plan(
    plan: ShardingPlan,
    world_size: int,
    table_shapes: Mapping[str, tuple[int, int]] | None = None,
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
    lines: list[str] = [f"{'module':<40} {'table':<12} {'sharding':<18} {'kernel':<12} ranks: shards (rows x cols)"]
    per_rank: dict[int, int] = defaultdict(int)
    for module_path, module_plan in sorted(plan.plan.items()):
        for table, ps in sorted(module_plan.items(), key=lambda kv: _natural_key(kv[0])):
            shards = []
            spec = ps.sharding_spec
            if isinstance(spec, EnumerableShardingSpec):
                for shard in spec.shards:
                    rank = shard.placement.rank()
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
    lines.append(
        "embedding weights per rank: "
        + ", ".join(f"rank {r}: {format_bytes(per_rank.get(r, 0))}" for r in range(world_size))
    )
    return "\n".join(lines)


def plan_summary(plan: ShardingPlan) -> dict[str, dict[str, object]]:
    """{table: {"sharding_type", "compute_kernel", "shards": [[row, col, rows, cols, rank], ...]}}
    (data-parallel tables have no shards: every rank holds all of them). JSON-ready."""
    summary: dict[str, dict[str, object]] = {}
    for module_plan in plan.plan.values():
        for table, ps in module_plan.items():
            shards = []
            if isinstance(ps.sharding_spec, EnumerableShardingSpec):
                shards = [
                    [*shard.shard_offsets, *shard.shard_sizes, shard.placement.rank()]
                    for shard in ps.sharding_spec.shards
                ]
            summary[table] = {"sharding_type": ps.sharding_type, "compute_kernel": ps.compute_kernel, "shards": shards}
    return summary


def describe_ranks(ranks: Sequence[int]) -> str:
    """Ranks as runs: [0, 1, 2, 3, 6] -> "0-3, 6"."""
    runs: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "-"


def describe_shards(ps: ParameterSharding, world_size: int) -> str:
    """Shard shapes, identical ones counted: "8 x 5000000x128"; replicas for data parallel."""
    spec = ps.sharding_spec
    if not isinstance(spec, EnumerableShardingSpec):
        return f"{world_size} replicas"
    counts: dict[str, int] = {}
    for shard in spec.shards:
        shape = "x".join(str(n) for n in shard.shard_sizes)
        counts[shape] = counts.get(shape, 0) + 1
    return ", ".join(shape if n == 1 else f"{n} x {shape}" for shape, n in counts.items())


def _rank_of_each_shard(ps: ParameterSharding, world_size: int) -> list[int]:
    if isinstance(ps.sharding_spec, EnumerableShardingSpec):
        return [s.placement.rank() for s in ps.sharding_spec.shards]
    return list(ps.ranks) if ps.ranks else list(range(world_size))


def memory_imbalance(estimates: Sequence[RankEstimate]) -> float:
    """Largest rank's memory over the mean (1.0: perfectly even)."""
    totals = [e.total_bytes for e in estimates]
    mean = sum(totals) / len(totals)
    return max(totals) / mean if mean > 0 else 1.0


def largest_rank(estimates: Sequence[RankEstimate]) -> RankEstimate:
    """The rank with the most embedding memory (the lowest such rank on ties)."""
    return max(estimates, key=lambda e: (e.total_bytes, -e.rank))


# Why the planner puts a table on each kernel: it takes the cheapest placement by
# its cost model (lookup traffic, the bags' ids a sample, x bandwidth) that fits.
KERNEL_REASONS = {
    "fused": "whole in HBM (FBGEMM's fused kernel): the fastest placement, and it fits",
    "fused_uvm": "rows in host memory read through UVM: HBM could not hold them",
    "fused_uvm_caching": (
        "rows in host memory, the hot ones cached in HBM: the tables' weights and "
        "optimizer state do not all fit in the usable HBM"
    ),
    "dense": "data-parallel: a replica on every rank, updated by the dense optimizer",
}


def _cache_share(ps: ParameterSharding) -> str:
    factor = getattr(ps.cache_params, "load_factor", None) if ps.cache_params is not None else None
    return f" ({factor:.0%} of rows cached)" if factor else ""


def placement_reasons(saved: SavedPlan) -> list[str]:
    """One line per compute kernel the plan uses: its tables and why they are there
    (`KERNEL_REASONS`); a table on UVM caching also says what share of its rows the
    HBM cache holds. Where every table went and why, in a few lines.

    Example::

        placement_reasons(saved)  # ["fused (24 tables: t_cat_0, ...): whole in HBM ...", ...]
    """
    by_kernel: dict[str, list[str]] = defaultdict(list)
    for module_plan in saved.plan.plan.values():
        for table, ps in module_plan.items():
            by_kernel[ps.compute_kernel].append(table + _cache_share(ps))
    lines = []
    for kernel, tables in sorted(by_kernel.items()):
        tables.sort(key=_natural_key)
        shown = ", ".join(tables) if len(tables) <= 6 else ", ".join(tables[:3]) + f", ... {tables[-1]}"
        lines.append(
            f"{kernel} ({len(tables)} table{'s' if len(tables) > 1 else ''}: {shown}): "
            f"{KERNEL_REASONS.get(kernel, 'as the planner chose')}"
        )
    return lines


def format_plan_report(saved: SavedPlan, pooling_factors: Sequence[float] | None = None) -> str:
    """The plan as a readable table, then memory and step time per rank (the largest
    rank marked) and totals. ``pooling_factors``: the ids a sample of each table (in
    model order) the planner was told, shown beside each table.

    Example::

        print(format_plan_report(read_plan("plan.json")))
    """
    topo = saved.topology
    usable = topo.usable_fraction
    total_weights = sum(t.num_bytes for t in saved.tables.values())
    lines = [
        f"topology: {topo.world_size} {topo.compute_device} ranks, {topo.local_world_size} per host; "
        + (f"{format_bytes(topo.hbm_cap_bytes)} HBM + " if topo.hbm_cap_bytes else "")
        + f"{format_bytes(topo.ddr_cap_bytes or 0)} DDR per rank, {usable:.0%} of it for embeddings; "
        f"batch {topo.batch_size} per rank",
        f"model: {len(saved.tables)} tables, {total_weights / GIB:.2f} GiB of embedding weights",
        "",
        f"{'table':<12} {'rows':>13} {'dim':>5} {'ids':>4}  {'sharding':<17} {'kernel':<17} {'ranks':<12} "
        "shards (rows x cols)",
    ]
    model_order = {name: i for i, name in enumerate(saved.tables)}
    for module_plan in saved.plan.plan.values():
        for table, ps in sorted(module_plan.items(), key=lambda kv: model_order[kv[0]]):
            spec = saved.tables[table]
            ids = f"{pooling_factors[model_order[table]]:g}" if pooling_factors is not None else "1"
            lines.append(
                f"{table:<12} {spec.rows:>13,} {spec.dim:>5} {ids:>4}  {ps.sharding_type:<17} {ps.compute_kernel:<17} "
                f"{describe_ranks(_rank_of_each_shard(ps, topo.world_size)):<12} {describe_shards(ps, topo.world_size)}"
            )
    ids_total = sum(pooling_factors) if pooling_factors is not None else len(saved.tables)
    lines += ["", f"ids: each table's ids a sample, as the planner was told ({ids_total:g} a sample in all)"]
    lines += ["why: " + line for line in placement_reasons(saved)]
    if not saved.estimates:
        lines += ["", "no planner estimates in this plan (it was not made by the planner here)"]
        return "\n".join(lines)
    top = largest_rank(saved.estimates)
    lines += ["", f"{'rank':>5} {'HBM':>12} {'DDR':>12} {'step (ms)':>10}"]
    for e in saved.estimates:
        mark = "  <- largest" if e.rank == top.rank else ""
        lines.append(
            f"{e.rank:>5} {format_bytes(e.hbm_bytes):>12} {format_bytes(e.ddr_bytes):>12} {e.step_time_ms:>10.3f}{mark}"
        )
    capacity = (topo.hbm_cap_bytes if topo.compute_device == "cuda" else topo.ddr_cap_bytes) or 0
    in_hbm = topo.compute_device == "cuda"
    held = top.hbm_bytes if in_hbm else top.ddr_bytes
    slowest = max(e.step_time_ms for e in saved.estimates)
    lines += [
        "",
        f"largest rank: {top.rank} with {format_bytes(held)} of {format_bytes(int(capacity * usable))} usable "
        f"{'HBM' if in_hbm else 'memory'} ({held / (capacity * usable):.0%})"
        + (f" and {format_bytes(top.ddr_bytes)} in host memory (UVM)" if in_hbm and top.ddr_bytes else ""),
        f"all ranks: {format_bytes(sum(e.total_bytes for e in saved.estimates))} "
        f"(weights, optimizer state and buffers, as the planner estimates them); "
        f"memory imbalance (largest / mean) {memory_imbalance(saved.estimates):.2f}",
        f"estimated embedding time per step: {slowest:.3f} ms (slowest rank; lookups and all-to-alls, "
        "the dense part excluded)",
    ]
    return "\n".join(lines)
