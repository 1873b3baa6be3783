"""A torchrun worker for tests/models/test_zch.py: managed-collision tables row-wise over
the ranks (sharding_plans/zch.py) with a fused Adagrad, trained on Zipf-like ids.

On every rank it trains ``STEPS`` steps uninterrupted, then again stopped after
``STOP`` steps, saved with torch.distributed.checkpoint, loaded into a fresh model and
continued; then rank 0 alone loads the stopped run's checkpoint into a 1-rank model.
Each rank returns the largest difference found and the counts (`main`)."""

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from data.parquet.id_hashing import integer_keys, zch_ids
from models.zch import ZchOptions, ZchPooledEmbeddings, build_zch_collection, reserve_history, zch_summary
from sharding_plans.zch import zch_plan, zch_sharder

ROWS, DIM, BATCH, POOL = 16, 4, 8, 40
STEPS, STOP = 6, 4
FEATURES = ("user", "ad")


def build(policy: str, group: dist.ProcessGroup) -> DistributedModelParallel:
    torch.manual_seed(0)
    configs = [
        EmbeddingBagConfig(name=f"t_{f}", embedding_dim=DIM, num_embeddings=ROWS, feature_names=[f]) for f in FEATURES
    ]
    model = ZchPooledEmbeddings(build_zch_collection(configs, ZchOptions(policy, 2), torch.device("meta")))
    apply_optimizer_in_backward(torch.optim.Adagrad, model.parameters(), {"lr": 0.1})
    world = dist.get_world_size(group)
    sharded = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(group),
        device=torch.device("cpu"),
        plan=zch_plan(model, world, world, torch.device("cpu")),
        sharders=[zch_sharder()],
    )
    reserve_history(sharded.module.collection, BATCH * world)  # every id of the global batch
    return sharded


def batch(step: int, rank: int) -> KeyedJaggedTensor:
    """A Zipf-like draw of ``POOL`` integer ids per feature, different on every rank and step."""
    generator = np.random.default_rng(1000 * step + rank)
    raw = np.minimum(generator.zipf(1.3, size=BATCH * len(FEATURES)), POOL)
    ids = torch.from_numpy(zch_ids(integer_keys(raw), seed=0))
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(FEATURES), values=ids, lengths=torch.ones(BATCH * len(FEATURES), dtype=torch.int32)
    )


def train(model: DistributedModelParallel, steps: range, rank: int) -> list[float]:
    losses = []
    for step in steps:
        loss = (model(batch(step, rank)).values() ** 2).sum()
        loss.backward()
        losses.append(float(loss.detach()))
    return losses


def local_state(model: DistributedModelParallel) -> dict[str, torch.Tensor]:
    """This rank's tables, remapping and optimizer state, as plain tensors."""
    state = {}
    for name, value in model.state_dict().items():
        state[name] = value.local_shards()[0].tensor if hasattr(value, "local_shards") else value
    for name, value in model.fused_optimizer.state_dict()["state"].items():
        for key, tensor in value.items():
            if hasattr(tensor, "local_shards"):
                state[f"{name}.{key}"] = tensor.local_shards()[0].tensor
    return {k: v.detach().clone() for k, v in state.items()}


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float((a[k].double() - b[k].double()).abs().max()) if a[k].numel() else 0.0 for k in a)


def main(argv: list[str]) -> dict:
    """``argv``: the eviction policy and a folder for the checkpoint; returns this rank's result."""
    policy, out = argv
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    world_group = dist.group.WORLD
    assert world_group is not None

    uninterrupted = build(policy, world_group)
    losses, evicted, admitted = [], 0, 0
    for step in range(STEPS):  # counted step by step: the full tables evict
        losses += train(uninterrupted, range(step, step + 1), rank)
        report = uninterrupted.module.statistics.report(uninterrupted.module.collection, world_group)
        evicted += sum(s.evicted for s in report.values())
        admitted += sum(s.admitted for s in report.values())

    stopped = build(policy, world_group)
    first = train(stopped, range(STOP), rank)
    checkpoint = os.path.join(out, "checkpoint")
    generator = torch.get_rng_state()  # evicted rows are drawn again from the global generator
    dcp.save({"model": stopped.state_dict(), "optim": stopped.fused_optimizer.state_dict()}, checkpoint_id=checkpoint)
    mapping = {}  # what the stopped run maps each admitted id of each table to
    for table, module in stopped.module.collection._managed_collision_collection._managed_collision_modules.items():
        ids, rows = module._mch_sorted_raw_ids, module._mch_remapped_ids_mapping
        live = ids != torch.iinfo(torch.int64).max
        mapping[table] = (ids[live].tolist(), rows[live].tolist())
    gathered: list = [None] * world
    dist.all_gather_object(gathered, mapping)

    resumed = build(policy, world_group)
    state = {"model": resumed.state_dict(), "optim": resumed.fused_optimizer.state_dict()}
    dcp.load(state, checkpoint_id=checkpoint)
    resumed.load_state_dict(state["model"])
    resumed.fused_optimizer.load_state_dict(state["optim"])
    torch.set_rng_state(generator)
    resumed_losses = first + train(resumed, range(STOP, STEPS), rank)

    result = {
        "losses": losses,
        "resumed_losses": resumed_losses,
        "state_difference": largest_difference(local_state(uninterrupted), local_state(resumed)),
        "summary": zch_summary(report),
        "live": {f: s.live_ids for f, s in report.items()},
        "admitted": admitted,
        "evicted": evicted,
        "collision_share": {f: s.collision_share for f, s in report.items()},
    }
    alone = dist.new_group([0])
    if rank == 0:  # the stopped run's checkpoint on 1 rank: every admitted id keeps its row
        single = build(policy, alone)
        state = {"model": single.state_dict()}
        dcp.load(state, checkpoint_id=checkpoint, process_group=alone)
        single.load_state_dict(state["model"])
        single.eval()
        wrong = 0
        modules = single.module.collection._managed_collision_collection._managed_collision_modules
        for table in modules:
            ids = torch.tensor([i for m in gathered for i in m[table][0]], dtype=torch.int64)
            rows = torch.tensor([r for m in gathered for r in m[table][1]], dtype=torch.int64)
            feature = table.removeprefix("t_")
            kjt = KeyedJaggedTensor.from_lengths_sync(
                keys=[feature], values=ids, lengths=torch.ones(len(ids), dtype=torch.int32)
            )
            remapped = modules[table]({table: kjt[feature]})[table].values()
            wrong += int((remapped != rows).sum())
        result["resharded_wrong_rows"] = wrong
        result["resharded_ids"] = sum(len(m[t][0]) for m in gathered for t in m)
    dist.barrier()
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
