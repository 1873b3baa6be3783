"""Builds the embedding sharding plan for the real hardware.

The planner is told the real memory (CUDA: the device's; CPU: host memory shared by
the ranks of a node) instead of TorchRec's 32 GiB HBM / 128 GiB DDR defaults, and
reserves a fixed share for the dense part and activations.
"""

import logging
import os
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import (
    KernelConfig,
    ParameterConstraints,
    Topology,
    TopologyFactory,
    TrainerConfig,
)
from torchrec.distributed.types import ModuleSharder, ShardingPlan

# Share of each device's memory kept free for dense parameters, activations and buffers.
STORAGE_RESERVATION_PERCENTAGE = 0.15


def host_memory_bytes() -> int:
    """Physical memory of this host."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass
class PlannerConfig:
    """The hardware and batch the plan is made for.

    Args:
        world_size: ranks in the job.
        local_world_size: ranks per host.
        compute_device: "cuda" or "cpu".
        batch_size: training rows per rank per step.
        hbm_cap_bytes: memory per GPU (CUDA only; None: queried from the device).
        ddr_cap_bytes: host memory per rank (None: this host's memory / local_world_size).
    """

    world_size: int
    local_world_size: int
    compute_device: str
    batch_size: int
    hbm_cap_bytes: Optional[int] = None
    ddr_cap_bytes: Optional[int] = None

    def validate(self) -> None:
        if self.compute_device not in ("cuda", "cpu"):
            raise ValueError(f"compute device must be cuda or cpu, got {self.compute_device!r}")
        if self.world_size <= 0 or self.local_world_size <= 0:
            raise ValueError("world size and local world size must be positive")
        for name, value in (("hbm", self.hbm_cap_bytes), ("ddr", self.ddr_cap_bytes)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} capacity must be positive, got {value}")


def build_topology(config: PlannerConfig) -> Topology:
    """A `Topology` with the real (or given) memory per rank."""
    config.validate()
    hbm = config.hbm_cap_bytes
    if config.compute_device == "cuda" and hbm is None:
        hbm = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    ddr = config.ddr_cap_bytes or host_memory_bytes() // config.local_world_size
    return TopologyFactory.create_topology(
        TrainerConfig(
            world_size=config.world_size,
            local_world_size=config.local_world_size,
            hbm_cap_bytes=hbm if config.compute_device == "cuda" else None,
            ddr_cap_bytes=ddr,
        ),
        kernel_config=KernelConfig(compute_device=config.compute_device),
    )


def build_sharding_plan(
    module: nn.Module,
    sharders: List[ModuleSharder[nn.Module]],
    config: PlannerConfig,
    process_group: Optional[dist.ProcessGroup] = None,
    constraints: Optional[Dict[str, ParameterConstraints]] = None,
) -> ShardingPlan:
    """Plans the sharding of every embedding module in ``module``.

    With a process group the plan is made on rank 0 and broadcast, so every rank
    uses the same plan; without one (a dry run, or one process) it is made locally.
    ``constraints`` maps table names to allowed sharding types / kernels.

    Example::

        plan = build_sharding_plan(model, get_default_sharders(),
                                   PlannerConfig(world_size=2, local_world_size=2,
                                                 compute_device="cpu", batch_size=512))
    """
    planner = EmbeddingShardingPlanner(
        topology=build_topology(config),
        batch_size=config.batch_size,
        storage_reservation=FixedPercentageStorageReservation(STORAGE_RESERVATION_PERCENTAGE),
        constraints=constraints,
    )
    # The planner prints its plan through this logger at INFO; we print our own.
    logging.getLogger("torchrec.distributed.planner.stats").setLevel(logging.WARNING)
    if process_group is not None and dist.get_world_size(process_group) > 1:
        return planner.collective_plan(module, sharders, process_group)
    return planner.plan(module, sharders)
