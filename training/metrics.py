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

    Example::

        metrics = BinaryClassificationMetrics(torch.device("cpu"))
        metrics.update(logits, labels)
        metrics.compute()  # {"auroc": ..., "log_loss": ..., "ne": ..., "num_samples": ...}
    """

    def __init__(self, device: torch.device, auroc_bins: Optional[int] = None) -> None:
        self._auroc = BinaryAUROC().to(device) if auroc_bins is None else BinnedAUROC(auroc_bins, device)
        # [sum of log loss, correct predictions, samples, sum of probabilities, clicks]
        self._sums = torch.zeros(5, dtype=torch.float64, device=device)

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        logits = logits.detach().float().reshape(-1)
        labels = labels.detach().reshape(-1)
        probabilities = torch.sigmoid(logits)
        self._auroc.update(probabilities, labels.int())
        target = labels.float()
        self._sums[0] += F.binary_cross_entropy_with_logits(logits, target, reduction="sum").double()
        self._sums[1] += ((logits >= 0).float() == target).sum().double()
        self._sums[2] += labels.numel()
        self._sums[3] += probabilities.double().sum()
        self._sums[4] += target.double().sum()

    def compute(self) -> Dict[str, float]:
        """Collective: every rank must call it."""
        sums = self._sums.clone()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(sums)
        log_loss_sum, correct, samples, probability_sum, clicks = sums.tolist()
        if samples == 0:
            return {**{name: float("nan") for name in METRIC_NAMES}, "num_samples": 0}
        log_loss = log_loss_sum / samples
        positive_rate = clicks / samples
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
            "accuracy": correct / samples,
            "ne": log_loss / entropy if entropy > 0 else float("nan"),
            "calibration": probability_sum / clicks if clicks > 0 else float("nan"),
            "positive_rate": positive_rate,
            "num_samples": int(samples),
        }
