"""A PNG chart of a plan's memory per rank (matplotlib, no display needed)."""

from common.errors import BadInput
from common.png_figure import png_figure
from sharding_plans.plan_file import SavedPlan
from sharding_plans.report import largest_rank

_GIB = 1024**3


def write_memory_chart(saved: SavedPlan, path: str, title: str = "") -> None:
    """Bars of each rank's estimated embedding memory (GPU and host memory stacked),
    the largest rank in another colour, and a line at the memory the planner may use.

    Written under a temporary name and renamed when complete.

    Raises BadInput when the plan has no estimates.

    Example::

        write_memory_chart(read_plan("plan.json"), "memory.png")
    """
    if not saved.estimates:
        raise BadInput("the plan has no per-rank estimates to chart (it was not made by the planner here)")
    topo = saved.topology
    estimates = saved.estimates
    ranks = [e.rank for e in estimates]
    top = largest_rank(estimates).rank
    on_gpu = topo.compute_device == "cuda"
    device_gib = [(e.hbm_bytes if on_gpu else e.ddr_bytes) / _GIB for e in estimates]
    host_gib = [e.ddr_bytes / _GIB if on_gpu else 0.0 for e in estimates]
    capacity = (topo.hbm_cap_bytes if on_gpu else topo.ddr_cap_bytes) or 0

    figsize = (max(6.0, min(16.0, 0.2 * len(ranks) + 4)), 4.5)
    with png_figure(path, figsize=figsize, dpi=100) as (_, ax):
        colors = ["tab:red" if r == top else "tab:blue" for r in ranks]
        ax.bar(ranks, device_gib, color=colors, label="GPU memory (HBM)" if on_gpu else "host memory")
        if any(host_gib):
            ax.bar(ranks, host_gib, bottom=device_gib, color="tab:gray", label="host memory (UVM)")
        ax.axhline(capacity * topo.usable_fraction / _GIB, color="black", linestyle="--",
                   label=f"usable per rank ({topo.usable_fraction:.0%} of {capacity / _GIB:.0f} GiB)")
        ax.set_xlabel("rank")
        ax.set_ylabel("estimated embedding memory (GiB)")
        tallest = max(d + h for d, h in zip(device_gib, host_gib))
        ax.set_ylim(0, 1.3 * max(tallest, capacity * topo.usable_fraction / _GIB))  # room for the legend
        ax.set_title(title or f"{topo.world_size} {topo.compute_device} ranks: memory per rank "
                     f"(largest: rank {top}, in red)")
        ax.legend(loc="upper right", fontsize="small")
