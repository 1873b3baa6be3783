"""AUROC from a histogram of predictions: memory fixed by the number of bins, not the rows.

The exact AUROC (torchmetrics' BinaryAUROC) keeps every prediction and label of the
split and gathers all ranks' onto every rank. This one keeps, per rank, the count of
positive and of negative examples in each of ``bins`` equal-width bins of the
predicted probability, sums them over ranks with one all-reduce, and computes the
AUROC of the binned predictions.

Error bound: bins are ordered like the predictions, so every (positive, negative)
pair in different bins is counted exactly; only pairs in the same bin, counted as
ties (1/2) where the exact AUROC counts 0, 1/2 or 1, can differ. Hence

    |binned - exact| <= sum_b pos_b * neg_b / (2 * P * N)

computed from the same histogram and reported beside the value (``auroc_error_bound``).

With sample weights the histogram sums weights instead of counting rows: a pair
(positive i, negative j) counts w_i * w_j, P and N are the classes' weight sums, and
the bound holds as it stands. (torchmetrics' BinaryAUROC takes no weights.)
"""

import torch
import torch.distributed as dist


class BinnedAUROC:
    """Histogram AUROC over all ranks, with its bound on the distance to the exact value.

    Args:
        bins: equal-width bins of the predicted probability in [0, 1].
        device: where the histogram lives (2 x bins int64, float64 when weighted).
        weighted: ``update`` takes each row's weight.

    Example::

        auroc = BinnedAUROC(bins=1_000_000, device=torch.device("cpu"))
        auroc.update(torch.sigmoid(logits), labels)
        value, bound = auroc.compute()  # collective
    """

    def __init__(self, bins: int, device: torch.device, weighted: bool = False) -> None:
        if bins < 2:
            raise ValueError(f"bins must be at least 2, got {bins}")
        self.bins = bins
        self.weighted = weighted
        # [negatives, positives]: counts, or weight sums
        self._counts = torch.zeros(2, bins, dtype=torch.float64 if weighted else torch.int64, device=device)

    def update(self, probabilities: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None) -> None:
        """Adds a batch: probabilities in [0, 1], labels 0 or 1, and (weighted) each row's weight."""
        if (weights is not None) != self.weighted:
            raise ValueError("weights are given exactly when the AUROC is weighted")
        index = (probabilities.detach().reshape(-1) * self.bins).long().clamp_(0, self.bins - 1)
        positive = labels.detach().reshape(-1).long().clamp_(0, 1)
        amounts = torch.ones_like(index) if weights is None else weights.detach().reshape(-1).double()
        self._counts.view(-1).index_add_(0, positive * self.bins + index, amounts)

    def compute(self) -> tuple[float, float]:
        """(AUROC, error bound) over every rank's updates; NaN when a class is absent.
        Collective when a process group of several ranks is initialised."""
        counts = self._counts.clone()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(counts)
        negatives, positives = counts.double()
        total_negatives, total_positives = negatives.sum(), positives.sum()
        pairs = total_negatives * total_positives
        if pairs.item() == 0:
            return float("nan"), float("nan")
        positives_above = total_positives - positives.cumsum(0)  # in higher bins than b
        auroc = (negatives * (positives_above + 0.5 * positives)).sum() / pairs
        bound = 0.5 * (negatives * positives).sum() / pairs
        return float(auroc.item()), float(bound.item())
