"""Evaluation metrics over all ranks: AUROC, log loss, accuracy, normalized entropy,
calibration and the positive rate."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchmetrics.classification import BinaryAUROC

from common.click_metrics import summary_figures
from training.binned_auroc import BinnedAUROC

# Keys of `BinaryClassificationMetrics.compute`, in the order the console prints them.
METRIC_NAMES = ("auroc", "log_loss", "accuracy", "ne", "calibration", "positive_rate")
# Weighted metrics without --auroc_bins: torchmetrics' exact AUROC takes no weights,
# so the histogram one, at 16 MB (2 x float64 per bin) and its error bound printed.
WEIGHTED_AUROC_BINS = 1_000_000


class BinaryClassificationMetrics:
    """Accumulates one evaluation's predictions on this rank; `compute` combines all ranks.

    AUROC is torchmetrics' exact BinaryAUROC, synced over the process group (it equals
    the AUROC of all ranks' data gathered). Every other figure comes from sums that are
    all-reduced once, so it is exact for the whole split, not a windowed estimate
    (`common.click_metrics.summary_figures` defines them: log loss, accuracy, NE,
    calibration, the positive rate).
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

    def __init__(self, device: torch.device, auroc_bins: int | None = None, weighted: bool = False) -> None:
        if auroc_bins is None and weighted:
            auroc_bins = WEIGHTED_AUROC_BINS
        self._auroc = BinaryAUROC().to(device) if auroc_bins is None else BinnedAUROC(auroc_bins, device, weighted)
        self.weighted = weighted
        # [sum of log loss, correct predictions, samples, sum of probabilities, clicks, sum of weights],
        # each row counting its weight (1 unweighted) but samples
        self._sums = torch.zeros(6, dtype=torch.float64, device=device)

    def update(self, logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None) -> None:
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

    def compute(self) -> dict[str, float]:
        """Collective: every rank must call it."""
        sums = self._sums.clone()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(sums)
        log_loss_sum, correct, samples, probability_sum, clicks, weight = sums.tolist()
        if samples == 0 or weight == 0:
            return {**{name: float("nan") for name in METRIC_NAMES}, "num_samples": int(samples)}
        # Weighted sums over the weight sum (the row count when unweighted: every weight 1).
        figures = summary_figures(log_loss_sum, correct, weight, probability_sum, clicks)
        if isinstance(self._auroc, BinnedAUROC):
            auroc, bound = self._auroc.compute()
            extra = {"auroc_error_bound": bound}
        else:
            auroc, extra = float(self._auroc.compute().item()), {}
        return {"auroc": auroc, **extra, **figures, "num_samples": int(samples)}
