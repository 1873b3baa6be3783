"""Planning without the hardware: meta-device tables, no GPU, no process group.

`sharding_plans.types.PlanRequest` describes the tables and the hardware; `plan_request` returns the plan
with the planner's estimates, `smallest_fitting_world_size` looks for the fewest
ranks of the same kind that hold a model that does not fit.
"""

import math
from collections.abc import Callable

import torch
from torch import nn

from models import build_dlrm_train
from models.embedding_optimizer import EmbeddingOptimizerConfig, attach_fused_embedding_optimizer
from sharding_plans.planner import plan_with_estimates
from sharding_plans.rules import planner_constraints
from sharding_plans.sharders import build_sharders
from sharding_plans.types import PlanDoesNotFit, PlannerConfig, PlanRequest, SavedPlan

# Give up looking for a world size that fits after this many planner runs.
MAX_SEARCH_PLANS = 8


def _planning_model(request: PlanRequest) -> nn.Module:
    model = build_dlrm_train(request.model_config, dense_device=torch.device("meta"))
    attach_fused_embedding_optimizer(model.model.sparse_arch, EmbeddingOptimizerConfig(optimizer=request.optimizer))
    return model


def plan_request(request: PlanRequest) -> SavedPlan:
    """Plans the request's tables on its topology, on meta tensors.

    Raises:
        PlanDoesNotFit: no placement fits the ranks' memory under the constraints.
        BadInput: bad request (one line).
    """
    request.validate()
    table_names = request.model_config.table_names
    topology = request.topology
    plan, estimates = plan_with_estimates(
        _planning_model(request),
        build_sharders(request.constraints.row_splits_on_cpu(table_names, topology.compute_device)),
        topology,
        # The training run's own constraints (`training.sharding`): fp16 tables fused,
        # the bags' sizes as the tables' pooling factors.
        planner_constraints(
            request.constraints.parameter_constraints(
                table_names, request.embedding_dim, topology.world_size, topology.compute_device
            ),
            table_names,
            request.embedding_precision,
            pooling_factors=request.pooling_factors,
        ),
    )
    return SavedPlan(topology=topology, tables=request.tables, plan=plan, estimates=estimates)


def rank_capacity_bytes(topology: PlannerConfig) -> int:
    """Memory per rank the planner may fill with embeddings (HBM on CUDA, DDR on CPU).

    HBM-only: plans that fit only by spilling to host memory (UVM) are found by the
    planner itself; this is for lower bounds.
    """
    capacity = topology.hbm_cap_bytes if topology.compute_device == "cuda" else topology.ddr_cap_bytes
    return int((capacity or 0) * topology.usable_fraction)


def smallest_fitting_world_size(
    request: PlanRequest, on_try: Callable[[int, bool], None] | None = None
) -> tuple[int | None, int]:
    """Looks for the fewest ranks (whole hosts when the request's world size is whole
    hosts) on which the planner finds a plan, in at most `MAX_SEARCH_PLANS` planner runs.

    Starts from the weights-only lower bound (total table bytes over usable memory
    per rank), grows by half until a plan fits, then bisects. ``on_try(world_size,
    fits)`` is called after each planner run.

    Returns:
        (the smallest world size found to fit or None, the largest found not to fit);
        when they are one host (or rank) apart the first is the minimum.
    """
    topology = request.topology
    unit = topology.local_world_size if topology.world_size % topology.local_world_size == 0 else 1
    capacity = rank_capacity_bytes(topology)
    if capacity <= 0:
        return None, topology.world_size
    weights = sum(t.num_bytes for t in request.tables.values())

    def round_up(n: float) -> int:
        return int(math.ceil(n / unit)) * unit

    runs = 0

    def fits(world_size: int) -> bool:
        nonlocal runs
        runs += 1
        try:
            plan_request(request.with_world_size(world_size))
            ok = True
        except PlanDoesNotFit:
            ok = False
        if on_try is not None:
            on_try(world_size, ok)
        return ok

    failed = topology.world_size
    candidate = max(round_up(weights / capacity), failed + unit)
    while not fits(candidate):
        failed = candidate
        if runs >= MAX_SEARCH_PLANS:
            return None, failed
        candidate = round_up(candidate * 1.5)
    while candidate - failed > unit and runs < MAX_SEARCH_PLANS:
        middle = round_up((failed + candidate) / 2)
        if middle >= candidate:
            break
        if fits(middle):
            candidate = middle
        else:
            failed = middle
    return candidate, failed
