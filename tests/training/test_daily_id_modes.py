"""python -m training.daily with the id modes and history features beyond hashing:

- ``--id_hashing vocabulary``: each day's warm start grows the vocabulary (every id kept
  the day before keeps its row, the day's frequent new ids get new rows), so the tables
  grow and the day is exported in full, the loop saying why;
- ``--id_hashing zch``: each day's warm start carries the day before's id-to-row
  remapping (its live ids), and every day is exported in full, the loop saying why;
- ``--sequence_columns``: a model with a history feature trains, warm-starts, is
  exported as a delta of the first day's export and gated like the others.

Each loop runs once, as a program, over a 3-day lake (2 days trained, the third held
back). Times on a 2-core machine busy with other work: about 3 minutes a loop.
"""

import os

import numpy as np
import pytest

from checkpoints.directory import newest_checkpoint
from checkpoints.opened import read_meta
from data.synthetic_parquet import SyntheticParquetSpec, generate_synthetic_parquet
from harness.launch import read_log
from serving.predict import Predictor
from tests.support.history_log import HISTORY, ITEM, write_history_log
from tests.training.test_daily import TRAINING, run_loop
from training import daily
from training.id_vocabulary import checkpoint_vocabulary

pytestmark = [pytest.mark.slow, pytest.mark.loop]

DAYS = ["2026-11-01", "2026-11-02", "2026-11-03"]
# A drifting catalogue: ids live 2 days, so the second day brings many new ones.
LAKE = SyntheticParquetSpec(
    days=3, rows_per_day=128, files_per_day=1, row_group_rows=64, multi_hot_columns=0, seed=3, id_lifetime_days=2
)
VOCABULARY = [f for f in TRAINING if f not in ("--num_embeddings", "50")] + [
    "--id_hashing",
    "vocabulary",
    "--min_id_count",
    "2",
]
ZCH = [f for f in TRAINING if f not in ("--num_embeddings", "50")] + [
    *("--num_embeddings", "64", "--id_hashing", "zch", "--zch_eviction_interval", "2"),
]
HISTORY_FLAGS = [
    "--sparse_columns",
    f"user_id,{ITEM}",
    "--dense_columns",
    "category",
    "--sequence_columns",
    f"{HISTORY}:{ITEM}",
    "--max_history",
    "5",
    "--din_attention_layer_sizes",
    "8",
    *[f for f in TRAINING if f not in ("--dense_columns", "I*", "--sparse_columns", "C*", "--batch_size", "32")],
    "--batch_size",
    "25",
]


def _loop(tmp_path_factory, lake: str, flags: list[str]) -> tuple[str, str]:
    state_dir = tmp_path_factory.mktemp("daily") / "state"
    done = run_loop(state_dir, lake, flags=flags)
    assert done.returncode == 0, done.stderr[-3000:]
    return str(state_dir), done.stdout


def _meta(state_dir: str, day: str):
    return read_meta(newest_checkpoint(os.path.join(state_dir, "days", day, "ckpt")))


@pytest.fixture(scope="module")
def vocabulary_loop(tmp_path_factory):
    lake = tmp_path_factory.mktemp("lake") / "clicks"
    generate_synthetic_parquet(LAKE, str(lake))
    return _loop(tmp_path_factory, str(lake), VOCABULARY)


def test_a_vocabulary_grows_each_day_every_id_keeping_its_row_and_the_day_exports_in_full(vocabulary_loop):
    state_dir, stdout = vocabulary_loop
    state = daily.read_state(os.path.join(state_dir, "state.json"))
    assert [r.day for r in state.days] == DAYS[:-1] and all(r.trained and r.promoted for r in state.days)
    first, second = (_meta(state_dir, day) for day in DAYS[:-1])
    was, now = first.model.num_embeddings_per_feature, second.model.num_embeddings_per_feature
    assert all(b >= a for a, b in zip(was, now)) and sum(now) > sum(was)  # the day's new ids got rows
    names = list(first.model.sparse_feature_names)
    old, new = (
        checkpoint_vocabulary(newest_checkpoint(os.path.join(state_dir, "days", d, "ckpt")), names) for d in DAYS[:-1]
    )
    for f, name in enumerate(names):
        kept = old.kept[f]
        assert np.array_equal(new.kept[f][: len(kept)], kept), name  # every kept id keeps its row
        assert new.rows(f, kept).tolist() == list(range(1, len(kept) + 1))
        assert len(new.kept[f]) + 1 == now[f]
    # Grown tables: no delta (it keeps every shape), a full export, and why.
    assert [r.base for r in state.days] == [None, None]
    records = read_log(os.path.join(state_dir, "daily.jsonl"))
    (full,) = [r for r in records if r["event"] == "full_export"]
    assert full["day"] == DAYS[1] and full["base"] == DAYS[0] and full["reason"].startswith("its tables changed (t_")
    assert f"{DAYS[1]}: exporting in full, not as a delta of {DAYS[0]}: its tables changed" in stdout
    # Served through the grown vocabulary: the held-back day scored as the gate scored it.
    predictor = Predictor(os.path.join(state_dir, "days", DAYS[1], "model"), "fp32")
    assert predictor.layout.columns.vocabulary.table_sizes == list(now)  # type: ignore[attr-defined]
    assert isinstance(state.days[1].gate["auroc"], float)


