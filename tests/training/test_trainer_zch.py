"""--id_hashing zch in training (training/trainer.py, models/zch.py): 2 ranks from Parquet log
per feature live ids, admitted, evicted and collisions at each log step; a 2-rank run resumed
across an eviction ends bit for bit where the uninterrupted one did; a 1-rank run resumes the
2-rank checkpoint with every live id; a 1-rank ``--warm_start`` of the 2-rank run carries its
remapping (evaluated before any admission, it scores as the checkpoint does). One shared set of
runs for the module (tiny tables)."""

import json
import os
import shutil

import pytest

from data.synthetic_parquet import SyntheticParquetSpec, generate_synthetic_parquet
from harness.launch import run_script
from tests.support.entry_refusal import refusal_line
from tests.support.model_state import assert_same_state, flat_state

INTERVAL = 2
STEPS = 8
STOP = 4  # the resumed runs start from the checkpoint of this step (a multiple of INTERVAL)


def _flags(lake: str, checkpoint_dir: str, log_path: str, batch: int) -> list[str]:
    return [
        *("--parquet_path", lake, "--time_column", "date", "--dense_columns", "I*", "--sparse_columns", "C1,C3,M1"),
        *("--id_hashing", "zch", "--zch_eviction_interval", str(INTERVAL), "--num_embeddings", "300"),
        *("--embedding_dim", "8", "--dense_arch_layer_sizes", "16,8", "--over_arch_layer_sizes", "16,1"),
        *("--batch_size", str(batch), "--learning_rate", "0.05", "--optimizer", "adagrad", "--seed", "3"),
        *("--limit_train_batches", str(STEPS), "--limit_val_batches", "0", "--limit_test_batches", "0"),
        *("--log_every_n_steps", "2", "--device", "cpu", "--allow_divergence"),
        *("--checkpoint_dir", checkpoint_dir, "--checkpoint_every_n_steps", str(STOP), "--log_path", log_path),
    ]


def _records(path: str, event: str) -> list[dict]:
    with open(path) as f:
        return [r for r in map(json.loads, f) if r["event"] == event]


def _one_rank(lake: str, root, name: str, *extra: str) -> tuple[str, str]:
    """A 1-rank run of the module's flags (the global batch of the 2-rank runs) and ``extra``
    (a flag given twice: the last one counts); its checkpoint directory and log."""
    checkpoint_dir, log_path = str(root / f"{name}_ck"), str(root / f"{name}.jsonl")
    done = run_script(["dlrm_main.py", *_flags(lake, checkpoint_dir, log_path, 200), *extra])
    assert done.returncode == 0, done.stderr[-3000:]
    return checkpoint_dir, log_path


