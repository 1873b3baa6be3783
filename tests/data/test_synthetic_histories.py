"""python -m data.synthetic_histories: the layout and columns, determinism, and labels that
depend on the user's history beyond the user (what a memoryless model cannot see)."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.errors import EXIT_BAD_INPUT
from data.histories import HistoryFlags, build_histories
from data.synthetic_histories import COLUMNS, SyntheticHistoriesSpec, _world, generate_synthetic_histories, main

SPEC = SyntheticHistoriesSpec(days=3, rows_per_day=3000, row_group_rows=1000, users=60, items=200, seed=4)


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    root = tmp_path_factory.mktemp("histories")
    generate_synthetic_histories(SPEC, str(root / "log"))
    build_histories(
        HistoryFlags(str(root / "log"), str(root / "with_history"), "user_id", "item_id", "ts", "label", max_history=10)
    )
    return root


def test_layout_columns_and_ties(log):
    assert sorted(os.listdir(log / "log")) == ["date=2026-11-01", "date=2026-11-02", "date=2026-11-03"]
    day = pq.ParquetFile(log / "log" / "date=2026-11-02" / "part-0.parquet")
    assert day.metadata.num_rows == 3000 and day.metadata.num_row_groups == 3
    table = day.read()
    assert table.schema.names == COLUMNS
    assert table.schema.field("ts").type == pa.timestamp("ms", tz="UTC")
    assert [table.schema.field(c).type for c in COLUMNS[1:]] == [pa.int8(), pa.int64(), pa.int64(), pa.int64()]
    ts = table["ts"].to_numpy().astype(np.int64)
    assert (np.diff(ts) >= 0).all() and (np.diff(ts) == 0).any()  # in time order, with ties
    assert 0.2 < np.mean(table["label"].to_numpy()) < 0.6
    assert table["user_id"].to_numpy().max() < SPEC.users and table["item_id"].to_numpy().max() < SPEC.items


def test_the_same_flags_give_the_same_files(log, tmp_path):
    generate_synthetic_histories(SPEC, str(tmp_path / "again"))
    for day in os.listdir(log / "log"):
        assert pq.read_table(tmp_path / "again" / day).equals(pq.read_table(log / "log" / day))


def test_a_click_depends_on_the_users_earlier_clicks_not_only_on_the_user(log):
    """Within each user, an impression of a category the user's history holds is clicked
    far more often than one it does not: the user's id alone cannot tell them apart."""
    world = _world(SPEC)
    rows = pq.read_table(log / "with_history").to_pylist()
    differences, weights = [], []
    for user in {r["user_id"] for r in rows}:
        mine = [r for r in rows if r["user_id"] == user and r["item_id_history"]]
        seen = np.array([r["category"] in set(world.item_category[r["item_id_history"]]) for r in mine], dtype=bool)
        labels = np.array([r["label"] for r in mine], dtype=float)
        if seen.sum() >= 5 and (~seen).sum() >= 5:
            differences.append(labels[seen].mean() - labels[~seen].mean())
            weights.append(len(mine))
    assert len(differences) > 20
    assert np.average(differences, weights=weights) > 0.15


def test_without_the_history_term_the_history_tells_less(tmp_path):
    """Positive control: with --history_scale 0 and --taste_scale 0 the same measure is near 0."""
    flat = SyntheticHistoriesSpec(**{**vars(SPEC), "history_scale": 0.0, "taste_scale": 0.0, "days": 2})
    generate_synthetic_histories(flat, str(tmp_path / "log"))
    build_histories(HistoryFlags(str(tmp_path / "log"), str(tmp_path / "out"), "user_id", "item_id", "ts", "label"))
    world = _world(flat)
    rows = [r for r in pq.read_table(tmp_path / "out").to_pylist() if r["item_id_history"]]
    seen = np.array([r["category"] in set(world.item_category[r["item_id_history"]]) for r in rows])
    labels = np.array([r["label"] for r in rows], dtype=float)
    assert abs(labels[seen].mean() - labels[~seen].mean()) < 0.08


def test_bad_flags_are_one_line(tmp_path, capsys):
    code = main(["--output_dir", str(tmp_path / "out"), "--taste_shift", "2"])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT and err.count("\n") == 1 and "--taste_shift must be within [0, 1]" in err
