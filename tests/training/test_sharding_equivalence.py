"""Every sharding type trains exactly like one process with whole tables.

Each variant trains a tiny DLRM for a few SGD steps on 2 gloo ranks (64 rows per
rank) under one sharding type; the reference trains the same model in one process
with the same 128-row global batches. The data loaders give step k on 2 ranks the
rows of step k on 1 rank, tables are initialised independently of the sharding, and
the reported loss is the mean over ranks (what one process with the global batch
reports, embedding gradients being divided by the world size): so losses and final
weights must agree up to float rounding (summation order), here 1e-6. SGD keeps that
rounding from growing (Adagrad variants are not equivalent under column + row
splits: one accumulator per shard row).

All variants run one after the other in the same two processes to pay the start-up
once.
"""

import math
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torchrec.distributed.types import EnumerableShardingSpec

from data.binary.criteo_layout import NUM_SPARSE_FEATURES
from harness.launch import launch
from harness.matrix import assemble_table, local_weights
from models import build_dlrm_train
from models.config import ModelConfig
from sharding_plans import cli
from tests.support.model_state import criteo_features
from training.distributed import resolve_env
from training.embedding_init import init_embedding_tables
from training.flags import parse_config
from training.trainer import Trainer

pytestmark = pytest.mark.slow  # every test uses the module's launched runs

TOLERANCE = 1e-6
STEPS = 6
TABLE_ROWS = [40 + 3 * i for i in range(NUM_SPARSE_FEATURES)]
MODEL = [
    "--num_embeddings_per_feature",
    ",".join(map(str, TABLE_ROWS)),
    "--embedding_dim",
    "8",
    "--dense_arch_layer_sizes",
    "16,8",
    "--over_arch_layer_sizes",
    "16,1",
    "--optimizer",
    "sgd",
    "--learning_rate",
    "0.5",
    "--seed",
    "5",
]
RUN = [
    "--limit_train_batches",
    str(STEPS),
    "--limit_val_batches",
    "0",
    "--limit_test_batches",
    "0",
    "--log_every_n_steps",
    "100",
    "--device",
    "cpu",
]
# All six types at once, per table (the types cycle over the tables).
TYPES = ["data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise"]
MIXED = ",".join(f"t_cat_{i}={TYPES[i % len(TYPES)]}" for i in range(NUM_SPARSE_FEATURES))


def _weights(trainer: Trainer) -> dict[str, Any]:
    """This rank's pieces of every table, the dense parameters and, per table, the
    plan's sharding type and shard placements."""
    layout = {}
    for module_plan in trainer.model.plan.plan.values():
        for table, ps in module_plan.items():
            spec = ps.sharding_spec
            shards = (
                [(tuple(s.shard_sizes), s.placement.rank()) for s in spec.shards]
                if isinstance(spec, EnumerableShardingSpec)
                else None
            )
            layout[table] = (ps.sharding_type, shards)
    return {**local_weights(trainer.model), "layout": layout}


def _run_variants(variants: list[list[str]]) -> list[dict[str, Any]]:
    """Trains each argv in turn on this launch's process group; returns per variant
    the losses and this rank's weights."""
    results = []
    for argv in variants:
        trainer = Trainer(parse_config(argv, "test", "test"), resolve_env("cpu"))
        result = trainer.fit()
        results.append({"losses": result.train_losses, **_weights(trainer)})
    dist.destroy_process_group()
    return results


