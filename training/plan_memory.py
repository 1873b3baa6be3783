"""The planner's memory estimate beside what the tables really took, for every run.

A plan whose estimate is wrong is how a run first runs out of GPU memory, so each
run measures, on every rank, what the sharded tables took and logs it beside the
plan's estimate for that rank (weights, optimizer state and input/output buffers):

- built: from just before DistributedModelParallel is built to just after the
  optimizers are (the tables, written by the seeded init, and FBGEMM's optimizer
  state, which it allocates with the tables); the estimate is compared with this.
- first step: from the same start to the end of the first training step, which adds
  the lookups' buffers and the dense part's activations, gradients and optimizer
  state (what the planner's storage reservation keeps room for).

CPU measures the process's resident memory (RSS): its growth (built) and its peak
through the first step (the kernel's ``VmHWM``, started again from the RSS at the
start), less the RSS at the start, compared with the planner's DDR estimate (on CPU
everything is DDR). The RSS now after the first step can be below the start (the
allocator returns freed pages): a peak cannot, so the figure is never negative. CUDA
measures ``torch.cuda.memory_allocated`` (built) and ``max_memory_allocated`` (first
step: the peak), less what was allocated at the start, compared with the HBM estimate
(UVM tables live in host memory, which the allocator does not count).

The JSON-lines log gets one ``{"event": "plan_memory", ...}`` record (`PlanMemory`),
and rank 0 prints ``plan memory per rank: estimated 641.47 MiB, built 644.60 MiB
(0.99x), 685.01 MiB after the first step on rank 0; ...``.
"""

import gc
from dataclasses import dataclass

import torch

from common.byte_sizes import format_bytes
from sharding_plans.types import RankEstimate
from training.distributed import (
    DistributedEnv,
    gather_per_rank,
    peak_resident_bytes,
    resident_bytes,
    restart_peak_resident,
)


@dataclass
class PlanMemory:
    """The ``plan_memory`` record: every rank's embedding memory, estimated and measured.

    Args:
        estimated_bytes: per rank, the plan's estimate of the memory it measures (CPU:
            DDR, CUDA: HBM): weights, optimizer state and input/output buffers. None for
            a plan file written without estimates.
        built_bytes: per rank, what building the tables and optimizers took.
        first_step_bytes: per rank, the peak from the start to the end of the first
            training step, less the start.
        measured_as: ``rss_growth`` (CPU: built the RSS's growth, first step its
            peak's), ``rss_growth_now`` (CPU where the peak cannot be started again:
            the RSS now, which may have shrunk) or ``allocated`` (CUDA).

    Example::

        PlanMemory(estimated_bytes=[2**30], built_bytes=[2**30], first_step_bytes=[2**30 + 2**25],
                   measured_as="rss_growth").ratios  # [1.0]
    """

    estimated_bytes: list[int] | None
    built_bytes: list[int]
    first_step_bytes: list[int]
    measured_as: str

    @property
    def ratios(self) -> list[float] | None:
        """Estimate / built per rank (over 1: the plan overestimates)."""
        if self.estimated_bytes is None:
            return None
        return [e / b if b > 0 else float("inf") for e, b in zip(self.estimated_bytes, self.built_bytes)]

    def line(self) -> str:
        ratios = self.ratios or [None] * len(self.built_bytes)
        estimates = self.estimated_bytes or [None] * len(self.built_bytes)
        ranks = []
        for rank, (estimate, built, step, ratio) in enumerate(
            zip(estimates, self.built_bytes, self.first_step_bytes, ratios)
        ):
            planned = (
                f"estimated {format_bytes(estimate)}, built {format_bytes(built)} ({ratio:.2f}x)"
                if estimate is not None
                else f"built {format_bytes(built)}"
            )
            if step >= 0:
                ranks.append(f"{planned}, {format_bytes(step)} after the first step on rank {rank}")
            else:  # the RSS now (rss_growth_now) below the start: the first step freed more than it took
                ranks.append(f"{planned}, {format_bytes(-step)} freed by the end of the first step on rank {rank}")
        return (
            "plan memory per rank"
            + ("" if self.estimated_bytes is not None else " (the plan file has no estimates)")
            + ": "
            + "; ".join(ranks)
        )


def estimated_device_bytes(estimates: list[RankEstimate] | None, device: torch.device) -> list[int] | None:
    """Per rank, the part of the plan's estimate that `PlanMemoryProbe` measures on ``device``."""
    if estimates is None:
        return None
    return [e.hbm_bytes if device.type == "cuda" else e.ddr_bytes for e in estimates]


class PlanMemoryProbe:
    """Measures one rank's memory growth from its construction (just before the
    sharded model is built) to `built` (the optimizers built) and to `measure` (just
    after the first step).

    Example::

        probe = PlanMemoryProbe(env.device)
        dmp = DistributedModelParallel(...)
        optimizer = build_combined_optimizer(dmp, ...)
        probe.built()
        ...  # the first training step
        record = probe.measure(env, estimates)  # collective
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # Garbage from before (a sweep's earlier trial, a notebook's earlier run) collected
        # while the tables are built would shrink the RSS inside the window: collect it now.
        gc.collect()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            self._peak_restarted = True
        else:
            self._peak_restarted = restart_peak_resident()
        self._start = resident_bytes(device)
        self._built = 0

    def built(self) -> None:
        """The tables and optimizers are built: what they took."""
        self._built = resident_bytes(self.device) - self._start

    def measure(self, env: DistributedEnv, estimates: list[RankEstimate] | None) -> PlanMemory:
        """Every rank's growth beside the plan's estimates. Collective."""
        cuda = self.device.type == "cuda"
        if cuda:
            peak = int(torch.cuda.max_memory_allocated(self.device))
        elif self._peak_restarted:
            peak = max(peak_resident_bytes(), resident_bytes(self.device))
        else:
            peak = resident_bytes(self.device)
        measured_as = "allocated" if cuda else "rss_growth" if self._peak_restarted else "rss_growth_now"
        return PlanMemory(
            estimated_bytes=estimated_device_bytes(estimates, self.device),
            built_bytes=gather_per_rank(env, self._built),
            first_step_bytes=gather_per_rank(env, peak - self._start),
            measured_as=measured_as,
        )
