"""Inference of a model trained on a feature-spec (BYO) data set: export with a
multi-hot feature, the predictor on BYO CSV rows, the quality gate on the test mapping."""

import gzip
import json
import os
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch
from torchmetrics.functional.classification import binary_auroc

import dlrm_main
from data.binary.feature_spec import FeatureSpec
from data.binary.split import SplitBinaryDataset
from data.synthetic_csv import csv_feature_spec, generate_csv
from data.transcode import transcode
from harness.launch import eval_record, launch, read_log
from serving import export, predict, serve
from serving.inference_model import ProbabilityModel, load_checkpoint_model
from serving.model_inputs import FEATURE_SPEC_LAYOUT, read_inputs
from serving.quality_gate import evaluate_variants

ROWS = {"train": 8192, "test": 1024}
TABLE_SIZES = [50, 300, 64, 300]  # cat_2's table is smaller than its ids: modulo at load and at serving


@pytest.fixture(scope="module")
def trained_byo(tmp_path_factory):
    """CSV (5 numerical, 4 categorical, cat_1 bags of 3) -> transcode -> 2-rank training
    with a checkpoint -> export."""
    root = tmp_path_factory.mktemp("inference_byo")
    csv_dir, bin_dir = str(root / "csv"), str(root / "bin")
    raw = csv_feature_spec(5, 4, cardinality="auto", hotness={1: 3})
    raw["feature_spec"]["cat_0"]["cardinality"] = 50
    spec = FeatureSpec.from_dict(raw, csv_dir, os.path.join(csv_dir, "feature_spec.yaml"), allow_auto=True)
    generate_csv(spec, csv_dir, ROWS, seed=4, auto_cardinality=300)
    transcode(csv_dir, "feature_spec.yaml", bin_dir)
    spec_path = os.path.join(bin_dir, "feature_spec.yaml")
    ckpt, log = str(root / "ckpt"), str(root / "log.jsonl")
    assert launch(
        dlrm_main.main,
        [
            "--dataset_path",
            spec_path,
            "--batch_size",
            "256",
            "--embedding_dim",
            "8",
            "--dense_arch_layer_sizes",
            "16,8",
            "--over_arch_layer_sizes",
            "16,1",
            "--num_embeddings_per_feature",
            ",".join(map(str, TABLE_SIZES)),
            "--optimizer",
            "adagrad",
            "--learning_rate",
            "0.05",
            "--seed",
            "2",
            "--checkpoint_dir",
            ckpt,
            "--checkpoint_at_epoch_end",
            "--log_path",
            log,
        ],
    ) == {0: 0, 1: 0}
    model_dir = str(root / "model")
    assert export.main(["--checkpoint", ckpt, "--output", model_dir]) == 0
    # The predictor's layout: one file, label first, then numerical values, then ids.
    parts = [
        open(os.path.join(csv_dir, "test", f"{name}.csv")).read().splitlines()
        for name in ("label", "numerical", "categorical")
    ]
    rows = [",".join(fields) for fields in zip(*parts)]
    return {"spec": spec_path, "model": model_dir, "log": read_log(log), "rows": rows, "root": root}


@pytest.mark.slow
def test_export_describes_the_csv_layout(trained_byo):
    inputs = read_inputs(trained_byo["model"])
    assert inputs.layout == FEATURE_SPEC_LAYOUT and inputs.data_path == trained_byo["spec"]
    assert inputs.sparse_hotness == [1, 3, 1, 1]
    assert inputs.num_embeddings_per_feature == TABLE_SIZES
    assert inputs.preprocessing.cardinalities == SplitBinaryDataset(trained_byo["spec"]).num_embeddings_per_feature
    assert inputs.csv_columns == (
        ["label"] + [f"num_{i}" for i in range(5)] + ["cat_0", "cat_1[0]", "cat_1[1]", "cat_1[2]", "cat_2", "cat_3"]
    )
    assert sorted(inputs.variants) == ["fp16", "fp32", "int8"]


