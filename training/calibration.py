"""Fitting ``--calibrate platt|isotonic`` on a validation pass: the histogram of the
split's logits by label over all ranks (common/calibration.py fits and stores it)."""

import torch
import torch.distributed as dist

from common.calibration import HISTOGRAM_BINS, LOGIT_RANGE, Calibration, fit_calibration


class LogitHistogram:
    """Per rank, the (weighted) count of negative and positive rows in each logit bin
    of common/calibration.py; `fit` sums them over ranks (one all-reduce) and fits.

    Example::

        histogram = LogitHistogram(torch.device("cpu"))
        histogram.update(logits, labels)
        calibration = histogram.fit("platt", step=38)  # collective
    """

    def __init__(self, device: torch.device) -> None:
        self._counts = torch.zeros(2, HISTOGRAM_BINS, dtype=torch.float64, device=device)

    def update(self, logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None) -> None:
        z = logits.detach().double().reshape(-1)
        index = ((z + LOGIT_RANGE) * (HISTOGRAM_BINS / (2 * LOGIT_RANGE))).floor().clamp_(0, HISTOGRAM_BINS - 1).long()
        positive = labels.detach().reshape(-1).long().clamp(0, 1)
        amounts = torch.ones_like(z) if weights is None else weights.detach().reshape(-1).double()
        self._counts.view(-1).index_add_(0, positive * HISTOGRAM_BINS + index, amounts)

    def fit(self, method: str, step: int) -> Calibration | None:
        """The fit over every rank's rows; None when a class is absent. Collective."""
        counts = self._counts.clone()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(counts)
        negatives, positives = counts.cpu().numpy()
        try:
            return fit_calibration(method, negatives, positives, step)
        except ValueError:  # one class only: nothing to calibrate against
            return None
