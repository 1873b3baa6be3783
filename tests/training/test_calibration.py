"""--calibrate platt|isotonic: the fits against exact properties, the record in a
checkpoint's meta.json and inputs.json, the exported model against eager model then
calibration, and a training run that stores the best validation's fit."""

import json
import os

import numpy as np
import pytest
import torch

import dlrm_main
from checkpoints.directory import best_checkpoint
from checkpoints.meta import CheckpointMeta
from checkpoints.opened import read_meta
from common.calibration import (
    HISTOGRAM_BINS,
    LOGIT_RANGE,
    MIN_PROBABILITY,
    Calibration,
    bin_centres,
    fit_calibration,
    fit_platt,
    pool_adjacent_violators,
)
from common.json_fields import FileFieldError, JsonObject
from data.synthetic_criteo import SyntheticCriteoSpec, generate_synthetic_criteo
from harness.launch import read_log
from serving import export, predict
from serving.inference_model import ProbabilityModel, fixed_hot_features, load_checkpoint_model
from serving.model_inputs import read_inputs
from tests.support.exported_model import tiny_checkpoint
from training.calibration import LogitHistogram
from training.divergence import miscalibration_warning


def _histogram(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts = LogitHistogram(torch.device("cpu"))
    counts.update(torch.as_tensor(logits), torch.as_tensor(labels))
    negatives, positives = counts._counts.numpy()
    return negatives, positives


def test_pav_pools_the_violators_by_weight():
    values, starts = pool_adjacent_violators(np.array([0.1, 0.3, 0.2, 0.5]), np.ones(4))
    assert values.tolist() == pytest.approx([0.1, 0.25, 0.5]) and starts.tolist() == [0, 1, 3]
    values, starts = pool_adjacent_violators(np.array([0.6, 0.2, 0.4]), np.array([1.0, 3.0, 1.0]))
    # 0.6 (w 1) and 0.2 (w 3) pool to 0.3; then 0.4 stays above it.
    assert values.tolist() == pytest.approx([0.3, 0.4]) and starts.tolist() == [0, 2]
    already = np.array([0.1, 0.2, 0.7])
    assert pool_adjacent_violators(already, np.ones(3))[0].tolist() == already.tolist()


def test_isotonic_fit_is_monotone_and_each_step_is_its_bins_positive_rate():
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 1.5, 20_000)
    labels = (rng.random(logits.size) < 1 / (1 + np.exp(-logits))).astype(np.int64)
    negatives, positives = _histogram(logits, labels)
    fit = fit_calibration("isotonic", negatives, positives, step=7)
    assert fit.method == "isotonic" and fit.step == 7 and fit.rows == 20_000
    assert len(fit.values) == len(fit.thresholds) + 1 > 10
    assert all(a < b for a, b in zip(fit.values, fit.values[1:]))
    # Each step's value is the positive rate of the rows whose logit it covers.
    step_of_row = fit.apply(logits)
    for value in fit.values:
        rows = np.isclose(step_of_row, value)
        assert np.clip(labels[rows].mean(), MIN_PROBABILITY, 1 - MIN_PROBABILITY) == pytest.approx(value, abs=1e-12)
    # Rows ordered by logit get non-decreasing probabilities.
    assert np.all(np.diff(fit.apply(np.sort(logits))) >= 0)


def test_platt_recovers_a_known_slope_and_intercept():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, 400_000)
    labels = (rng.random(logits.size) < 1 / (1 + np.exp(-(0.6 * logits - 1.2)))).astype(np.int64)
    fit = fit_calibration("platt", *_histogram(logits, labels), step=1)
    assert fit.slope == pytest.approx(0.6, abs=0.015) and fit.intercept == pytest.approx(-1.2, abs=0.015)
    # A calibrated model (labels drawn from its own logits) is left nearly as it is.
    labels = (rng.random(logits.size) < 1 / (1 + np.exp(-logits))).astype(np.int64)
    fit = fit_calibration("platt", *_histogram(logits, labels), step=1)
    assert fit.slope == pytest.approx(1.0, abs=0.02) and fit.intercept == pytest.approx(0.0, abs=0.02)


