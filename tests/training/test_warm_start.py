"""--warm_start: a new run from a checkpoint's weights (and, by choice, its optimizer
state), its tables grown, on another world size; and every refusal's one line.

One 1-rank launch trains the source checkpoint, then warm-starts from it (with and
without its optimizer state) and builds a fresh model of the grown shape; one 2-rank
launch warm-starts from the same checkpoint with the grown table split by rows across
the ranks. The refusals run in this process: each is found before any collective.
"""

import dataclasses
import hashlib
import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor

import dlrm_main
from checkpoints.errors import CheckpointError
from checkpoints.opened import read_meta
from data.binary.criteo_layout import NUM_SPARSE_FEATURES
from harness.launch import launch, read_log
from harness.matrix.checks import assemble_table
from harness.matrix.ranks import local_weights
from tests.support.entry_refusal import refusal_line
from tests.support.model_state import flat_state
from training.distributed import resolve_env
from training.flags import parse_config
from training.trainer import Trainer
from training.warm_start import grown_tables

pytestmark = [pytest.mark.slow, pytest.mark.loop]  # the module's launched runs: make test-loop

STEPS = 4
DIM = 8
TABLE_ROWS = [40 + 3 * i for i in range(NUM_SPARSE_FEATURES)]
GROWN_ROWS = [TABLE_ROWS[0] + 7, TABLE_ROWS[1] + 5, *TABLE_ROWS[2:]]
# The grown tables: t_cat_0 fused (split by rows on 2 ranks), t_cat_1 data-parallel
# (a plain tensor on every rank, trained by a torch Adagrad: its accumulator is "sum").
SHARDING = "table_wise,t_cat_1=data_parallel"
SHARDING_2_RANKS = "table_wise,t_cat_0=row_wise,t_cat_1=data_parallel"
ACCUMULATORS = {"t_cat_0": "t_cat_0.momentum1", "t_cat_1": "sum"}


def _model(rows: list[int]) -> list[str]:
    return [
        "--num_embeddings_per_feature",
        ",".join(map(str, rows)),
        "--embedding_dim",
        str(DIM),
        "--dense_arch_layer_sizes",
        f"16,{DIM}",
        "--over_arch_layer_sizes",
        "16,1",
        "--optimizer",
        "adagrad",
        "--learning_rate",
        "0.05",
        "--seed",
        "5",
    ]


def _run(data: str, *extra: str, batch: int = 128) -> list[str]:
    return [
        "--in_memory_binary_criteo_path",
        data,
        "--batch_size",
        str(batch),
        "--limit_train_batches",
        str(STEPS),
        "--limit_val_batches",
        "0",
        "--limit_test_batches",
        "0",
        "--log_every_n_steps",
        "1",
        "--device",
        "cpu",
        *extra,
    ]


def _pieces(value) -> list:
    """(row, col, tensor) of this rank's pieces of a table-shaped value."""
    if isinstance(value, ShardedTensor):
        return [
            (s.metadata.shard_offsets[0], s.metadata.shard_offsets[1], s.tensor.detach().clone())
            for s in value.local_shards()
        ]
    return [(0, 0, value.detach().clone())]


def _accumulator(state: dict, table: str) -> list:
    """This rank's pieces of a grown table's Adagrad accumulator (rows x columns)."""
    values = [
        value
        for key, entry in state.items()
        if f"embedding_bags.{table}.weight" in key
        for name, value in entry.items()
        if name == ACCUMULATORS[table]
    ]
    return [(r, c, t.reshape(t.shape[0], -1)) for value in values for r, c, t in _pieces(value)]


def _at_start(trainer: Trainer) -> dict:
    """This rank's weights, its pieces of the grown tables' accumulators and the dense
    optimizer's state, before the first step."""
    state = trainer.optimizer.state_dict()["state"]
    dense = {
        f"{key}.{name}": v.clone()
        for key, entry in state.items()
        if "embedding_bags" not in key
        for name, v in entry.items()
        if name == "sum"
    }
    return {
        **local_weights(trainer.model),
        "momentum": {table: _accumulator(state, table) for table in ACCUMULATORS},
        "dense_optim": dense,
    }


def _trainers(runs: list[tuple[list[str], bool]]) -> list[dict]:
    """Builds each argv's trainer on this launch's process group, reports its state at
    step 0 and, when asked, trains it."""
    results = []
    for argv, fit in runs:
        trainer = Trainer(parse_config(argv, "test", "test"), resolve_env("cpu"))
        outcome = {"start": _at_start(trainer), "saved": None, "losses": None}
        if fit:
            outcome["losses"] = trainer.fit().train_losses
            outcome["saved"] = trainer._saved_path
        results.append(outcome)
    dist.destroy_process_group()
    return results