def _run(lake, root, name, ranks, resume_from=None):
    checkpoint_dir, log_path = str(root / f"{name}_ck"), str(root / f"{name}.jsonl")
    if resume_from is not None:
        os.makedirs(checkpoint_dir)
        shutil.copytree(resume_from, os.path.join(checkpoint_dir, os.path.basename(resume_from)))
    argv = ["dlrm_main.py", *_flags(lake, checkpoint_dir, log_path, 200 // ranks)]
    done = run_script([*argv, *(["--resume"] if resume_from else [])], torchrun_nproc=ranks if ranks > 1 else None)
    assert done.returncode == 0, done.stderr[-3000:]
    return checkpoint_dir, log_path, done.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("zch_training")
    lake = str(root / "lake")
    generate_synthetic_parquet(
        SyntheticParquetSpec(days=3, rows_per_day=1600, files_per_day=1, row_group_rows=800, multi_hot_columns=1), lake
    )
    whole = _run(lake, root, "whole", 2)
    step = os.path.join(whole[0], f"step_{STOP:09d}")
    return {
        "root": root,
        "lake": lake,
        "whole": whole,
        "resumed": _run(lake, root, "resumed", 2, step),
        "one_rank": _run(lake, root, "one_rank", 1, step),
    }


@pytest.mark.slow
@pytest.mark.zch
def test_two_ranks_log_live_admitted_evicted_and_collisions_per_feature(runs):
    _, log_path, stdout = runs["whole"]
    records = _records(log_path, "zch")
    assert [r["step"] for r in records] == list(range(2, STEPS + 1, 2))
    for record in records:
        assert set(record["features"]) == {"C1", "C3", "M1"}
        for counts in record["features"].values():
            assert 0 < counts["live_ids"] <= 300 - 2  # each of the 2 row-wise shards keeps a default row
            assert 0 <= counts["collisions"] <= counts["lookups"]
    first = records[0]["features"]
    assert all(c["admitted"] == c["live_ids"] and c["evicted"] == 0 for c in first.values())
    assert any(c["evicted"] for r in records for c in r["features"].values())  # the tables are full: evictions
    line = [x for x in stdout.splitlines() if x.startswith("zch C1: live ")]
    assert len(line) == len(records), stdout


@pytest.mark.slow
@pytest.mark.zch
def test_two_ranks_resumed_across_evictions_equal_the_uninterrupted_run(runs, tmp_path):
    whole_dir, whole_log, _ = runs["whole"]
    resumed_dir, resumed_log, stdout = runs["resumed"]
    assert f"step {STOP} is no multiple" not in stdout
    final = f"step_{STEPS:09d}"
    assert_same_state(
        flat_state(os.path.join(whole_dir, final), tmp_path), flat_state(os.path.join(resumed_dir, final), tmp_path)
    )
    whole = [r for r in _records(whole_log, "train") if r["step"] > STOP]
    again = _records(resumed_log, "train")
    assert [r["step_losses"] for r in whole] == [r["step_losses"] for r in again]
    later = [r["features"] for r in _records(whole_log, "zch") if r["step"] > STOP]
    assert later == [r["features"] for r in _records(resumed_log, "zch")]


@pytest.mark.slow
@pytest.mark.zch
def test_one_rank_resumes_the_two_rank_checkpoint_with_every_live_id(runs):
    _, whole_log, _ = runs["whole"]
    _, log_path, _ = runs["one_rank"]
    at_stop = next(r for r in _records(whole_log, "zch") if r["step"] == STOP)
    restored = _records(log_path, "zch_restored")
    assert len(restored) == 1
    assert restored[0]["live_ids"] == {n: c["live_ids"] for n, c in at_stop["features"].items()}
    assert [r["step"] for r in _records(log_path, "zch")] == [6, 8]


# The test split's first batches, scored by the 2-rank run's last checkpoint (--mode test on 1
# rank) and by a 1-rank run warm-started from it that trains no step: the same weights and the
# same remapping, so the same scores. A fresh model's lookups of the same ids would all read
# default rows.
EVALUATED = ("--limit_test_batches", "2")


@pytest.fixture(scope="module")
def warm(runs):
    lake, root = runs["lake"], runs["root"]
    final = os.path.join(runs["whole"][0], f"step_{STEPS:09d}")
    _, tested = _one_rank(lake, root, "tested", "--mode", "test", "--restore_checkpoint_path", final, *EVALUATED)
    _, started = _one_rank(
        lake, root, "warm", "--warm_start", runs["whole"][0], "--limit_train_batches", "0", *EVALUATED
    )
    return {"tested": tested, "warm": started, "final": final}


def _test_eval(log_path: str) -> dict:
    (record,) = [r for r in _records(log_path, "eval") if r["stage"] == "test"]
    return record


@pytest.mark.slow
@pytest.mark.zch
def test_a_warm_start_carries_the_remapping_its_lookups_read_the_trained_rows(runs, warm):
    _, whole_log, _ = runs["whole"]
    last = _records(whole_log, "zch")[-1]
    (restored,) = _records(warm["warm"], "zch_restored")
    assert restored["path"] == warm["final"]
    assert restored["live_ids"] == {n: c["live_ids"] for n, c in last["features"].items()}
    (started,) = _records(warm["warm"], "warm_start")
    assert started["step"] == STEPS and started["optimizer"] is False
    origin, carried = _test_eval(warm["tested"]), _test_eval(warm["warm"])
    assert carried["num_samples"] == origin["num_samples"] > 0
    for metric in ("auroc", "log_loss", "ne", "calibration"):
        assert carried[metric] == origin[metric], metric


@pytest.mark.slow
@pytest.mark.zch
def test_a_warm_start_across_id_modes_or_table_sizes_is_one_line(runs, tmp_path, capsys):
    origin = runs["whole"][0]
    at = f"--warm_start {os.path.join(origin, f'step_{STEPS:09d}')}"
    flags = _flags(runs["lake"], str(tmp_path / "new"), str(tmp_path / "new.jsonl"), 200)
    at_zch = flags.index("--id_hashing")
    hashed = [*flags[:at_zch], *flags[at_zch + 4 :]]  # less --id_hashing zch --zch_eviction_interval N
    assert "zch" not in hashed
    assert refusal_line(capsys, ["--warm_start", origin, *hashed]) == (
        f"{at}: its model maps ids by --id_hashing zch, this run by plain tables (--id_hashing hash or "
        "vocabulary): a warm start keeps the id mode (train afresh to change it)"
    )
    line = refusal_line(capsys, ["--warm_start", origin, *flags, "--num_embeddings", "400"])
    assert line.startswith(f"{at}: a zch warm start keeps each table's rows (its id-to-row remapping is sized")
    assert line.endswith("t_C1 300 -> 400 rows, t_C3 300 -> 400 rows, t_M1 300 -> 400 rows")
    assert not os.path.exists(tmp_path / "new")
