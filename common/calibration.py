"""Post-hoc calibration of click probabilities (``--calibrate platt|isotonic``), fitted
on a histogram of the validation split's logits and applied after the model.

Training fits it at each validation (training/calibration.py) and stores the fit of
the validation that made a checkpoint with that checkpoint (its meta.json); the
export applies it inside the exported model and records it in inputs.json
(serving/inference_model.py, `CalibratedProbability`). numpy only: the fit and its
file format, readable without torch.

The histogram: `HISTOGRAM_BINS` equal bins of the logit over [-`LOGIT_RANGE`,
`LOGIT_RANGE`] (logits beyond fall into the end bins), each with the (weighted)
count of negative and of positive rows.

- **platt**: p = sigmoid(slope * logit + intercept), the two parameters of the
  maximum-likelihood logistic fit on the bins' centres (Newton's method from the
  identity, slope 1 and intercept 0; no target smoothing: the splits are large).
- **isotonic**: the non-decreasing step function of the logit closest in squared
  error to the bins' positive rates, weighted by their rows: pool-adjacent-violators
  over the non-empty bins in logit order. Stored as its blocks: ``values`` (each
  block's positive rate, kept within [`MIN_PROBABILITY`, 1 - `MIN_PROBABILITY`] so
  that no log loss is infinite) and ``thresholds`` (the logit where each block but
  the first starts); a logit takes the value of the last block whose threshold is
  below it.

Example::

    calibration = fit_calibration("platt", negatives, positives, step=38)
    calibration.apply(np.array([-2.0, 0.5]))  # calibrated probabilities
"""

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common.json_fields import INTEGER, NUMBER, FileFieldError, JsonObject, Kind, one_of

CALIBRATION_METHODS = ("none", "platt", "isotonic")
LOGIT_RANGE = 16.0
HISTOGRAM_BINS = 4096
MIN_PROBABILITY = 1e-6
NEWTON_STEPS = 50

_NUMBERS = Kind(
    lambda v: (
        isinstance(v, list)
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)
    ),
    "a list of finite numbers",
)


@dataclass
class Calibration:
    """A fitted calibration (see the module docstring).

    Args:
        method: "platt" or "isotonic".
        slope, intercept: Platt's parameters (1 and 0 for isotonic).
        thresholds, values: isotonic's blocks (empty for Platt); one value more than thresholds.
        step: the training step of the validation it was fitted on.
        rows: the validation rows it was fitted on.
    """

    method: str
    step: int
    rows: int
    slope: float = 1.0
    intercept: float = 0.0
    thresholds: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """Calibrated probabilities of ``logits`` (the reference the exported model matches)."""
        z = np.asarray(logits, dtype=np.float64)
        if self.method == "platt":
            return 1.0 / (1.0 + np.exp(-(self.slope * z + self.intercept)))
        index = (np.asarray(self.thresholds)[None, :] < z.reshape(-1, 1)).sum(axis=1)
        calibrated: np.ndarray = np.asarray(self.values)[index].reshape(z.shape)
        return calibrated

    def describe(self) -> str:
        """One phrase for the console: what was fitted, on what."""
        fitted = (
            f"slope {self.slope:.4f}, intercept {self.intercept:.4f}"
            if self.method == "platt"
            else f"{len(self.values)} steps from {min(self.values):.4g} to {max(self.values):.4g}"
        )
        return f"{self.method} ({fitted}; fitted on {self.rows} validation rows at step {self.step})"

    @classmethod
    def read(cls, record: JsonObject) -> "Calibration":
        """Reads what `dataclasses.asdict` wrote; FileFieldError naming the file and field."""
        calibration = cls(
            method=record.get("method", one_of("platt", "isotonic")),
            step=record.get("step", INTEGER),
            rows=record.get("rows", INTEGER),
            slope=float(record.get("slope", NUMBER)),
            intercept=float(record.get("intercept", NUMBER)),
            thresholds=record.get("thresholds", _NUMBERS),
            values=record.get("values", _NUMBERS),
        )
        where = f"{record.path}: {record.where}"
        if calibration.method == "isotonic" and not (
            len(calibration.values) == len(calibration.thresholds) + 1
            and all(0.0 <= v <= 1.0 for v in calibration.values)
            and all(a <= b for a, b in zip(calibration.values, calibration.values[1:]))
            and all(a < b for a, b in zip(calibration.thresholds, calibration.thresholds[1:]))
        ):
            raise FileFieldError(
                f"{where}: isotonic values must be non-decreasing probabilities, one more than "
                "the increasing thresholds"
            )
        if not (math.isfinite(calibration.slope) and math.isfinite(calibration.intercept)):
            raise FileFieldError(f"{where}: slope and intercept must be finite")
        return calibration


