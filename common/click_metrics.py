"""The figures of a click-prediction evaluation, from sums over its rows: one
definition for the trainer's evaluations (training/metrics.py) and for scoring a
labelled file with an exported model (serving/predict.py).

Example::

    figures = summary_figures(log_loss_sum=40.1, correct=70, samples=100, probability_sum=24.0, clicks=25)
    figures["ne"]  # the log loss over the entropy of the click rate
"""

import math


def binary_entropy(rate: float) -> float:
    """Entropy in nats of a Bernoulli(rate): the log loss of always predicting ``rate``."""
    if rate <= 0.0 or rate >= 1.0:
        return 0.0
    return -(rate * math.log(rate) + (1.0 - rate) * math.log(1.0 - rate))


def summary_figures(
    log_loss_sum: float, correct: float, samples: float, probability_sum: float, clicks: float
) -> dict[str, float]:
    """Log loss (mean binary cross-entropy), accuracy (probability thresholded at 0.5),
    NE (the log loss over the entropy of the click rate: below 1 beats predicting the
    click rate for every row; NaN when the rows have one class only), calibration (the
    sum of predicted probabilities over the number of clicks: 1 is calibrated; NaN
    without clicks) and the positive rate (the click rate). Every figure NaN without rows."""
    if samples == 0:
        return {name: float("nan") for name in ("log_loss", "accuracy", "ne", "calibration", "positive_rate")}
    log_loss = log_loss_sum / samples
    positive_rate = clicks / samples
    entropy = binary_entropy(positive_rate)
    return {
        "log_loss": log_loss,
        "accuracy": correct / samples,
        "ne": log_loss / entropy if entropy > 0 else float("nan"),
        "calibration": probability_sum / clicks if clicks > 0 else float("nan"),
        "positive_rate": positive_rate,
    }