@pytest.fixture(scope="module")
def zch_loop(tmp_path_factory):
    lake = tmp_path_factory.mktemp("lake") / "clicks"
    generate_synthetic_parquet(LAKE, str(lake))
    return _loop(tmp_path_factory, str(lake), ZCH)


def test_zch_days_carry_their_remapping_export_in_full_and_promote(zch_loop):
    state_dir, stdout = zch_loop
    state = daily.read_state(os.path.join(state_dir, "state.json"))
    assert [r.day for r in state.days] == DAYS[:-1] and all(r.trained and r.promoted for r in state.days)
    assert state.days[0].gate["promote"] and isinstance(state.days[1].gate["auroc"], float)
    # The second day starts from the first day's remapping: every id it admitted keeps its row.
    first_log, second_log = (os.path.join(state_dir, "days", day, "train.jsonl") for day in DAYS[:-1])
    last = [r for r in read_log(first_log) if r["event"] == "zch"][-1]
    (restored,) = [r for r in read_log(second_log) if r["event"] == "zch_restored"]
    assert restored["live_ids"] == {name: c["live_ids"] for name, c in last["features"].items()}
    assert restored["path"] == newest_checkpoint(os.path.join(state_dir, "days", DAYS[0], "ckpt"))
    # The mapping moves every day: no delta, a full export, and why.
    assert [r.base for r in state.days] == [None, None]
    records = read_log(os.path.join(state_dir, "daily.jsonl"))
    (full,) = [r for r in records if r["event"] == "full_export"]
    assert full["day"] == DAYS[1] and full["reason"].startswith("a zch model's id-to-row mapping changes")
    assert f"{DAYS[1]}: exporting in full, not as a delta of {DAYS[0]}: a zch model's" in stdout
    # The pointer names the day the gate kept in service, and it serves.
    assert state.current in DAYS[:-1]
    served = os.path.realpath(os.path.join(state_dir, daily.CURRENT))
    assert served == os.path.realpath(os.path.join(state_dir, "days", state.current, "model"))
    assert Predictor(served, "fp32").base is None
    assert f"in service: {state.current}" in stdout


@pytest.fixture(scope="module")
def history_loop(tmp_path_factory):
    log = write_history_log(str(tmp_path_factory.mktemp("histories")), days=3, rows_per_day=100)
    return _loop(tmp_path_factory, log, HISTORY_FLAGS)


def test_a_model_with_history_features_runs_the_loop_its_second_day_a_delta(history_loop):
    state_dir, stdout = history_loop
    state = daily.read_state(os.path.join(state_dir, "state.json"))
    assert [r.day for r in state.days] == DAYS[:-1] and all(r.trained and r.promoted for r in state.days)
    assert _meta(state_dir, DAYS[1]).model.sequence_columns == [f"{HISTORY}:{ITEM}"]
    assert [r.base for r in state.days] == [None, DAYS[0]]  # the tables keep their shapes: a delta
    records = read_log(os.path.join(state_dir, "daily.jsonl"))
    progressive = [r for r in records if r["event"] == "eval"]
    assert [(r["day"], r["trained_through"]) for r in progressive] == list(zip(DAYS[1:], DAYS[:-1]))
    assert all(isinstance(r["auroc"], float) for r in progressive)
    (delta,) = [r for r in records if r["event"] == "export"]
    assert delta["day"] == DAYS[1] and delta["ratio"] >= 1.0 and delta["sketch_bytes"] > 0
    predictor = Predictor(os.path.join(state_dir, "days", DAYS[1], "model"), "fp32")
    assert predictor.base == os.path.normpath(os.path.join(state_dir, "days", DAYS[0], "model"))
    assert f"in service: {state.current}" in stdout
