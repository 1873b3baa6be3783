"""Evaluation metrics over all ranks: AUROC, log loss and accuracy."""

from typing import Dict, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchmetrics.classification import BinaryAUROC

from training.binned_auroc import BinnedAUROC


class BinaryClassificationMetrics:
    """Accumulates one evaluation's predictions on this rank; `compute` combines all ranks.

    AUROC is torchmetrics' exact BinaryAUROC, synced over the process group (it equals
    the AUROC of all ranks' data gathered). Log loss is the mean binary cross-entropy
    and accuracy thresholds the probability at 0.5. With ``auroc_bins`` the AUROC comes
    from a histogram instead (`BinnedAUROC`: fixed memory, and ``auroc_error_bound``
    beside the value).

    Example::

        metrics = BinaryClassificationMetrics(torch.device("cpu"))
        metrics.update(logits, labels)
        metrics.compute()  # {"auroc": ..., "log_loss": ..., "accuracy": ..., "num_samples": ...}
    """

    def __init__(self, device: torch.device, auroc_bins: Optional[int] = None) -> None:
        self._auroc = BinaryAUROC().to(device) if auroc_bins is None else BinnedAUROC(auroc_bins, device)
        # [sum of log loss, correct predictions, samples]
        self._sums = torch.zeros(3, dtype=torch.float64, device=device)

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        logits = logits.detach().float().reshape(-1)
        labels = labels.detach().reshape(-1)
        self._auroc.update(torch.sigmoid(logits), labels.int())
        target = labels.float()
        self._sums[0] += F.binary_cross_entropy_with_logits(logits, target, reduction="sum").double()
        self._sums[1] += ((logits >= 0).float() == target).sum().double()
        self._sums[2] += labels.numel()

    def compute(self) -> Dict[str, float]:
        """Collective: every rank must call it."""
        sums = self._sums.clone()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(sums)
        samples = int(sums[2].item())
        if samples == 0:
            return {"auroc": float("nan"), "log_loss": float("nan"), "accuracy": float("nan"),
                    "num_samples": 0}
        if isinstance(self._auroc, BinnedAUROC):
            auroc, bound = self._auroc.compute()
            extra = {"auroc_error_bound": bound}
        else:
            auroc, extra = float(self._auroc.compute().item()), {}
        return {
            "auroc": auroc,
            **extra,
            "log_loss": float(sums[0].item() / samples),
            "accuracy": float(sums[1].item() / samples),
            "num_samples": samples,
        }
