"""Scoring a labelled day with an exported model: serving.predict's figures against the
trainer's on the same rows, the label passed through, the metrics file's format."""

import json
import os
import shutil

import numpy as np
import pytest

import dlrm_main
from common.json_fields import FileFieldError
from data import preprocess_criteo
from data.synthetic_criteo import write_raw_day
from harness.launch import eval_record, launch, read_log
from serving import predict
from tests.support.exported_model import MODEL_FLAGS, SPEC, raw_test_lines


def _test_day(trained, path) -> bytes:
    """The raw lines of the run's test split (the second half of the last day)."""
    lines = b"".join(raw_test_lines(trained, 10**9))
    path.write_bytes(lines)
    return lines


@pytest.mark.slow
def test_predict_scores_a_labelled_day_as_the_trainer_did(trained, tmp_path, capsys):
    source, output, metrics_path = tmp_path / "day.tsv", tmp_path / "scores.csv", tmp_path / "metrics.json"
    lines = _test_day(trained, source)
    assert (
        predict.main(
            [
                "--model",
                trained["model"],
                "--input",
                str(source),
                "--output",
                str(output),
                "--metrics_output",
                str(metrics_path),
                "--keep_columns",
                "label",
            ]
        )
        == 0
    )
    # The trainer's evaluation of the test split, from the same weights (the checkpoint exported).
    test = eval_record(trained["log"], "test")
    metrics = predict.read_predict_metrics(str(metrics_path))
    assert (metrics.rows, metrics.labelled, metrics.input, metrics.variant) == (
        test["num_samples"],
        True,
        str(source),
        "fp32",
    )
    assert metrics.auroc == pytest.approx(test["auroc"], abs=1e-5) and metrics.auroc > 0.6
    # The trainer's log loss comes from logits, predict's from the exported probabilities.
    for name in ("log_loss", "ne", "calibration"):
        assert getattr(metrics, name) == pytest.approx(test[name], rel=1e-4), name
    assert metrics.positive_rate == pytest.approx(test["positive_rate"], rel=1e-12)
    assert metrics.accuracy == pytest.approx(test["accuracy"], abs=2 / test["num_samples"])

    # The label passes through, beside the same probabilities as predict_lines gives.
    rows = output.read_text().splitlines()
    assert rows[0] == "label,probability"
    table = np.array([row.split(",") for row in rows[1:]], dtype=np.float64)
    labels = [int(line.split(b"\t", 1)[0]) for line in lines.splitlines()]
    assert table[:, 0].tolist() == labels
    np.testing.assert_allclose(table[:, 1], predict.Predictor(trained["model"]).predict_lines(lines), rtol=1e-6)

    # The summary line on stderr; the file is versioned JSON, NaN-free.
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"python -m serving.predict: {metrics.rows} rows; auroc {metrics.auroc:.6g}, ")
    assert f"unseen ids {metrics.unseen_ids}" in err[-1]
    document = json.loads(metrics_path.read_text())
    assert list(document)[0] == "version" and document["version"] == 1


@pytest.mark.slow
def test_unlabelled_lines_have_no_figures_and_no_label_to_keep(trained, tmp_path, capsys):
    source, metrics_path = tmp_path / "day.tsv", tmp_path / "metrics.json"
    lines = [line.split(b"\t", 1)[1] for line in raw_test_lines(trained, 20)]
    source.write_bytes(b"".join(lines))
    assert (
        predict.main(
            [
                "--model",
                trained["model"],
                "--input",
                str(source),
                "--output",
                str(tmp_path / "p"),
                "--metrics_output",
                str(metrics_path),
            ]
        )
        == 0
    )
    metrics = predict.read_predict_metrics(str(metrics_path))
    assert (metrics.rows, metrics.labelled, metrics.auroc, metrics.ne) == (20, False, None, None)
    capsys.readouterr()
    assert (
        predict.main(
            [
                "--model",
                trained["model"],
                "--input",
                str(source),
                "--output",
                str(tmp_path / "q"),
                "--keep_columns",
                "label",
            ]
        )
        == 2
    )
    assert capsys.readouterr().err.strip() == (
        "python -m serving.predict: error: --keep_columns label: the input lines have no label"
    )
    assert not os.path.exists(tmp_path / "q")
    assert predict.main(["--model", trained["model"], "--input", str(source), "--keep_columns", "user"]) == 2
    assert capsys.readouterr().err.strip() == (
        "python -m serving.predict: error: --keep_columns user: not a column of this model's input (it has label)"
    )


def test_metrics_file_fields_are_checked(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "model": "m",
                "variant": "fp32",
                "input": "i",
                "rows": 3,
                "labelled": True,
                "auroc": "high",
                "log_loss": 0.5,
                "accuracy": 1,
                "ne": None,
                "calibration": 1.0,
                "positive_rate": 0.3,
                "unseen_ids": 0,
                "unseen_ids_by_feature": {},
            }
        )
    )
    with pytest.raises(FileFieldError, match=f'^{path}: auroc must be a number or null, got "high"$'):
        predict.read_predict_metrics(str(path))


@pytest.mark.slow
def test_train_on_days_then_score_the_next_day_two_ways(trained, tmp_path):
    """The worked example of docs/serving.md: day 3, never trained on, preprocessed with
    the training run's vocabulary (after day 2: the trainer's data has two days at least,
    the last one its validation and test split) and scored by the trainer (--mode test,
    its second half) gives the AUROC serving.predict gives on the same raw lines."""
    new_raw = tmp_path / "days_2_3"
    new_raw.mkdir()
    shutil.copyfile(os.path.join(trained["raw"], "day_2"), new_raw / "day_0")
    write_raw_day(SPEC, str(new_raw / "day_1"), 3)
    scored = str(tmp_path / "day_3_bin")
    assert (
        preprocess_criteo.main(
            [
                "--input_dir",
                str(new_raw),
                "--output_dir",
                scored,
                "--dataset_name",
                "criteo_1t",
                "--vocabulary",
                trained["data"],
            ]
        )
        == 0
    )
    log = str(tmp_path / "test.jsonl")
    step = sorted(name for name in os.listdir(trained["ckpt"]) if name.startswith("step_"))[-1]
    assert launch(
        dlrm_main.main,
        [
            "--in_memory_binary_criteo_path",
            scored,
            "--batch_size",
            "256",
            *MODEL_FLAGS,
            "--sharding_type",
            "table_wise",
            "--mode",
            "test",
            "--log_path",
            log,
            "--restore_checkpoint_path",
            os.path.join(trained["ckpt"], step),
        ],
    ) == {0: 0, 1: 0}
    test = eval_record(read_log(log), "test")

    lines = open(new_raw / "day_1", "rb").read().splitlines(keepends=True)
    second_half = tmp_path / "second_half.tsv"
    second_half.write_bytes(b"".join(lines[len(lines) // 2 :]))
    metrics_path = tmp_path / "metrics.json"
    assert (
        predict.main(
            [
                "--model",
                trained["model"],
                "--input",
                str(second_half),
                "--output",
                str(tmp_path / "p.txt"),
                "--metrics_output",
                str(metrics_path),
            ]
        )
        == 0
    )
    metrics = predict.read_predict_metrics(str(metrics_path))
    assert metrics.rows == test["num_samples"]
    assert metrics.auroc == pytest.approx(test["auroc"], abs=1e-5) and metrics.auroc > 0.6
    assert metrics.ne == pytest.approx(test["ne"], rel=1e-4)
