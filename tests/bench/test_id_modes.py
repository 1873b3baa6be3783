"""bench/id_modes.py at tiny sizes: one synthetic lake and a MovieLens subset, each
trained under hash, vocabulary and zch; the JSON line and the markdown table have every
cell, the figures mean what the table says (a vocabulary with room for every id shares
no row, its unseen share is the true one), and bad flags are refused in one line."""

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from bench import id_modes
from harness.id_benches import column_keys


def _true_unseen(lake: str, column: str) -> float:
    """The share of the test day's ids (the last day) that the training days (all but
    the last two) never held."""
    days = sorted(os.listdir(lake))
    trained = np.concatenate([column_keys(pq.read_table(os.path.join(lake, d)), [column])[0][0] for d in days[:-2]])
    test = column_keys(pq.read_table(os.path.join(lake, days[-1])), [column])[0][0]
    return float(np.mean(~np.isin(test, trained)))


@pytest.mark.slow
@pytest.mark.bench
def test_every_cell_on_both_data_sets(tmp_path, capsys):
    work = str(tmp_path / "work")
    argv = ["--work_dir", work, "--settings", "0.05:3", "--fractions", "2", "--seeds", "1", "--rows_per_day", "1000"]
    argv += ["--sparse_columns", "C1,C3", "--movielens_rows", "3000", "--wheel_dir", str(tmp_path / "wheel")]
    argv += ["--min_id_count", "1", "--jobs", "3"]
    assert id_modes.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    cells = {(c["data"], c["fraction"], c["mode"]): c for c in result["cells"]}
    expected = {(d, 2.0, m) for d in ("synthetic new 0.05 skew 3", "movielens-100k by time") for m in id_modes.MODES}
    assert set(cells) == expected
    table = [line for line in lines if line.startswith("|")]
    assert len(table) == 2 + len(expected) and "test AUROC" in table[0]
    for cell in cells.values():
        assert cell["seeds"] == 1 and 0.3 < cell["test_auroc"] < 1.0
        assert f"| `{cell['mode']}` | 1 | {cell['test_auroc']:.4f} ±" in "\n".join(table)
    for data in ("synthetic new 0.05 skew 3", "movielens-100k by time"):
        hashed, vocabulary = cells[data, 2.0, "hash"], cells[data, 2.0, "vocabulary"]
        assert hashed["time_ratio"] == 1.0 and hashed["auroc_minus_hash"] == 0.0
        # Twice the rows of the distinct ids: the hash still puts some on shared rows,
        # a vocabulary of every id read once puts none.
        assert hashed["collision_share"] > 0.1 and vocabulary["collision_share"] == 0.0
    # The vocabulary's unseen share is exact: the test day's ids the training days lack.
    lake = os.path.join(work, "synthetic_new0.05_skew3_seed0")
    reported = cells["synthetic new 0.05 skew 3", 2.0, "vocabulary"]["per_seed"][0]["unseen_share"]
    for column in ("C1", "C3"):
        assert reported[column] == pytest.approx(_true_unseen(lake, column), abs=1e-6)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--data", "criteo"], "--data 'criteo': expected a comma list of synthetic, movielens"),
        (["--fractions", "half"], "--fractions 'half': expected a comma list of positive numbers"),
        (["--settings", "0.05"], "--settings '0.05': expected a comma list of NEW_ID_RATE:ID_SKEW pairs, e.g. 0.05:3"),
        (["--seeds", "0"], "--seeds and --jobs must be positive, got 0 and 1"),
    ],
)
def test_bad_flags_are_refused_in_one_line(tmp_path, capsys, argv, message):
    assert id_modes.main(["--work_dir", str(tmp_path / "work"), *argv]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"bench/id_modes.py: {message}"]
    assert not os.path.exists(tmp_path / "work")
