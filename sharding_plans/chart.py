"""A PNG chart of a plan's memory per rank (matplotlib, no display needed)."""

from collections.abc import Sequence
from typing import Any

from common.byte_sizes import GIB
from common.errors import BadInput
from common.png_figure import png_figure
from sharding_plans.report import largest_rank
from sharding_plans.types import SavedPlan


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
    with png_figure(path, figsize=_figsize(len(saved.estimates)), dpi=100) as (_, ax):
        draw_memory(ax, saved, title)


# A bar shorter than this fraction of the axis is a line at most: the axis turns logarithmic.
MIN_VISIBLE_FRACTION = 0.02
# Ranks up to this many get their memory written above their bar.
MAX_VALUE_LABELS = 16
# Up to this many ranks, every rank has its tick (the largest's label in red).
MAX_RANK_TICKS = 32
LARGEST_COLOR, OTHER_COLOR, HOST_COLOR = "tab:red", "tab:blue", "tab:gray"


def _figsize(ranks: int) -> tuple:
    return (max(6.0, min(16.0, 0.2 * ranks + 4)), 4.5)


def log_memory_axis(totals: Sequence[float], limit: float) -> bool:
    """Whether the memory axis is logarithmic: when a rank's bar would be shorter than
    `MIN_VISIBLE_FRACTION` of the tallest thing drawn (bar or usable-memory line)."""
    positive = [t for t in totals if t > 0]
    top = max(list(totals) + [limit])
    return bool(positive) and min(positive) < MIN_VISIBLE_FRACTION * top


def draw_memory(ax: Any, saved: SavedPlan, title: str = "") -> None:
    """`write_memory_chart`'s drawing on one matplotlib axes: integer rank ticks, the
    largest rank's bar, outline and tick label (up to `MAX_RANK_TICKS` ranks) in red,
    each bar's GiB above it for up to `MAX_VALUE_LABELS` ranks, and a log axis when a
    bar would be too short to see."""
    from matplotlib.ticker import MaxNLocator

    topo = saved.topology
    estimates = saved.estimates
    ranks = [e.rank for e in estimates]
    top = largest_rank(estimates).rank
    on_gpu = topo.compute_device == "cuda"
    device_gib = [(e.hbm_bytes if on_gpu else e.ddr_bytes) / GIB for e in estimates]
    host_gib = [e.ddr_bytes / GIB if on_gpu else 0.0 for e in estimates]
    totals = [d + h for d, h in zip(device_gib, host_gib)]
    capacity = (topo.hbm_cap_bytes if on_gpu else topo.ddr_cap_bytes) or 0
    usable_gib = capacity * topo.usable_fraction / GIB
    device_name = "GPU memory (HBM)" if on_gpu else "host memory"
    others = [i for i, r in enumerate(ranks) if r != top]
    mine = ranks.index(top)
    ax.bar([ranks[i] for i in others], [device_gib[i] for i in others], color=OTHER_COLOR, label=device_name)
    ax.bar([top], [device_gib[mine]], color=LARGEST_COLOR, label=f"{device_name}, largest rank ({top})")
    if any(host_gib):
        ax.bar(ranks, host_gib, bottom=device_gib, color=HOST_COLOR, label="host memory (UVM)")
    # The largest rank's whole bar outlined in red, so it shows even when UVM covers most of it.
    ax.bar([top], [totals[mine]], fill=False, edgecolor=LARGEST_COLOR, linewidth=2)
    ax.axhline(
        usable_gib,
        color="black",
        linestyle="--",
        label=f"usable per rank ({topo.usable_fraction:.0%} of {capacity / GIB:.0f} GiB)",
    )
    tallest = max(totals + [usable_gib])
    if log_memory_axis(totals, usable_gib):
        ax.set_yscale("log")
        ax.set_ylim(min(t for t in totals if t > 0) / 3, tallest * 10)  # a decade of room for the legend
        ax.set_ylabel("estimated embedding memory (GiB, log scale)")
    else:
        ax.set_ylim(0, 1.3 * tallest)  # room for the legend
        ax.set_ylabel("estimated embedding memory (GiB)")
    if len(ranks) <= MAX_VALUE_LABELS:
        for rank, total in zip(ranks, totals):
            # An empty rank's label sits on the axis (a log axis has no 0).
            ax.annotate(
                f"{total:.3g}",
                (rank, max(total, ax.get_ylim()[0])),
                textcoords="offset points",
                xytext=(0, 2),
                ha="center",
                va="bottom",
                fontsize="x-small",
            )
    if len(ranks) <= MAX_RANK_TICKS:
        ax.set_xticks(ranks)
        ax.get_xticklabels()[mine].set_color(LARGEST_COLOR)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("rank")
    ax.set_title(
        title or f"{topo.world_size} {topo.compute_device} ranks: memory per rank (largest: rank {top}, in red)"
    )
    ax.legend(loc="upper right", fontsize="small")