@pytest.fixture(scope="module")
def runs(synthetic_dir, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("warm_start")
    source = str(root / "source")
    warm = lambda name, *extra, batch=128: (
        _run(synthetic_dir, *_model(GROWN_ROWS), "--warm_start", source, *extra, batch=batch)
        + (["--sharding_type", SHARDING] if batch == 128 else [])
        + ["--checkpoint_dir", str(root / name), "--log_path", str(root / f"{name}.jsonl")]
    )
    one = launch(
        _trainers,
        [
            (
                _run(synthetic_dir, *_model(TABLE_ROWS), "--checkpoint_dir", source)
                + ["--checkpoint_every_n_steps", "2", "--sharding_type", SHARDING],
                True,
            ),
            (warm("carried", "--warm_start_optimizer"), True),
            (warm("fresh_optimizer"), True),
            # a fresh run of the grown shape
            (_run(synthetic_dir, *_model(GROWN_ROWS), "--sharding_type", SHARDING), False),
        ],
        nproc=1,
    )[0]
    two = launch(
        _trainers,
        [(warm("two_ranks", "--warm_start_optimizer", "--sharding_type", SHARDING_2_RANKS, batch=64), True)],
    )
    return {
        "root": root,
        "source": one[0]["saved"],
        "carried": one[1],
        "fresh_optimizer": one[2],
        "fresh_model": one[3],
        "two_ranks": [two[0][0], two[1][0]],
    }


def _table(outcomes: list[dict], table: str, rows: int, kind: str = "tables") -> torch.Tensor:
    return assemble_table(
        [o["start"] if kind == "tables" else {"tables": o["start"][kind]} for o in outcomes], table, rows, DIM
    )


def test_step_0_holds_the_checkpoints_weights_and_grown_rows_as_the_seed_says(runs, tmp_path):
    saved = flat_state(runs["source"], tmp_path)
    carried, fresh = runs["carried"], runs["fresh_model"]
    for i, rows in enumerate(GROWN_ROWS):
        table = f"t_cat_{i}"
        weights = _table([carried], table, rows)
        old = saved[f"model.model.sparse_arch.embedding_bag_collection.embedding_bags.{table}.weight"]
        assert torch.equal(weights[: TABLE_ROWS[i]], old), table  # exactly the checkpoint's rows
        # the new rows: what a fresh run of this seed and shape holds
        assert torch.equal(weights[TABLE_ROWS[i] :], _table([fresh], table, rows)[TABLE_ROWS[i] :]), table
    for key, value in carried["start"]["dense"].items():
        assert torch.equal(value, saved[f"model.{key}"]), key
    assert not torch.equal(_table([carried], "t_cat_0", GROWN_ROWS[0]), _table([fresh], "t_cat_0", GROWN_ROWS[0]))


def test_optimizer_state_carries_only_with_warm_start_optimizer(runs, tmp_path):
    saved = flat_state(runs["source"], tmp_path)
    for i, (table, name) in enumerate(ACCUMULATORS.items()):
        momentum = _table([runs["carried"]], table, GROWN_ROWS[i], "momentum")
        [stored] = [v for k, v in saved.items() if f"embedding_bags.{table}.weight." in k and k.endswith(name)]
        assert stored.abs().sum() > 0
        assert torch.equal(momentum[: TABLE_ROWS[i]], stored.reshape(TABLE_ROWS[i], -1)), table
        fresh = _table([runs["fresh_model"]], table, GROWN_ROWS[i], "momentum")
        assert torch.equal(momentum[TABLE_ROWS[i] :], fresh[TABLE_ROWS[i] :]), table  # the new rows': a fresh run's
        # without the flag the optimizers start as a fresh run's
        assert torch.equal(_table([runs["fresh_optimizer"]], table, GROWN_ROWS[i], "momentum"), fresh), table
    dense = runs["carried"]["start"]["dense_optim"]
    assert dense and all(torch.equal(v, saved[f"optim.state.{k}"]) for k, v in dense.items())
    fresh = runs["fresh_model"]["start"]["dense_optim"]
    assert fresh.keys() == dense.keys() and any(not torch.equal(dense[k], fresh[k]) for k in dense)
    assert all(torch.equal(v, fresh[k]) for k, v in runs["fresh_optimizer"]["start"]["dense_optim"].items())
    # the same weights give the same first loss; the carried accumulators then take smaller steps
    carried, fresh = runs["carried"]["losses"], runs["fresh_optimizer"]["losses"]
    assert carried[0] == fresh[0] and carried[1] != fresh[1]


def test_a_new_run_from_step_0_that_records_where_it_started(runs):
    root, source = runs["root"], runs["source"]
    assert os.path.basename(source) == f"step_{STEPS:09d}"
    assert os.listdir(root / "carried") == [f"step_{STEPS:09d}"]  # steps counted from 0
    meta = read_meta(str(root / "carried" / f"step_{STEPS:09d}"))
    with open(os.path.join(source, "meta.json"), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    origin = meta.warm_start
    assert origin is not None and (origin.path, origin.step, origin.meta_sha256) == (source, STEPS, digest)
    assert origin.run_id == read_meta(source).run_id and meta.model.num_embeddings_per_feature == GROWN_ROWS
    [record] = [r for r in read_log(str(root / "carried.jsonl")) if r["event"] == "warm_start"]
    assert record["meta_sha256"] == digest and record["optimizer"] is True
    assert record["grown_tables"] == {
        "t_cat_0": [TABLE_ROWS[0], GROWN_ROWS[0]],
        "t_cat_1": [TABLE_ROWS[1], GROWN_ROWS[1]],
    }
    assert [r["step"] for r in read_log(str(root / "carried.jsonl")) if r["event"] == "train"] == [1, 2, 3, 4]


def test_two_ranks_warm_start_as_one_rank_does(runs):
    """The 1-rank checkpoint on 2 ranks (t_cat_0 split by rows, each rank holding old
    and new rows): the same step-0 state exactly, the same losses within rounding."""
    one, two = runs["carried"], runs["two_ranks"]
    for i, rows in enumerate(GROWN_ROWS):
        assert torch.equal(_table([one], f"t_cat_{i}", rows), _table(two, f"t_cat_{i}", rows)), i
    for i, table in enumerate(ACCUMULATORS):
        one_state, two_state = (_table(o, table, GROWN_ROWS[i], "momentum") for o in ([one], two))
        assert torch.equal(one_state, two_state), table
    assert two[0]["losses"] == pytest.approx(one["losses"], abs=1e-6)


def test_refusals_are_one_line(runs, synthetic_dir, tmp_path, capsys):
    source = runs["source"]
    at = f"--warm_start {source}"

    def refused(rows: list[int], *extra: str) -> str:
        argv = _run(synthetic_dir, *_model(rows), "--warm_start", os.path.dirname(source), *extra)
        return refusal_line(capsys, argv + ["--checkpoint_dir", str(tmp_path / "new")])

    fewer = [TABLE_ROWS[0] - 1, *TABLE_ROWS[1:]]
    assert refused(fewer) == (
        f"{at}: table t_cat_0 is [{TABLE_ROWS[0]}, {DIM}] there and [{TABLE_ROWS[0] - 1}, {DIM}] in this model: "
        "a warm start keeps a table's width and can only add rows"
    )
    assert refused(TABLE_ROWS, "--embedding_dim", "4", "--dense_arch_layer_sizes", "16,4") == (
        f"{at}: table t_cat_0 is [{TABLE_ROWS[0]}, {DIM}] there and [{TABLE_ROWS[0]}, 4] in this model: "
        "a warm start keeps a table's width and can only add rows"
    )
    other_model = refused(TABLE_ROWS, "--interaction_type", "dcn")
    assert other_model.startswith(f"{at}: another model: ")
    assert 'interaction_type is "original" in the checkpoint, "dcn" now' in other_model
    assert refused(GROWN_ROWS, "--warm_start_optimizer", "--optimizer", "sgd") == (
        f'{at}: --warm_start_optimizer carries the state of other optimizers: optim.dense_optimizer is "adagrad" '
        'in the checkpoint, "sgd" now; optim.optimizer is "adagrad" in the checkpoint, "sgd" now (give the same, '
        "or leave the flag out: the optimizers start fresh)"
    )
    # (the refusals of flags alone: tests/training/test_flags.py)
    # Another feature set: a table on one side only, named with its shape.
    saved = read_meta(source).model
    other = dataclasses.replace(saved, sparse_feature_names=[*saved.sparse_feature_names[:-1], "user"])
    with pytest.raises(CheckpointError) as refusal:
        grown_tables(saved, other, "--warm_start X")
    assert str(refusal.value) == (
        f"--warm_start X: table t_user [{TABLE_ROWS[-1]}, {DIM}] of this model is not in the checkpoint "
        f"(its tables: {', '.join(saved.table_names)}): another feature set"
    )
    # --resume of a warm-started run continues it; a --warm_start that names another origin is refused.
    carried = str(runs["root"] / "carried")
    other_step = os.path.join(os.path.dirname(source), "step_000000002")
    resumed = _run(synthetic_dir, *_model(GROWN_ROWS), "--checkpoint_dir", carried, "--resume", "--warm_start")
    assert refusal_line(capsys, resumed + [other_step]).startswith(
        f"--resume: checkpoint {carried}/step_{STEPS:09d} continues a run that was warm-started from {source} "
        f"(step {STEPS}, "
    )
    assert dlrm_main.main(resumed + [os.path.dirname(source)]) == 0
    assert f"resumed from {carried}/step_{STEPS:09d}" in capsys.readouterr().out
