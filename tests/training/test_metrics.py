"""Evaluation metrics against a plain numpy computation over all ranks' predictions."""

import math

import numpy as np
import pytest
import torch
import torch.distributed as dist

from harness.launch import launch
from training.metrics import BinaryClassificationMetrics

ROWS = 1000


def _split(seed: int):
    """The whole split's logits and labels (unequal rank shares: ranks see 600 and 400 rows)."""
    generator = torch.Generator().manual_seed(seed)
    labels = (torch.rand(ROWS, generator=generator) < 0.3).float()
    logits = torch.randn(ROWS, generator=generator) + 1.5 * labels - 1.0
    return logits, labels


def _evaluate_on_ranks(seed: int) -> dict:
    dist.init_process_group("gloo")
    try:
        logits, labels = _split(seed)
        bounds = [0, 600, ROWS] if dist.get_world_size() == 2 else [0, ROWS]
        rank = dist.get_rank()
        metrics = BinaryClassificationMetrics(torch.device("cpu"))
        for chunk in torch.arange(bounds[rank], bounds[rank + 1]).split(128):  # several batches
            metrics.update(logits[chunk], labels[chunk])
        return metrics.compute()
    finally:
        dist.destroy_process_group()


def _numpy_reference(seed: int) -> dict:
    logits, labels = (t.double().numpy() for t in _split(seed))
    p = 1.0 / (1.0 + np.exp(-logits))
    log_loss = float(np.mean(-(labels * np.log(p) + (1 - labels) * np.log(1 - p))))
    rate = float(labels.mean())
    entropy = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    return {
        "log_loss": log_loss,
        "ne": log_loss / entropy,
        "calibration": float(p.sum() / labels.sum()),
        "positive_rate": rate,
        "accuracy": float(np.mean((p >= 0.5) == (labels == 1))),
    }


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_ne_calibration_positive_rate_equal_numpy_over_gathered_predictions(nproc):
    results = launch(_evaluate_on_ranks, 11, nproc=nproc)
    expected = _numpy_reference(11)
    assert results[0] == results[nproc - 1]  # every rank computes the split's figures
    got = results[0]
    assert got["num_samples"] == ROWS
    assert got["positive_rate"] == expected["positive_rate"]
    for key in ("log_loss", "ne", "calibration", "accuracy"):
        # float32 logits against a float64 reference
        assert math.isclose(got[key], expected[key], rel_tol=1e-6), (key, got[key], expected[key])
    assert 0.5 < got["ne"] < 1.0  # the logits carry signal: better than predicting the click rate


def test_single_class_split_has_no_ne_or_calibration():
    metrics = BinaryClassificationMetrics(torch.device("cpu"))
    metrics.update(torch.tensor([0.3, -1.0]), torch.tensor([0.0, 0.0]))
    values = metrics.compute()
    assert values["positive_rate"] == 0.0
    assert math.isnan(values["ne"]) and math.isnan(values["calibration"])
