"""bench/quality.py's history aggregates (--history_aggregates): every row's user's and
film's past events, positives and rate against a brute-force count, without the wheel."""

import numpy as np

from bench.quality import CATEGORICAL, HISTORY_AGGREGATES, Table, history_aggregates, with_history_aggregates


def test_history_aggregates_count_only_strictly_earlier_ratings(tmp_path):
    rng = np.random.default_rng(7)
    n = 300
    categorical = np.zeros((n, len(CATEGORICAL)), dtype=np.int64)
    categorical[:, 0], categorical[:, 1] = rng.integers(0, 9, n), rng.integers(0, 15, n)  # user, film
    times = rng.integers(880_000_000, 880_000_040, n)  # many ties, in no order
    labels = (rng.random(n) < 0.55).astype(np.float32)
    table = Table(categorical, np.zeros((n, 3), np.float32), labels, [9, 15] + [1] * 6, times)

    got = history_aggregates(table, str(tmp_path))
    assert got.shape == (n, 6) and HISTORY_AGGREGATES[0] == "user_id_past_events"
    for row in range(n):
        for k, column in enumerate((0, 1)):
            earlier = (categorical[:, column] == categorical[row, column]) & (times < times[row])
            events, positives = earlier.sum(), labels[earlier].sum()
            assert got[row, 3 * k] == events and got[row, 3 * k + 1] == positives
            assert np.isnan(got[row, 3 * k + 2]) if events == 0 else got[row, 3 * k + 2] == positives / events

    features = with_history_aggregates(table, got, np.arange(200))
    assert features.numerical.shape == (n, 9) and np.isfinite(features.numerical).all()
    without = np.isnan(got[:, 2])
    assert without.any() and (features.numerical[without, 5] == np.float32(labels[:200].mean())).all()