def bin_centres() -> np.ndarray:
    """The logit at the centre of each histogram bin."""
    width = 2 * LOGIT_RANGE / HISTOGRAM_BINS
    return -LOGIT_RANGE + width * (np.arange(HISTOGRAM_BINS) + 0.5)


def pool_adjacent_violators(rates: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The weighted least-squares non-decreasing fit of ``rates`` (weights > 0): returns
    (each block's value, the index of each block's first element)."""
    values: list[float] = []
    totals: list[float] = []
    starts: list[int] = []
    for i, (rate, weight) in enumerate(zip(rates.tolist(), weights.tolist())):
        values.append(rate)
        totals.append(weight)
        starts.append(i)
        # Merge backwards while the last block breaks the order: its mean with the one before.
        while len(values) > 1 and values[-2] >= values[-1]:
            weight_sum = totals[-2] + totals[-1]
            values[-2] = (values[-2] * totals[-2] + values[-1] * totals[-1]) / weight_sum
            totals[-2] = weight_sum
            del values[-1], totals[-1], starts[-1]
    return np.array(values), np.array(starts, dtype=np.int64)


def fit_platt(centres: np.ndarray, negatives: np.ndarray, positives: np.ndarray) -> tuple[float, float]:
    """(slope, intercept) of the maximum-likelihood fit of sigmoid(slope * z + intercept)
    to rows at logits ``centres`` with those (weighted) counts; Newton's method with
    step halving, from (1, 0)."""
    rows = negatives + positives
    z = centres

    def loss(params: np.ndarray) -> float:
        s = params[0] * z + params[1]
        return float((positives * np.logaddexp(0.0, -s) + negatives * np.logaddexp(0.0, s)).sum())

    params = np.array([1.0, 0.0])
    current = loss(params)
    for _ in range(NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(-(params[0] * z + params[1])))
        residual = rows * p - positives
        gradient = np.array([(residual * z).sum(), residual.sum()])
        curvature = rows * p * (1.0 - p)
        hessian = np.array(
            [[(curvature * z * z).sum(), (curvature * z).sum()], [(curvature * z).sum(), curvature.sum()]]
        )
        try:
            step = np.linalg.solve(hessian + 1e-12 * np.eye(2), gradient)
        except np.linalg.LinAlgError:
            break
        scale = 1.0
        while scale > 1e-6:  # halve until the loss does not grow
            candidate = params - scale * step
            value = loss(candidate)
            if value <= current:
                break
            scale /= 2
        else:
            break
        params, previous, current = candidate, current, value
        if previous - current <= 1e-12 * max(1.0, abs(current)):
            break
    return float(params[0]), float(params[1])


def fit_calibration(method: str, negatives: Any, positives: Any, step: int) -> "Calibration":
    """Fits ``method`` on a logit histogram (two arrays of `HISTOGRAM_BINS` counts).

    Raises ValueError when the histogram lacks a class (nothing to calibrate against)."""
    negatives, positives = np.asarray(negatives, np.float64), np.asarray(positives, np.float64)
    rows = negatives + positives
    if positives.sum() <= 0 or negatives.sum() <= 0:
        raise ValueError("the validation split has one class only")
    count = int(round(rows.sum()))
    if method == "platt":
        slope, intercept = fit_platt(bin_centres(), negatives, positives)
        return Calibration("platt", step, count, slope=slope, intercept=intercept)
    if method != "isotonic":
        raise ValueError(f"unknown calibration {method!r}")
    filled = np.flatnonzero(rows > 0)
    values, starts = pool_adjacent_violators(positives[filled] / rows[filled], rows[filled])
    lower_edges = -LOGIT_RANGE + (2 * LOGIT_RANGE / HISTOGRAM_BINS) * filled[starts]
    # A block starts at its first bin's lower edge; the first block reaches down to -inf.
    return Calibration(
        "isotonic",
        step,
        count,
        thresholds=lower_edges[1:].tolist(),
        values=np.clip(values, MIN_PROBABILITY, 1.0 - MIN_PROBABILITY).tolist(),
    )
