"""Evaluation metrics over all ranks: AUROC, log loss, accuracy, normalized entropy,
calibration and the positive rate."""

from typing import Dict, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchmetrics.classification import BinaryAUROC

from common.click_metrics import summary_figures
from training.binned_auroc import BinnedAUROC

# Keys of `BinaryClassificationMetrics.compute`, in the order the console prints them.
METRIC_NAMES = ("auroc", "log_loss", "accuracy", "ne", "calibration", "positive_rate")


class BinaryClassificationMetrics:
    """Accumulates one evaluation's predictions on this rank; `compute` combines all ranks.

    AUROC is torchmetrics' exact BinaryAUROC, synced over the process group (it equals
    the AUROC of all ranks' data gathered). Every other figure comes from sums that are
    all-reduced once, so it is exact for the whole split, not a windowed estimate
    (`common.click_metrics.summary_figures` defines them: log loss, accuracy, NE,
    calibration, the positive rate).
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
        figures = summary_figures(log_loss_sum, correct, samples, probability_sum, clicks)
        if isinstance(self._auroc, BinnedAUROC):
            auroc, bound = self._auroc.compute()
            extra = {"auroc_error_bound": bound}
        else:
            auroc, extra = float(self._auroc.compute().item()), {}
        return {"auroc": auroc, **extra, **figures, "num_samples": int(samples)}
