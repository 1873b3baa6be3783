"""A model with history features (--sequence_columns) trains on 2 gloo ranks exactly
as in one process, and resumes exactly.

Random data with two histories (0 to 6 items a row, empty ones included), the DIN
pooling, SGD. The 2-rank run (64 rows per rank, its item tables in the sharded
EmbeddingCollection, row-wise, and the others in the EmbeddingBagCollection, table-wise,
under the sparse_dist train pipeline) must give the losses and final weights of one
process with 128-row batches and whole tables, to float rounding (1e-6). The 2-rank run
stopped at its step-3 checkpoint and resumed must end bit for bit where it ended.
All runs share one launch per world size. The 2-rank checkpoint exports the eager model.
"""

import os
import shutil
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from harness.launch import launch
from harness.matrix import local_weights
from serving import export
from serving.inference_model import load_checkpoint_model
from serving.model_files import load_model_file
from serving.model_inputs import read_inputs
from tests.support.sequence_model import (
    assert_ranks_match_reference,
    assert_resumed_matches_uninterrupted,
    tiny_sequence_model,
)
from training.distributed import resolve_env
from training.flags import parse_config
from training.trainer import Trainer

pytestmark = pytest.mark.slow  # every test uses the module's launched runs

TOLERANCE = 1e-6
STEPS, STOP = 6, 3
ROWS = 30
ITEMS = ("cat_3", "cat_5")
ARGV = [
    "--sequence_columns",
    "h3:cat_3,h5:cat_5",
    "--max_history",
    "6",
    *tiny_sequence_model(ROWS, STEPS),
]


def _train(job: tuple[list[str], str, bool]) -> dict[str, Any]:
    """Trains the job's argv (checkpoints under its root); with its resume flag also
    from its step-STOP checkpoint. Returns the losses and this rank's weights of each run."""
    argv, root, resume = job
    env = resolve_env("cpu")
    whole, cut = os.path.join(root, "whole"), os.path.join(root, "cut")
    trainer = Trainer(
        parse_config(argv + ["--checkpoint_dir", whole, "--checkpoint_every_n_steps", str(STOP)], "t", "t"), env
    )
    result = {"losses": trainer.fit().train_losses, **local_weights(trainer.model)}
    result["plan"] = {t: ps.sharding_type for plan in trainer.model.plan.plan.values() for t, ps in plan.items()}
    # What torchrec's sparse_dist pipeline runs ahead (its own list): both collections, not a fallback.
    result["pipelined"] = sorted(type(m).__name__ for m in trainer.train_pipeline._pipelined_modules)  # type: ignore[attr-defined]
    if resume:
        if env.rank == 0:
            shutil.copytree(os.path.join(whole, f"step_{STOP:09d}"), os.path.join(cut, f"step_{STOP:09d}"))
        dist.barrier()
        trainer = Trainer(parse_config(argv + ["--checkpoint_dir", cut, "--resume"], "t", "t"), env)
        result["resumed"] = {"losses": trainer.fit().train_losses, **local_weights(trainer.model)}
    dist.destroy_process_group()
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sequences")
    sharding = ["--sharding_type", ",".join(f"t_{i}=row_wise" for i in ITEMS) + ",table_wise"]
    two = launch(_train, (ARGV + ["--batch_size", "64", *sharding], str(root / "two"), True), nproc=2)  # type: ignore[arg-type]
    one = launch(_train, (ARGV + ["--batch_size", "128"], str(root / "one"), False), nproc=1)  # type: ignore[arg-type]
    return one[0], [two[0], two[1]], str(root / "two" / "whole")


def test_two_ranks_match_one_process(runs):
    reference, per_rank, _ = runs
    assert per_rank[0]["plan"]["t_cat_3"] == "row_wise" and per_rank[0]["plan"]["t_cat_0"] == "table_wise"
    assert per_rank[0]["pipelined"] == ["ShardedEmbeddingBagCollection", "ShardedEmbeddingCollection"]
    # The attention's weights are trained (dense, all-reduced), beside the tables.
    assert any("sequence_pooling.h3" in key for key in reference["dense"])
    assert len(reference["tables"]) == 26
    assert_ranks_match_reference(reference, per_rank, ROWS, TOLERANCE)
    assert reference["losses"][-1] < reference["losses"][0]


def test_resumed_run_ends_where_the_uninterrupted_one_did(runs):
    _, per_rank, _ = runs
    assert_resumed_matches_uninterrupted(per_rank, STOP)


def test_the_sharded_checkpoint_exports_the_eager_model(runs, tmp_path, capsys):
    """The 2-rank checkpoint (an item table row-wise sharded) exports; its fp32 program
    gives the unsharded eager model's probabilities on random histories (1e-6). The
    quantized variants, asked for, are refused in one line, nothing written; without
    --quantize the export writes fp32 only."""
    _, _, checkpoints = runs
    refused = tmp_path / "refused"
    assert export.main(["--checkpoint", checkpoints, "--output", str(refused), "--quantize", "fp16,int8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "history features (--sequence_columns h3:cat_3,h5:cat_5)" in err[0], err
    assert not refused.exists() or not any(refused.iterdir())
    output = str(tmp_path / "model")
    assert export.main(["--checkpoint", checkpoints, "--output", output]) == 0
    assert set(read_inputs(output).variants) == {"fp32"}
    # Random data's layout (raw Criteo lines) has no place for histories: the program itself, as a server calls it.
    inputs = read_inputs(output)
    program = load_model_file(output, "fp32.pt2", "torch.export", None, inputs.input_columns())
    model, meta = load_checkpoint_model(inputs.checkpoint)
    generator = torch.Generator().manual_seed(0)
    batch, names = 6, meta.model.sparse_feature_names
    dense = torch.randn(batch, 13, generator=generator)
    sparse = torch.randint(0, ROWS, (batch, len(names)), generator=generator)
    lengths = torch.randint(0, 7, (batch, 2), generator=generator)  # up to max_history, none included
    values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=generator)
    # The KJT of the same rows: feature by feature, a history's ids row by row.
    per_row = torch.split(values, lengths.reshape(-1).tolist())
    histories = [torch.cat([per_row[r * 2 + s] for r in range(batch)]) for s in range(2)]
    features = KeyedJaggedTensor.from_lengths_sync(
        keys=[*names, "h3", "h5"],
        values=torch.cat([sparse.t().reshape(-1), *histories]),
        lengths=torch.cat([torch.ones(batch * len(names), dtype=torch.int64), lengths.t().reshape(-1)]),
    )
    with torch.no_grad():
        expected = torch.sigmoid(model.model(dense, features).squeeze(-1))
        got = program(dense, sparse, values, lengths)
    assert torch.allclose(got, expected, rtol=0, atol=TOLERANCE), (got - expected).abs().max()