@pytest.fixture(scope="module")
def runs(synthetic_dir, tmp_path_factory):
    """The reference (1 process) and every 2-rank variant, trained once."""
    data = ["--in_memory_binary_criteo_path", synthetic_dir]
    plan_path = str(tmp_path_factory.mktemp("plans") / "mixed.json")
    # The same mixed plan, made by the CLI and reused through --sharding_plan.
    assert (
        cli.main(
            [
                "plan",
                *MODEL[:4],
                "--world_size",
                "2",
                "--compute_device",
                "cpu",
                "--ddr_gb",
                "4",
                "--batch_size",
                "64",
                "--sharding_type",
                MIXED,
                "--output",
                plan_path,
            ]
        )
        == 0
    )
    variants = {t: ["--sharding_type", t] for t in TYPES}
    variants["mixed"] = ["--sharding_type", MIXED]
    variants["plan file"] = ["--sharding_plan", plan_path]
    names = list(variants)
    two = launch(_run_variants, [[*data, *MODEL, *RUN, "--batch_size", "64", *variants[n]] for n in names], nproc=2)
    one = launch(_run_variants, [[*data, *MODEL, *RUN, "--batch_size", "128"]], nproc=1)
    return one[0][0], {name: [two[0][i], two[1][i]] for i, name in enumerate(names)}


@pytest.mark.parametrize("variant", TYPES + ["mixed", "plan file"])
def test_sharded_matches_single_process(runs, variant):
    reference, variants = runs
    per_rank = variants[variant]
    layout = per_rank[0]["layout"]
    # The plan really is of the asked type: row splits over both ranks, column
    # splits in two (table-column-wise may keep both on one rank), and the tables
    # spread over both ranks.
    for i in range(NUM_SPARSE_FEATURES):
        table = f"t_cat_{i}"
        wanted = variant if variant in TYPES else TYPES[i % len(TYPES)]
        sharding_type, shards = layout[table]
        assert sharding_type == wanted, (table, layout[table])
        if wanted in ("row_wise", "table_row_wise"):
            assert sorted(rank for _, rank in shards) == [0, 1], (table, shards)
        if wanted in ("column_wise", "table_column_wise"):
            assert [size for size, _ in shards] == [(TABLE_ROWS[i], 4)] * 2, (table, shards)
    if variant != "data_parallel":
        assert {rank for _, shards in layout.values() if shards for _, rank in shards} == {0, 1}

    assert len(reference["losses"]) == len(per_rank[0]["losses"]) == STEPS
    for a, b in zip(reference["losses"], per_rank[0]["losses"]):
        assert math.isclose(a, b, rel_tol=0, abs_tol=TOLERANCE), (reference["losses"], per_rank[0]["losses"])
    for i, rows in enumerate(TABLE_ROWS):
        table = f"t_cat_{i}"
        expected = assemble_table([reference], table, rows, 8)
        got = assemble_table(per_rank, table, rows, 8)
        assert torch.allclose(got, expected, rtol=0, atol=TOLERANCE), (table, (got - expected).abs().max())
    assert reference["dense"].keys() == per_rank[0]["dense"].keys()
    for key, expected in reference["dense"].items():
        for result in per_rank:
            got = result["dense"][key]
            assert torch.allclose(got, expected, rtol=0, atol=TOLERANCE), (key, (got - expected).abs().max())


def test_training_moved_the_weights(runs):
    """Guards the comparison above: the steps moved every table by far more than
    the tolerance (1e-4 to 2e-3 here), and lowered the loss."""
    reference, _ = runs
    config = ModelConfig(
        num_embeddings_per_feature=TABLE_ROWS,
        **criteo_features(),
        embedding_dim=8,
        dense_arch_layer_sizes=[16, 8],
        over_arch_layer_sizes=[16, 1],
    )
    initial = build_dlrm_train(config, embedding_device=torch.device("cpu"))
    shapes = {f"t_cat_{i}": (rows, 8) for i, rows in enumerate(TABLE_ROWS)}
    init_embedding_tables(initial, shapes, seed=5)
    for key, value in initial.state_dict().items():
        if "embedding_bags" in key:
            table = key.split(".")[-2]
            moved = (assemble_table([reference], table, *shapes[table]) - value).abs().max()
            assert moved > 50 * TOLERANCE, (table, moved)
    assert reference["losses"][-1] < reference["losses"][0]
