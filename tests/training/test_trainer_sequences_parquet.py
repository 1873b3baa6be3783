"""A model with a history feature trains from Parquet (--parquet_path with --sequence_columns
item_id_history:item_id, the log written by data.synthetic_histories and data.histories)
on 2 gloo ranks exactly as in one process, and resumes exactly.

Split by time (the last day the test split), histories cut to their newest 5 of up to 8.
The 2-rank run (16 rows per rank, two converting workers each, the item table row-wise
in the sharded EmbeddingCollection) must give the losses and final weights of one process
reading the same two shares (--epoch_shares 2) in 32-row batches, to float rounding; the
2-rank run stopped at its step-3 checkpoint and resumed must end bit for bit where it
ended. In the same 2-rank launch, a copy of the log whose histories hold their rows' own
items is refused with --user_column on both ranks alike, in one line naming the file,
row group, row and column, before any collective. One launch per world size.
"""

import os
import shutil
from typing import Any

import pytest
import torch.distributed as dist

from common.errors import BadInput
from harness.launch import launch
from harness.matrix import local_weights
from tests.support.history_log import HISTORY, ITEM, USER, leaking_copy, write_history_log
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
ARGV = [
    "--sparse_columns",
    "user_id,item_id",
    "--dense_columns",
    "category",
    "--time_column",
    "ts",
    "--sequence_columns",
    f"{HISTORY}:{ITEM}",
    "--max_history",
    "5",
    *tiny_sequence_model(ROWS, STEPS),
]


def _train(job: tuple[list[str], str, bool, str | None]) -> dict[str, Any]:
    """Trains the job's argv (checkpoints under its root); with its resume flag also
    from its step-STOP checkpoint, and starts on its leaking table (if any) with
    --user_column. Returns the losses and this rank's weights of each run, and the
    leaking table's refusal."""
    argv, root, resume, leaking = job
    env = resolve_env("cpu")
    whole, cut = os.path.join(root, "whole"), os.path.join(root, "cut")
    trainer = Trainer(
        parse_config(argv + ["--checkpoint_dir", whole, "--checkpoint_every_n_steps", str(STOP)], "t", "t"), env
    )
    result = {"losses": trainer.fit().train_losses, **local_weights(trainer.model)}
    result["plan"] = {t: ps.sharding_type for plan in trainer.model.plan.plan.values() for t, ps in plan.items()}
    result["facts"] = trainer.serving_facts
    if resume:
        if env.rank == 0:
            shutil.copytree(os.path.join(whole, f"step_{STOP:09d}"), os.path.join(cut, f"step_{STOP:09d}"))
        dist.barrier()
        trainer = Trainer(parse_config(argv + ["--checkpoint_dir", cut, "--resume"], "t", "t"), env)
        result["resumed"] = {"losses": trainer.fit().train_losses, **local_weights(trainer.model)}
    if leaking is not None:
        with pytest.raises(BadInput) as refused:
            Trainer(parse_config([*argv, "--parquet_path", leaking, "--user_column", USER], "t", "t"), env)
        result["refused"] = str(refused.value)
    dist.destroy_process_group()
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("parquet_sequences")
    log = write_history_log(str(root / "data"))
    leak = leaking_copy(log, str(root / "leaking"))
    argv = ["--parquet_path", log, *ARGV]
    sharding = ["--sharding_type", f"t_{ITEM}=row_wise,table_wise", "--data_workers", "2"]
    job = (argv + ["--batch_size", "16", *sharding], str(root / "two"), True, str(root / "leaking"))
    two = launch(_train, job, nproc=2)  # type: ignore[arg-type]
    job = (argv + ["--batch_size", "32", "--epoch_shares", "2"], str(root / "one"), False, None)
    one = launch(_train, job, nproc=1)  # type: ignore[arg-type]
    return one[0], [two[0], two[1]], leak


def test_two_ranks_match_one_process(runs):
    reference, per_rank, _ = runs
    assert per_rank[0]["plan"][f"t_{ITEM}"] == "row_wise" and per_rank[0]["plan"]["t_user_id"] == "table_wise"
    assert any(f"sequence_pooling.{HISTORY}" in key for key in reference["dense"])
    # Serving reads the history column's type as training did.
    assert reference["facts"]["sparse_value_types"][HISTORY] == "integer_list"
    assert len(reference["losses"]) == len(per_rank[0]["losses"]) == STEPS
    assert sorted(reference["tables"]) == [f"t_{ITEM}", "t_user_id"]
    assert_ranks_match_reference(reference, per_rank, ROWS, TOLERANCE)


def test_resumed_run_ends_where_the_uninterrupted_one_did(runs):
    _, per_rank, _ = runs
    assert_resumed_matches_uninterrupted(per_rank, STOP)


def test_a_history_holding_the_rows_own_future_stops_every_rank_alike(runs):
    _, per_rank, (path, group, row) = runs
    line = per_rank[0]["refused"]
    assert per_rank[1]["refused"] == line
    assert line.startswith(f"{path}: row group {group}, row {row}, column {HISTORY}: item "), line
    assert "not before the row's time" in line and "\n" not in line