@pytest.mark.slow
def test_predictor_on_csv_rows_matches_the_training_model(trained_byo, tmp_path):
    labelled = tmp_path / "labelled.csv"
    labelled.write_text("\n".join(trained_byo["rows"]) + "\n")
    unlabelled = tmp_path / "unlabelled.csv.gz"
    with gzip.open(unlabelled, "wt") as f:
        f.write("".join(row.split(",", 1)[1] + "\n" for row in trained_byo["rows"]))
    for source, name in ((labelled, "a.txt"), (unlabelled, "b.txt")):
        assert (
            predict.main(["--model", trained_byo["model"], "--input", str(source), "--output", str(tmp_path / name)])
            == 0
        )
    got = np.loadtxt(tmp_path / "a.txt", dtype=np.float32)
    assert len(got) == ROWS["test"]
    assert np.array_equal(got, np.loadtxt(tmp_path / "b.txt", dtype=np.float32))

    # The eager training model on the transcoded test mapping (float16 values, ids modulo the tables).
    dataset = SplitBinaryDataset(trained_byo["spec"])
    dense, sparse, labels = dataset.read(ROWS["train"], ROWS["train"] + ROWS["test"])
    ids = np.remainder(np.concatenate(sparse, axis=1).astype(np.int64), np.repeat(TABLE_SIZES, [1, 3, 1, 1]))
    inputs = read_inputs(trained_byo["model"])
    model, _ = load_checkpoint_model(inputs.checkpoint)
    with torch.no_grad():
        eager = ProbabilityModel(model.model, inputs.sparse_feature_names, inputs.sparse_hotness)(
            torch.as_tensor(dense.astype(np.float32)), torch.as_tensor(ids)
        ).numpy()
    np.testing.assert_allclose(got, eager, rtol=1e-6)  # printed with 7 digits
    predictor = predict.Predictor(trained_byo["model"])
    assert np.array_equal(predictor.predict_transformed(dense, ids), eager)  # fp32 program: exactly
    values = np.loadtxt(labelled, delimiter=",")
    assert np.array_equal(predictor.predict(values[:, 1:6], values[:, 6:]), eager)

    # The 2-rank sharded model's own test AUROC (second half of the test mapping), from its log.
    half = ROWS["test"] // 2
    test = eval_record(trained_byo["log"], "test")
    assert test["num_samples"] == half
    auroc = float(binary_auroc(torch.as_tensor(eager[half:]), torch.as_tensor(labels[half:].astype(np.int64))))
    assert auroc == pytest.approx(test["auroc"], abs=1e-5)


@pytest.mark.slow
def test_quality_gate_on_the_test_mapping(trained_byo):
    gate = evaluate_variants(trained_byo["model"])
    assert gate.rows == ROWS["test"] // 2
    assert gate.auroc["fp32"] == pytest.approx(eval_record(trained_byo["log"], "test")["auroc"], abs=1e-5)
    assert abs(gate.auroc["fp16"] - gate.auroc["fp32"]) <= 0.001
    assert abs(gate.auroc["int8"] - gate.auroc["fp32"]) <= 0.003
    assert gate.passed


