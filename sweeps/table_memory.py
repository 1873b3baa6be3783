"""A run's table memory: its tables' weights and the planner's estimate (the only
torch user of ``sweeps`` besides the flag check): ``RUN_DIR/table_memory.json``,
computed once per run.

The tables are the run's own (its log's config record); the planner plans them on
the run's ranks with unlimited memory, so the estimate (weights, optimizer state and
input/output buffers per rank, summed) never depends on whether they would fit.

Example::

    table_memory(config_record, ranks_per_node=2, cache_dir=run_dir)
    # TableMemory(weight_bytes=166400, planner_bytes=2249728)
"""

import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from common.atomic import write_json

CACHE_FILE = "table_memory.json"
# Plan as if every rank had this much memory: the estimate, not the fit, is wanted.
_UNLIMITED_BYTES = 2**60


@dataclass
class TableMemory:
    """Embedding memory of a run, summed over its ranks.

    Args:
        weight_bytes: the tables' weights (rows x dim x bytes per element).
        planner_bytes: torchrec's planner estimate: weights, optimizer state, buffers.
    """

    weight_bytes: int
    planner_bytes: int


def table_memory(config: dict[str, Any], ranks_per_node: int, cache_dir: str) -> TableMemory:
    """The table memory of the run whose log's config record is ``config``."""
    cache = os.path.join(cache_dir, CACHE_FILE)
    key = {
        "model": config["model"],
        "world_size": config["world_size"],
        "optimizer": config["optim"]["optimizer"],
        "batch_size": config["data"]["batch_size"],
        "sharding_constraints": config["sharding_constraints"],
    }
    try:
        with open(cache) as f:
            saved = json.load(f)
        if saved.get("key") == key:
            return TableMemory(int(saved["weight_bytes"]), int(saved["planner_bytes"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no cache yet, or one for other tables: plan again
    from sharding_plans.dry_run import plan_request
    from sharding_plans.types import PlannerConfig, PlanRequest, ShardingConstraints

    model = config["model"]
    device = "cuda" if str(config.get("resolved_device", "cpu")).startswith("cuda") else "cpu"
    world_size = config["world_size"]
    request = PlanRequest(
        feature_names=model["sparse_feature_names"],
        num_embeddings_per_feature=model["num_embeddings_per_feature"],
        embedding_dim=model["embedding_dim"],
        embedding_precision=model["embedding_precision"],
        optimizer=config["optim"]["optimizer"],
        topology=PlannerConfig(
            world_size=world_size,
            local_world_size=min(ranks_per_node, world_size),
            compute_device=device,
            batch_size=config["data"]["batch_size"],
            hbm_cap_bytes=_UNLIMITED_BYTES,
            ddr_cap_bytes=_UNLIMITED_BYTES,
        ),
        constraints=ShardingConstraints(**config["sharding_constraints"]),
    )
    estimates = plan_request(request).estimates
    assert estimates is not None
    memory = TableMemory(
        weight_bytes=sum(t.num_bytes for t in request.tables.values()),
        planner_bytes=sum(e.total_bytes for e in estimates),
    )
    write_json(cache, {"key": key, **asdict(memory)})
    return memory
