"""bench/quality.py's time split, seeds and goals without the wheel or training: the
baselines' time split is the one the Parquet source gives the models, a summary is the
mean and sample standard deviation of its runs, and the flags that cannot run say so."""

import numpy as np
import pyarrow.parquet as pq
import pytest

from bench import quality
from bench.quality import CATEGORICAL, NUMERICAL, Table, goals, summarize, time_order, time_split_flags, time_splits


def _table(n: int = 500) -> Table:
    rng = np.random.default_rng(3)
    categorical = np.stack([rng.integers(0, 6 + k, n) for k in range(len(CATEGORICAL))], axis=1)
    times = rng.integers(1_000, 2_000, n)  # many ties, in no order
    labels = (rng.random(n) < 0.5).astype(np.float32)
    numerical = rng.random((n, len(NUMERICAL))).astype(np.float32)
    return Table(categorical, numerical, labels, [6 + k for k in range(len(CATEGORICAL))], times)


def test_time_split_rows_are_the_parquet_sources_latest_windows(tmp_path):
    table = _table()
    order = time_order(table, 400)
    assert len(order) == 400 and len(set(order)) == 400 and (np.diff(table.times[order]) >= 0).all()
    ordered = table.take(order)
    log = quality.write_log(ordered, str(tmp_path), quality.MAX_HISTORY)
    splits = time_splits(time_split_flags(log, ordered.cardinalities))

    # Every row once; the windows are the last 10% of the time range [first, last + 1) and the 10% before.
    assert sorted(np.concatenate(list(splits.values())).tolist()) == list(range(400))
    times = ordered.times
    start, end = int(times.min()), int(times.max()) + 1
    test_start = end - round((end - start) * 0.1)
    validation_start = test_start - round((end - start) * 0.1)
    assert (times[splits["train"]] < validation_start).all()
    assert ((times[splits["validation"]] >= validation_start) & (times[splits["validation"]] < test_start)).all()
    assert (times[splits["test"]] >= test_start).all()
    assert len(splits["test"]) == (times >= test_start).sum() > 0

    # The log holds the table's rows in order, with the film history the models read.
    written = pq.read_table(log)
    np.testing.assert_array_equal(written.column("row").to_numpy(), np.arange(400))
    np.testing.assert_array_equal(written.column("item_id").to_numpy(), ordered.categorical[:, 1])
    assert quality.HISTORY_COLUMN in written.column_names

    # The two histories split each user's earlier ratings by the label, newest last.
    rows = written.to_pylist()
    for row in rows:
        earlier = [r for r in rows if r["user_id"] == row["user_id"] and r["time"] < row["time"]]
        liked = [r["item_id"] for r in earlier if r["label"]][-quality.MAX_HISTORY :]
        disliked = [r["item_id"] for r in earlier if not r["label"]][-quality.MAX_HISTORY :]
        assert row[quality.HISTORY_COLUMN] == liked
        assert row[quality.DISLIKED_HISTORY_COLUMN] == disliked

    # The history models' flags, after the data flags, name the log's columns: no user id
    # or zip code (with their table sizes), the aggregates as dense features, the history.
    for name in quality.HISTORY_MODELS:
        flags = quality.history_model_flags(name, ordered.cardinalities)
        config, source = quality.parse_config_and_source(
            [*time_split_flags(log, ordered.cardinalities), *flags, "--recipe", "small_data"], "quality", ""
        )
        kept = [f for f in CATEGORICAL if f not in ("user_id", "zip_code")]
        assert config.model.sparse_feature_names == kept
        assert config.model.num_embeddings_per_feature == [ordered.cardinalities[CATEGORICAL.index(f)] for f in kept]
        assert config.model.dense_in_features == len(NUMERICAL) + len(quality.HISTORY_AGGREGATES)
        histories = [(quality.HISTORY_COLUMN, "item_id"), (quality.DISLIKED_HISTORY_COLUMN, "item_id")]
        assert config.model.sequences == (histories if name == "dlrm_history" else [])
        dataset = source.open()
        read = dataset.read_segment(dataset.splits["test"][0], quality.HISTORY_AGGREGATES)
        assert read.column_names == quality.HISTORY_AGGREGATES  # the log holds them
    assert quality.history_model_flags("dlrm", ordered.cardinalities) == []


def test_summary_is_mean_and_sample_std_over_seeds():
    runs = [
        {"auroc": a, "ne": 0.9, "calibration": 1.0, "log_loss": 0.6, "validation_auroc": a, "num_samples": 10}
        for a in (0.70, 0.72, 0.74)
    ]
    summary = summarize(runs, [0, 1, 2])
    assert summary["auroc"] == pytest.approx(0.72) and summary["auroc_std"] == pytest.approx(0.02)
    assert summary["ne_std"] == 0 and summary["num_samples"] == 10 and summary["seeds"] == [0, 1, 2]
    assert summary["auroc_per_seed"] == [0.70, 0.72, 0.74]
    assert summarize(runs[:1], None)["auroc_std"] == 0.0


def test_goals_compare_the_means():
    figures = {name: {"auroc": a} for name, a in [("logistic_regression", 0.70), ("dlrm", 0.705), ("dcnv2", 0.69)]}
    assert goals(figures, "time") == {"dlrm_vs_logistic_regression": True, "dcnv2_vs_logistic_regression": False}
    assert goals(figures, "random")["dlrm_vs_logistic_regression"] is False  # needs + 0.01 there
    figures.update(dlrm_history={"auroc": 0.73}, lightgbm_history={"auroc": 0.72})
    found = goals(figures, "time")
    assert found["dlrm_history_vs_lightgbm_history"] and found["dlrm_history_vs_dlrm"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--models", "dlrm,xgboost"], "--models dlrm,xgboost: unknown xgboost"),
        (["--seeds", "0"], "--seeds 0: give at least 1"),
        (["--sequences"], "--sequences needs --split time"),
    ],
)
def test_flags_that_cannot_run_exit_2_with_one_line(argv, message, capsys, tmp_path):
    assert quality.main(["--work_dir", str(tmp_path), *argv]) == 2
    assert capsys.readouterr().err.strip().startswith(message)
