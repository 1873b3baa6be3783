"""Whether a finished run diverged: the end-of-run half of the divergence watch.

The trainer stops at the first NaN or infinite loss (exit code 3). A run can also
end with finite but absurd figures (log loss 1.2e6, AUROC 0.5, calibration 0) that
no one would use; `diverged` names that case, and the trainer ends such a run with
exit code 4 (``EXIT_DIVERGED``) unless ``--allow_divergence`` is given.

Two tests, either enough:

- **No better than a constant predictor**, on the run's last evaluation (the test
  split, else the last validation or window): NE >= 1 *and* AUROC <= 0.5 +
  `CONSTANT_AUROC_MARGIN`, judged on `MIN_ROWS` rows or more. NE is the log loss over
  that of predicting the split's own click rate for every row, the best constant
  there is, and a constant ranks no pair (AUROC 0.5): a model no better on both
  counts learned nothing usable. Both, not either: a model that ranks well but is
  miscalibrated (AUROC 0.75, NE 1.05) is useful and is fixed by ``--calibrate``.
  On fewer rows the AUROC's own spread (0.02 or more) exceeds the margin, so a short
  test run is not judged by it. Not applied to random data (no data flag): its labels
  are coin flips, so every model is a constant predictor there.
- **An absurd loss**: NE >= `ABSURD_NE` (10) on any number of rows and any data: a
  log loss ten times the constant predictor's is no model at all (issue 37's run had
  NE 2e6).
- **The loss grew by orders of magnitude**: the mean training loss of the last
  `LOSS_WINDOW` steps is `LOSS_GROWTH_FACTOR` (100) times the first step's or more.
  The first step's loss is the model's before any update (about 0.69 from a fresh
  start); a noisy or over-fitting run moves it by a fraction, not 100-fold.

Example::

    diverged([0.69, 0.7, 52.0, 1.2e6], ("test", {"auroc": 0.5, "ne": 2e6, "num_samples": 663}), True)
    # 'training loss grew from 0.69 (first step) to 6e+05 (mean of the last 2 steps), 100 times or more; ...'
"""

from collections.abc import Sequence

# A constant predictor's AUROC is 0.5; this margin is what a model must beat it by.
# Small: about half the standard deviation of a random ranking's AUROC on 1,000 rows
# at a 25 % click rate (0.021), so that a model with any signal is never refused.
CONSTANT_AUROC_MARGIN = 0.01
# Fewer evaluated rows than this are not compared with a constant predictor: a random
# ranking's AUROC spreads by 0.02 or more there (at a 25 % click rate), above the margin.
MIN_ROWS = 1000
# NE at or above which the last evaluation is absurd whatever its rows or data.
ABSURD_NE = 10.0
# The final training loss over the first step's at which the run diverged.
LOSS_GROWTH_FACTOR = 100.0
# The final training loss is the mean of this many last steps (fewer in a short run).
LOSS_WINDOW = 10
# How far from 1 the last evaluation's calibration (predicted clicks over clicks) may be
# before the run's end warns: reasonable runs were seen from 0.88 to 1.21.
CALIBRATION_TOLERANCE = 0.1


def constant_predictor_reason(stage: str, values: dict[str, float], labels_carry_signal: bool) -> str | None:
    """Why ``values`` (an evaluation's metrics) are no better than a constant predictor's,
    or None when they are better (or not known: NaN with one class only)."""
    ne, auroc = values.get("ne", float("nan")), values.get("auroc", float("nan"))
    if ne >= ABSURD_NE:
        return (
            f"{stage} NE {ne:.4g} >= {ABSURD_NE:g}: a log loss {ne:.3g} times that of predicting the click "
            "rate for every row"
        )
    judged = labels_carry_signal and values.get("num_samples", 0) >= MIN_ROWS
    if judged and ne >= 1.0 and auroc <= 0.5 + CONSTANT_AUROC_MARGIN:  # NaN compares False: no verdict
        return (
            f"{stage} NE {ne:.4g} >= 1 and AUROC {auroc:.4f} <= {0.5 + CONSTANT_AUROC_MARGIN}: no better than "
            "predicting the click rate for every row"
        )
    return None


def loss_growth_reason(train_losses: Sequence[float]) -> str | None:
    """Why the training loss grew by orders of magnitude, or None."""
    if not train_losses:
        return None
    last = train_losses[-LOSS_WINDOW:]
    first, final = train_losses[0], sum(last) / len(last)
    if first > 0 and final >= LOSS_GROWTH_FACTOR * first:
        return (
            f"training loss grew from {first:.4g} (first step) to {final:.4g} (mean of the last {len(last)} "
            f"steps), {LOSS_GROWTH_FACTOR:g} times or more"
        )
    return None


def miscalibration_warning(stage: str, values: dict[str, float], calibrate: str) -> str | None:
    """The end-of-run warning when the last evaluation's calibration is more than
    `CALIBRATION_TOLERANCE` from 1, or None. ``calibrate``: the run's --calibrate."""
    calibration = values.get("calibration", float("nan"))
    if not abs(calibration - 1.0) > CALIBRATION_TOLERANCE:  # NaN (no clicks): no warning
        return None
    remedy = (
        f"the figures are the model's own; the export applies --calibrate {calibrate}'s fit"
        if calibrate != "none"
        else "--calibrate platt (or isotonic) fits a correction on the validation split that the export applies"
    )
    return (
        f"warning: {stage} calibration {calibration:.4f} is more than {CALIBRATION_TOLERANCE} from 1 (the "
        f"predicted click rate is {calibration:.2f} times the actual one); {remedy}"
    )


def diverged(
    train_losses: Sequence[float], final: tuple[str, dict[str, float]] | None, labels_carry_signal: bool
) -> str | None:
    """Why the run diverged (the reasons joined by "; "), or None.

    Args:
        train_losses: every training step's loss (the mean over ranks), in order.
        final: (stage, metrics) of the run's last evaluation, or None without one.
        labels_carry_signal: False for random data, where a constant predictor is the best
            (only an absurd NE counts there).
    """
    reasons = [loss_growth_reason(train_losses)]
    if final is not None:
        reasons.append(constant_predictor_reason(*final, labels_carry_signal))
    found = [r for r in reasons if r]
    return "; ".join(found) if found else None