def test_platt_is_the_likelihood_optimum_on_the_bins():
    rng = np.random.default_rng(3)
    negatives, positives = rng.integers(0, 50, HISTOGRAM_BINS) * 1.0, rng.integers(0, 20, HISTOGRAM_BINS) * 1.0
    slope, intercept = fit_platt(bin_centres(), negatives, positives)
    s = slope * bin_centres() + intercept
    p = 1 / (1 + np.exp(-s))
    residual = (negatives + positives) * p - positives  # the gradient vanishes at the optimum
    tolerance = 1e-6 * positives.sum()
    assert abs((residual * bin_centres()).sum()) < tolerance and abs(residual.sum()) < tolerance


def test_a_split_of_one_class_fits_nothing():
    with pytest.raises(ValueError, match="one class only"):
        fit_calibration("platt", np.ones(HISTOGRAM_BINS), np.zeros(HISTOGRAM_BINS), step=1)
    histogram = LogitHistogram(torch.device("cpu"))
    histogram.update(torch.zeros(4), torch.zeros(4))
    assert histogram.fit("isotonic", step=1) is None


def test_logits_beyond_the_range_land_in_the_end_bins():
    negatives, positives = _histogram(np.array([-1e9, -LOGIT_RANGE, LOGIT_RANGE, 1e9]), np.array([0, 0, 1, 1]))
    assert negatives[0] == 2 and positives[-1] == 2 and negatives.sum() + positives.sum() == 4


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c.update(method="beta"), 'calibration.method must be platt or isotonic, got "beta"'),
        (lambda c: c.update(values=[0.5, 0.2], thresholds=[0.0]), "isotonic values must be non-decreasing"),
        (lambda c: c.update(values=[0.5]), "isotonic values must be non-decreasing"),
        (lambda c: c.update(slope="1"), 'calibration.slope must be a number, got "1"'),
    ],
)
def test_a_malformed_calibration_record_is_one_line(change, message):
    record = {
        "method": "isotonic",
        "step": 3,
        "rows": 10,
        "slope": 1.0,
        "intercept": 0.0,
        "thresholds": [0.0],
        "values": [0.2, 0.5],
    }
    assert Calibration.read(JsonObject(dict(record), "m.json", "calibration")) == Calibration(
        "isotonic", 3, 10, thresholds=[0.0], values=[0.2, 0.5]
    )
    change(record)
    with pytest.raises(FileFieldError, match=message):
        Calibration.read(JsonObject(record, "m.json", "calibration"))


def test_the_end_of_a_run_warns_when_calibration_is_off_by_more_than_a_tenth():
    assert miscalibration_warning("test", {"calibration": 1.09}, "none") is None
    assert miscalibration_warning("test", {"calibration": float("nan")}, "none") is None
    warning = miscalibration_warning("test", {"calibration": 1.21}, "none")
    assert warning.startswith(
        "warning: test calibration 1.2100 is more than 0.1 from 1 (the predicted click rate "
        "is 1.21 times the actual one); --calibrate platt"
    ), warning
    assert "the export applies --calibrate isotonic's fit" in miscalibration_warning(
        "test", {"calibration": 0.88}, "isotonic"
    )