@pytest.mark.slow
@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda row: row + ",7",
            "has 13 columns, expected 12 (label, 5 numerical, 6 categorical ids) as the first line",
        ),
        (
            lambda row: row.split(",", 1)[1],
            "has 11 columns, expected 12 (label, 5 numerical, 6 categorical ids) as the first line",
        ),
        (lambda row: row.replace(",", ",x", 1), "column 2 is not a number: 'x"),
        (
            lambda row: ",".join(row.split(",")[:6] + ["-1"] + row.split(",")[7:]),
            "feature 'cat_0' has id -1; ids must be integers from 0 to 2^31 - 1",
        ),
        (
            lambda row: ",".join(row.split(",")[:7] + ["2.5"] + row.split(",")[8:]),
            "feature 'cat_1' has id 2.5; ids must be integers from 0 to 2^31 - 1",
        ),
        (lambda row: "", "empty line"),
    ],
)
def test_malformed_csv_rows_name_the_line(trained_byo, tmp_path, capsys, edit, message):
    rows = trained_byo["rows"][:5]
    rows[3] = edit(rows[3])
    source = tmp_path / "in.csv"
    source.write_text("\n".join(rows) + "\n")
    output = tmp_path / "out.txt"
    assert predict.main(["--model", trained_byo["model"], "--input", str(source), "--output", str(output)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"python -m serving.predict: error: {source} line 4: {message}"), err
    assert os.listdir(tmp_path) == ["in.csv"]  # no output, not even a partial one


@pytest.mark.slow
def test_first_row_of_neither_layout(trained_byo, tmp_path, capsys):
    source = tmp_path / "in.csv"
    source.write_text("1,2,3\n" + trained_byo["rows"][0] + "\n")
    assert predict.main(["--model", trained_byo["model"], "--input", str(source)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"python -m serving.predict: error: {source} line 1: has 3 columns, expected 12 (label, 5 numerical, "
        "6 categorical ids) or 11 without the label"
    )


@pytest.mark.slow
def test_http_endpoint_takes_csv_rows(trained_byo):
    predictor = predict.Predictor(trained_byo["model"], "int8")
    body = "".join(row + "\n" for row in trained_byo["rows"][:6]).encode()
    with serve.serving_in_background(predictor, max_batch_delay_ms=0) as (base_url, _):
        url = base_url + "/predict"
        with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST")) as r:
            answer = np.array(r.read().decode().split(), dtype=np.float32)
        np.testing.assert_allclose(answer, predictor.predict_lines(body), rtol=1e-6)
        assert len(answer) == 6
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(urllib.request.Request(url, data=body + b"1,2\n", method="POST"))
        assert bad.value.code == 400
        assert json.loads(bad.value.read())["error"].startswith("request line 7: has 2 columns, expected 12")


def _with_ids(row: str, column: int, value: int) -> str:
    fields = row.split(",")
    fields[column] = str(value)
    return ",".join(fields)


CAT_0, CAT_2 = 6, 10  # their columns: the label, 5 numerical, cat_0, cat_1's 3 ids, cat_2, cat_3


@pytest.mark.slow
def test_unseen_ids_are_mapped_modulo_the_table_and_counted(trained_byo, tmp_path, capsys):
    """cat_0 (cardinality 50, table 50) and cat_2 (table 64, below its cardinality):
    ids at or above the cardinality are scored as their id modulo the table size, as
    the training loader maps every id beyond its table, and counted."""
    rows = trained_byo["rows"][:4]
    cardinality_2 = read_inputs(trained_byo["model"]).preprocessing.cardinalities[2]
    unseen = [
        _with_ids(rows[0], CAT_0, 57),
        _with_ids(rows[1], CAT_0, 50 * 40 + 3),
        _with_ids(rows[2], CAT_2, cardinality_2 + 64 * 5 + 1),
        rows[3],
    ]
    mapped = [
        _with_ids(rows[0], CAT_0, 7),
        _with_ids(rows[1], CAT_0, 3),
        _with_ids(rows[2], CAT_2, (cardinality_2 + 64 * 5 + 1) % 64),
        rows[3],
    ]
    source = tmp_path / "unseen.csv"
    source.write_text("".join(row + "\n" for row in unseen))
    output, metrics_path = tmp_path / "out.csv", tmp_path / "metrics.json"
    assert (
        predict.main(
            [
                "--model",
                trained_byo["model"],
                "--input",
                str(source),
                "--output",
                str(output),
                "--metrics_output",
                str(metrics_path),
                "--keep_columns",
                "cat_0,label",
            ]
        )
        == 0
    )
    predictor = predict.Predictor(trained_byo["model"])
    expected = predictor.predict_lines("".join(row + "\n" for row in mapped).encode())
    lines = output.read_text().splitlines()
    assert lines[0] == "cat_0,label,probability"
    table = [line.split(",") for line in lines[1:]]
    assert [fields[:2] for fields in table] == [[row.split(",")[CAT_0], row.split(",")[0]] for row in unseen]
    np.testing.assert_allclose(np.array([fields[2] for fields in table], np.float32), expected, rtol=1e-6)
    metrics = predict.read_predict_metrics(str(metrics_path))
    assert (metrics.rows, metrics.unseen_ids, metrics.unseen_ids_by_feature) == (4, 3, {"cat_0": 2, "cat_2": 1})
    assert capsys.readouterr().err.strip().endswith("; unseen ids 3 (cat_0 2, cat_2 1)")

    # Over HTTP: the same probabilities, the count in the JSON answer and in a header.
    body = source.read_bytes()
    with serve.serving_in_background(predictor, max_batch_delay_ms=0) as (base_url, _):
        request = urllib.request.Request(
            base_url + "/predict", data=body, method="POST", headers={"Accept": "application/json"}
        )
        with urllib.request.urlopen(request) as r:
            assert r.headers["content-type"] == "application/json" and r.headers["x-unseen-ids"] == "3"
            answer = json.loads(r.read())
        with urllib.request.urlopen(urllib.request.Request(base_url + "/predict", data=body, method="POST")) as r:
            assert r.headers["x-unseen-ids"] == "3"
            plain = np.array(r.read().decode().split(), dtype=np.float32)
    assert (answer["unseen_ids"], answer["unseen_ids_by_feature"]) == (3, {"cat_0": 2, "cat_2": 1})
    np.testing.assert_allclose(np.array(answer["probabilities"], np.float32), expected, rtol=1e-6)
    np.testing.assert_allclose(plain, expected, rtol=1e-6)
