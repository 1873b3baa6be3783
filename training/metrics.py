"""Evaluation metrics over all ranks: AUROC, log loss, accuracy, normalized entropy,
calibration and the positive rate."""

import math
from typing import Dict, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchmetrics.classification import BinaryAUROC

from training.binned_auroc import BinnedAUROC

# Keys of `BinaryClassificationMetrics.compute`, in the order the console prints them.
METRIC_NAMES = ("auroc", "log_loss", "accuracy", "ne", "calibration", "positive_rate")
# Weighted metrics without --auroc_bins: torchmetrics' exact AUROC takes no weights,
# so the histogram one, at 16 MB (2 x float64 per bin) and its error bound printed.
WEIGHTED_AUROC_BINS = 1_000_000


def binary_entropy(rate: float) -> float:
    """Entropy in nats of a Bernoulli(rate): the log loss of always predicting ``rate``."""
    if rate <= 0.0 or rate >= 1.0:
        return 0.0
    return -(rate * math.log(rate) + (1.0 - rate) * math.log(1.0 - rate))


class BinaryClassificationMetrics:
    """Accumulates one evaluation's predictions on this rank; `compute` combines all ranks.

    AUROC is torchmetrics' exact BinaryAUROC, synced over the process group (it equals
    the AUROC of all ranks' data gathered). Every other figure comes from sums that are
    all-reduced once, so it is exact for the whole split, not a windowed estimate:
    log loss is the mean binary cross-entropy, accuracy thresholds the probability at
    0.5, the positive rate is the split's click rate, normalized entropy (NE) is the
    log loss divided by the entropy of that click rate (below 1 beats predicting the
    click rate for every row; NaN when the split has only one class) and calibration
    is the sum of predicted probabilities over the number of clicks (1 is calibrated;
    NaN without clicks).
    With ``auroc_bins`` the AUROC comes from a histogram instead (`BinnedAUROC`: fixed
    memory, and ``auroc_error_bound`` beside the value).
    With ``weighted`` every figure weighs each row by its sample weight (``update``'s
    ``weights``): sums of w * value over the sum of w, the AUROC counting each
    (positive, negative) pair w_i * w_j (histogram AUROC, of ``WEIGHTED_AUROC_BINS``
    bins unless ``auroc_bins`` is given); ``num_samples`` still counts rows.

    Example::

        metrics = BinaryClassificationMetrics(torch.device("cpu"))
        metrics.update(logits, labels)
        metrics.compute()  # {"auroc": ..., "log_loss": ..., "ne": ..., "num_samples": ...}
    """

    def __init__(self, device: torch.device, auroc_bins: Optional[int] = None, weighted: bool = False) -> None:
        if auroc_bins is None and weighted:
            auroc_bins = WEIGHTED_AUROC_BINS
        self._auroc = (BinaryAUROC().to(device) if auroc_bins is None
                       else BinnedAUROC(auroc_bins, device, weighted))
        self.weighted = weighted
        # [sum of log loss, correct predictions, samples, sum of probabilities, clicks, sum of weights],
        # each row counting its weight (1 unweighted) but samples
        self._sums = torch.zeros(6, dtype=torch.float64, device=device)

    def update(self, logits: torch.Tensor, labels: torch.Tensor, weights: Optional[torch.Tensor] = None) -> None:
        if (weights is not None) != self.weighted:
            raise ValueError("weights are given exactly when the metrics are weighted")
        logits = logits.detach().float().reshape(-1)
        labels = labels.detach().reshape(-1)
        probabilities = torch.sigmoid(logits)
        target = labels.float()
        correct = (logits >= 0).float() == target
        self._sums[2] += labels.numel()
        if weights is None:
            self._auroc.update(probabilities, labels.int())
            self._sums[0] += F.binary_cross_entropy_with_logits(logits, target, reduction="sum").double()
            self._sums[1] += correct.sum().double()
            self._sums[3] += probabilities.double().sum()
            self._sums[4] += target.double().sum()
            self._sums[5] += labels.numel()
            return
        self._auroc.update(probabilities, labels.int(), weights)  # type: ignore[call-arg]
        w = weights.detach().reshape(-1).double()
        self._sums[0] += (w * F.binary_cross_entropy_with_logits(logits, target, reduction="none").double()).sum()
        self._sums[1] += (w * correct.double()).sum()
        self._sums[3] += (w * probabilities.double()).sum()
        self._sums[4] += (w * target.double()).sum()
        self._sums[5] += w.sum()

    def compute(self) -> Dict[str, float]:
        """Collective: every rank must call it."""
        sums = self._sums.clone()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(sums)
        log_loss_sum, correct, samples, probability_sum, clicks, weight = sums.tolist()
        if samples == 0 or weight == 0:
            return {**{name: float("nan") for name in METRIC_NAMES}, "num_samples": int(samples)}
        log_loss = log_loss_sum / weight
        positive_rate = clicks / weight
        entropy = binary_entropy(positive_rate)
        if isinstance(self._auroc, BinnedAUROC):
            auroc, bound = self._auroc.compute()
            extra = {"auroc_error_bound": bound}
        else:
            auroc, extra = float(self._auroc.compute().item()), {}
        return {
            "auroc": auroc,
            **extra,
            "log_loss": log_loss,
            "accuracy": correct / weight,
            "ne": log_loss / entropy if entropy > 0 else float("nan"),
            "calibration": probability_sum / clicks if clicks > 0 else float("nan"),
            "positive_rate": positive_rate,
            "num_samples": int(samples),
        }