def _inputs(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(count, 13, generator=generator) * 5, torch.randint(0, 10, (count, 26), generator=generator)


@pytest.mark.parametrize("method", ["platt", "isotonic"])
def test_the_exported_model_is_the_eager_model_then_its_calibration(method, tmp_path):
    """The fit in the checkpoint's meta.json -> every exported variant applies it,
    inputs.json records it; the fp32 program equals the eager model's logits put
    through `Calibration.apply`."""
    plain, _ = load_checkpoint_model(tiny_checkpoint(tmp_path / "plain", "plain"))
    dense, sparse = _inputs(512, 0)
    names = plain.model.sparse_arch.sparse_feature_names
    with torch.no_grad():
        logits = plain.model(dense, fixed_hot_features(names, [1] * 26, sparse, False)).squeeze(-1).numpy()
    if method == "platt":
        calibration = Calibration("platt", 1, 100, slope=0.7, intercept=-0.4)
    else:  # steps inside the tiny model's logit range, on float32 values
        thresholds = np.quantile(logits, [0.2, 0.5, 0.8]).astype(np.float32).astype(float).tolist()
        calibration = Calibration("isotonic", 1, 100, thresholds=thresholds, values=[0.05, 0.2, 0.25, 0.6])
    checkpoint = tiny_checkpoint(tmp_path / "calibrated", "calibrated", calibration)
    assert read_meta(checkpoint).calibration == calibration
    model_dir = str(tmp_path / "model")
    inputs = export.export_model(checkpoint, model_dir, ["int8"])
    assert read_inputs(model_dir).calibration == calibration == inputs.calibration
    assert json.load(open(os.path.join(model_dir, "inputs.json")))["calibration"]["method"] == method

    exported = predict.Predictor(model_dir, "fp32", batch_size=512).predict_transformed(dense.numpy(), sparse.numpy())
    reference = calibration.apply(logits)
    assert np.abs(exported - reference).max() <= 1e-6
    eager = ProbabilityModel(plain.model, names, calibration=calibration)
    with torch.no_grad():
        assert np.array_equal(exported, eager(dense, sparse).numpy())
    if method == "isotonic":
        assert set(np.unique(exported).tolist()) <= set(np.float32(calibration.values).tolist())
    int8 = predict.Predictor(model_dir, "int8", batch_size=512).predict_transformed(dense.numpy(), sparse.numpy())
    assert np.mean(np.abs(int8 - reference) <= 0.02) > 0.95  # quantized tables, the same calibration after them


def test_without_calibrate_the_export_is_the_plain_sigmoid(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path, "plain")
    meta_json = json.load(open(os.path.join(checkpoint, "meta.json")))
    assert meta_json["calibration"] is None
    model_dir = str(tmp_path / "model")
    export.export_model(checkpoint, model_dir, [])
    assert read_inputs(model_dir).calibration is None
    plain, _ = load_checkpoint_model(checkpoint)
    dense, sparse = _inputs(64, 1)
    exported = predict.Predictor(model_dir, "fp32", batch_size=64).predict_transformed(dense.numpy(), sparse.numpy())
    with torch.no_grad():
        eager = ProbabilityModel(plain.model, plain.model.sparse_arch.sparse_feature_names)(dense, sparse).numpy()
    assert np.array_equal(exported, eager)


@pytest.mark.slow
def test_training_stores_the_best_validations_fit_with_its_checkpoint(tmp_path):
    data, ckpt, log = str(tmp_path / "data"), str(tmp_path / "ckpt"), str(tmp_path / "log.jsonl")
    generate_synthetic_criteo(SyntheticCriteoSpec(num_days=2, rows_per_day=4096, seed=0), data, show_progress=False)
    assert (
        dlrm_main.main(
            [
                "--in_memory_binary_criteo_path",
                data,
                "--batch_size",
                "256",
                "--optimizer",
                "adagrad",
                "--learning_rate",
                "0.05",
                "--num_embeddings",
                "1000",
                "--embedding_dim",
                "8",
                "--dense_arch_layer_sizes",
                "16,8",
                "--over_arch_layer_sizes",
                "16,1",
                "--device",
                "cpu",
                "--validation_freq_within_epoch",
                "8",
                "--calibrate",
                "platt",
                "--checkpoint_dir",
                ckpt,
                "--log_path",
                log,
            ]
        )
        == 0
    )
    records = read_log(log)
    fits = {r["step"]: r for r in records if r["event"] == "calibration"}
    validations = [r["step"] for r in records if r["event"] == "eval" and r["stage"] == "validation"]
    assert sorted(fits) == validations == [8, 16]
    best = read_meta(best_checkpoint(ckpt))
    assert best.calibration is not None and best.calibration.step == best.step
    assert best.calibration == Calibration(
        **{k: v for k, v in fits[best.step].items() if k in Calibration.__dataclass_fields__}
    )
    assert best.calibration.rows == 2048 and best.version == CheckpointMeta.version
