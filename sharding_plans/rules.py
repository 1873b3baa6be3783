"""The sharding rules a run obeys beyond the planner's own: what a checkpoint's
optimizer state can be resharded to, which tables must stay on the fused kernels,
and where embedding weight decay would be silently ignored.

The trainer applies them; they know nothing of it (plans are given as
`sharding_plans.report.plan_summary` dicts: {table: {"sharding_type", "compute_kernel",
"ranks", "shards"}}).
"""

from collections.abc import Sequence

import torch
from torchrec.distributed.planner.types import ParameterConstraints

from common.errors import BadInput
from sharding_plans.constraints import FUSED_SHARDING_TYPES
from sharding_plans.types import PlanSummary


class ReshardError(BadInput):
    """A checkpoint's optimizer state cannot move to this run's plan."""


def planner_constraints(
    constraints: dict[str, ParameterConstraints] | None,
    table_names: Sequence[str],
    embedding_precision: str,
    resumed_plan: PlanSummary | None = None,
    pooling_factors: Sequence[float] | None = None,
) -> dict[str, ParameterConstraints] | None:
    """The flags' planner constraints, plus: a resumed run keeps the checkpoint's
    sharding types (``resumed_plan``), whatever the new world size, so that its optimizer
    state can be resharded; fp16 tables are never data-parallel (FBGEMM's dense
    data-parallel kernel has no fp16 backward, so they stay on the fused kernels);
    ``pooling_factors`` (ids a sample in each table's bags, in table order: the
    ``--multi_hot_sizes``) tell the planner what a lookup costs. Without them it
    assumes one id a sample: at DLRMv2's 214 ids its step estimate is about 8x low, and
    its cost-based choice between HBM and UVM caching is made on the wrong traffic.

    Example::

        planner_constraints(None, ["t_cat_0"], "fp16")  # {"t_cat_0": fused sharding types only}
    """
    merged = dict(constraints or {})
    for table, entry in (resumed_plan or {}).items():
        merged.setdefault(table, ParameterConstraints()).sharding_types = [entry["sharding_type"]]
    if embedding_precision == "fp16":
        for table in table_names:
            constraint = merged.setdefault(table, ParameterConstraints())
            if not constraint.sharding_types:
                constraint.sharding_types = list(FUSED_SHARDING_TYPES)
    if pooling_factors is not None:
        if len(pooling_factors) != len(table_names):
            raise ValueError(f"{len(pooling_factors)} pooling factors for {len(table_names)} tables")
        for table, factor in zip(table_names, pooling_factors):
            merged.setdefault(table, ParameterConstraints()).pooling_factors = [float(factor)]
    return merged or None


def check_reshardable(
    saved: PlanSummary,
    plan: PlanSummary,
    source: str,
    weights_only: str = "load weights only with --restore_checkpoint_path",
) -> None:
    """Raises ReshardError (one line starting with ``source``) where TorchRec cannot
    move a table's optimizer state from the ``saved`` plan to ``plan``; ``weights_only``
    says how to start from the weights alone (the flag differs for a warm start)."""
    for table, was in sorted(saved.items()):
        now = plan.get(table)
        if now is None:
            raise ReshardError(f"{source}: table {table} is not in this model")
        was_dp, is_dp = was["sharding_type"] == "data_parallel", now["sharding_type"] == "data_parallel"
        if was_dp != is_dp:
            raise ReshardError(
                f"{source}: table {table} was {was['sharding_type']} and is {now['sharding_type']} "
                "now; optimizer state cannot move between a data-parallel and a fused table: "
                f"{weights_only}"
            )
        column_shards = lambda entry: len({s[1] for s in entry["shards"]})
        if "column" in was["sharding_type"] and column_shards(was) != column_shards(now):
            raise ReshardError(
                f"{source}: table {table} has {column_shards(was)} column shards in the checkpoint "
                f"and {column_shards(now)} now; its per-shard optimizer state cannot be resharded. "
                f"Resume with the same world size, or {weights_only}"
            )


def check_embedding_weight_decay(plan: PlanSummary, device: torch.device, embedding_weight_decay: float) -> None:
    """Refuses --embedding_weight_decay where it would be silently ignored: FBGEMM's
    fused CPU kernels (fbgemm-gpu-cpu 1.8 and 1.9) accept ``weight_decay`` and its modes but
    never apply them (measured: rowwise Adagrad's update is the same with L2, decoupled
    or no decay). Data-parallel tables (the trainer's looked-up-rows L2) and the CUDA
    kernel apply it.

    Args:
        plan: the sharding plan summary.
        device: where the tables train.
        embedding_weight_decay: the flag's value.
    """
    if not embedding_weight_decay or device.type == "cuda":
        return
    fused = sorted(table for table, entry in plan.items() if entry["sharding_type"] != "data_parallel")
    if fused:
        raise BadInput(
            f"--embedding_weight_decay: table {fused[0]} is {plan[fused[0]]['sharding_type']} on "
            f"FBGEMM's fused CPU kernel, which ignores weight decay; on CPU make the tables "
            "data-parallel (--sharding_type data_parallel)"
        )
