"""Checks that a saved plan fits the model and the job that is about to use it."""

import torch
from torch import nn
from torchrec.modules.embedding_configs import DataType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from common.errors import BadInput
from sharding_plans.constraints import UNCACHED_KERNELS, check_table_precision
from sharding_plans.types import SavedPlan, TableSpec


class PlanMismatchError(BadInput):
    """The plan was made for other tables, another number of ranks or another device."""


def embedding_tables(model: nn.Module) -> dict[str, dict[str, TableSpec]]:
    """{module path: {table: shape}} of every EmbeddingBagCollection in ``model``.

    Example::

        embedding_tables(model)["model.sparse_arch.embedding_bag_collection"]["t_cat_0"]
    """
    found: dict[str, dict[str, TableSpec]] = {}
    for path, module in model.named_modules():
        if isinstance(module, EmbeddingBagCollection):
            found[path] = {
                c.name: TableSpec(c.num_embeddings, c.embedding_dim, "fp16" if c.data_type == DataType.FP16 else "fp32")
                for c in module.embedding_bag_configs()
            }
    return found


def _shape(spec: TableSpec) -> str:
    return f"{spec.rows} x {spec.dim} {spec.precision}"


def check_plan_for_run(
    saved: SavedPlan,
    source: str,
    model_tables: dict[str, dict[str, TableSpec]],
    world_size: int,
    local_world_size: int,
    device: torch.device,
) -> None:
    """Raises PlanMismatchError (one line starting with ``source``) unless the plan
    places exactly the model's tables, with their shapes, on this job's ranks.

    Args:
        saved: the plan read from ``source``.
        source: the plan file's name, for messages.
        model_tables: `embedding_tables` of the model.
        world_size: ranks of the job.
        local_world_size: ranks per host (CUDA placements name the device of each rank).
        device: this rank's device.

    Example::

        check_plan_for_run(read_plan(path), path, embedding_tables(model), 2, 2, torch.device("cpu"))
    """
    topology = saved.topology
    if topology.world_size != world_size:
        raise PlanMismatchError(
            f"{source} is a plan for {topology.world_size} ranks, this run has {world_size}: "
            f"plan again with --world_size {world_size}"
        )
    if topology.compute_device != device.type:
        raise PlanMismatchError(
            f"{source} places tables on {topology.compute_device} devices, this run uses {device.type}"
        )
    if device.type == "cuda" and topology.local_world_size != local_world_size:
        raise PlanMismatchError(
            f"{source} is a plan for {topology.local_world_size} GPUs per host, this run has {local_world_size}"
        )
    for path, tables in model_tables.items():
        planned = saved.plan.plan.get(path)
        if planned is None:
            raise PlanMismatchError(f"{source} has no plan for the model's embedding module {path!r}")
        for table, spec in tables.items():
            if table not in planned:
                raise PlanMismatchError(f"{source} does not place the model's table {table}")
            check_table_precision(table, planned[table].sharding_type, spec.precision, source)
            if saved.tables[table] != spec:
                raise PlanMismatchError(
                    f"{source}: table {table} is {_shape(saved.tables[table])} in the plan, {_shape(spec)} in the model"
                )
        extra = [t for t in planned if t not in tables]
        if extra:
            raise PlanMismatchError(f"{source} places table {extra[0]}, which the model does not have")
    extra_modules = [p for p in saved.plan.plan if p not in model_tables]
    if extra_modules:
        raise PlanMismatchError(f"{source} plans module {extra_modules[0]!r}, which the model does not have")


def check_plan_locks_cache_lines(saved: SavedPlan, source: str) -> None:
    """Raises PlanMismatchError (one line starting with ``source``) when the plan turns
    off cache-line locking on a cached table: a plan's ``cache_params.prefetch_pipeline``
    replaces the sharders' fused parameter (torchrec ``distributed/utils.py``), and a
    pipeline that prefetches the next batch into the cache needs the locking, or the
    prefetch can evict rows the current backward updates (wrong results, torchrec only
    warns). Unset (null) or true is fine; kernels without a cache ignore it.

    Example::

        check_plan_locks_cache_lines(read_plan(path), path)   # under --pipeline prefetch
    """
    for module_plan in saved.plan.plan.values():
        for table, ps in module_plan.items():
            if (
                ps.compute_kernel not in UNCACHED_KERNELS
                and ps.cache_params is not None
                and ps.cache_params.prefetch_pipeline is False
            ):
                raise PlanMismatchError(
                    f"{source}: table {table} ({ps.compute_kernel}) sets cache_params.prefetch_pipeline false, "
                    "which turns off the cache-line locking the prefetch pipeline needs: "
                    "set it true or remove it"
                )
