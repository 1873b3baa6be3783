"""Serving a model trained on Parquet: inputs.json's parquet_columns record, the
predictor reading Parquet and writing Parquet, the HTTP endpoint's JSON rows, and no
train/serve skew (the predictor's probabilities and AUROC are those of the training
loader's rows through the same model)."""

import json
import os
import urllib.error
import urllib.request

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torchmetrics.functional.classification import binary_auroc

from common.json_fields import FileFieldError
from data.sources import source_for
from serving import predict, quality_gate, serve
from serving.export import export_model
from serving.model_inputs import INPUTS_FILE, PARQUET_LAYOUT, ModelInputs, ParquetPreprocessing, Variant, read_inputs
from serving.quality_gate import evaluate_variants
from tests.support.parquet_model import DAYS, MAX_BAG_SIZE, TABLE_SIZES, click_log_day, save_parquet_model


@pytest.fixture(scope="module")
def parquet_model(tmp_path_factory) -> dict:
    """`save_parquet_model`'s log and checkpoint, exported (with the int8 variant)."""
    saved = save_parquet_model(tmp_path_factory.mktemp("serve_parquet"))
    export_model(saved["ckpt"], str(saved["root"] / "model"), ["int8"], max_bag_size=MAX_BAG_SIZE)
    return {**saved, "model": str(saved["root"] / "model")}


def test_export_records_the_columns_transform_and_hashing(parquet_model):
    inputs = read_inputs(parquet_model["model"])
    assert inputs.layout == PARQUET_LAYOUT
    assert inputs.dense_feature_names == ["I1", "I2"] and inputs.sparse_feature_names == ["C1", "C2", "M1", "M2"]
    assert inputs.sparse_hotness == [1, 1, MAX_BAG_SIZE, MAX_BAG_SIZE]
    assert inputs.num_embeddings_per_feature == TABLE_SIZES
    assert inputs.preprocessing == ParquetPreprocessing(
        label="label",
        weight=None,
        dense_transform="log1p",
        id_hashing="hash",
        hash_seed=0,
        sparse_value_types=["string", "integer", "integer_list", "string_list"],
    )


def _training_test_split(parquet_model) -> tuple:
    """(probabilities, labels) of the test split as the trainer's loader hands it to
    the model (one rank), through the eager model."""
    config = parquet_model["config"]
    source = source_for(config.data)
    loader = source.loaders(source.open(), TABLE_SIZES, 0, 1)["test"]
    probabilities, labels = [], []
    with torch.no_grad():
        for batch in loader:
            logits = parquet_model["dlrm"](batch.dense_features, batch.sparse_features)
            probabilities.append(torch.sigmoid(logits.squeeze(-1)))
            labels.append(batch.labels)
    return torch.cat(probabilities), torch.cat(labels)


def test_predict_on_the_test_day_gives_the_training_loaders_probabilities_and_auroc(parquet_model, tmp_path, capsys):
    expected, labels = _training_test_split(parquet_model)
    output, metrics = str(tmp_path / "preds.parquet"), str(tmp_path / "m.json")
    assert (
        predict.main(
            [
                "--model",
                parquet_model["model"],
                "--input",
                parquet_model["test_day"],
                "--output",
                output,
                "--keep_columns",
                "user_id,label",
                "--metrics_output",
                metrics,
            ]
        )
        == 0
    )
    table = pq.read_table(output)
    assert table.schema.names == ["user_id", "label", "probability"]
    assert table.column("user_id").to_pylist() == click_log_day(2).column("user_id").to_pylist()
    np.testing.assert_allclose(table.column("probability").to_numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
    assert np.array_equal(table.column("label").to_numpy(), labels.numpy())
    written = predict.read_predict_metrics(metrics)
    assert written.rows == len(expected) == 200 and written.labelled
    assert written.auroc == pytest.approx(float(binary_auroc(expected, labels.int())), abs=1e-6)
    assert written.unseen_ids == 0
    # The quantized variant reads the same rows (bags of every length, empty and null ones).
    assert (
        predict.main(
            [
                "--model",
                parquet_model["model"],
                "--input",
                parquet_model["test_day"],
                "--output",
                str(tmp_path / "int8.parquet"),
                "--variant",
                "int8",
            ]
        )
        == 0
    )
    int8 = pq.read_table(str(tmp_path / "int8.parquet")).column("probability").to_numpy()
    assert np.abs(int8 - expected.numpy()).max() < 0.05


def _write_day(tmp_path, table: pa.Table) -> str:
    path = str(tmp_path / "day.parquet")
    pq.write_table(table, path, row_group_size=64)
    return path


def _set(table: pa.Table, name: str, values) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def _failing_predict(parquet_model, tmp_path, capsys, table: pa.Table) -> str:
    output = str(tmp_path / "preds.parquet")
    assert (
        predict.main(["--model", parquet_model["model"], "--input", _write_day(tmp_path, table), "--output", output])
        == 2
    )
    assert not os.path.exists(output) and os.listdir(tmp_path) == ["day.parquet"]  # nothing partial left
    message = capsys.readouterr().err.strip()
    assert "\n" not in message
    return message


def test_a_bad_value_is_refused_naming_file_row_group_row_and_column(parquet_model, tmp_path, capsys):
    day = click_log_day(2)
    labels = day.column("label").to_numpy().copy()
    labels[130] = 2  # row group 2 (of 64 rows), row 2: after two row groups were written
    message = _failing_predict(parquet_model, tmp_path, capsys, _set(day, "label", pa.array(labels)))
    assert message.endswith("day.parquet row group 2 row 2 column label: label 2 is not 0 or 1")


def test_a_bag_longer_than_the_export_allows_is_refused(parquet_model, tmp_path, capsys):
    day = click_log_day(2)
    bags = day.column("M2").to_pylist()
    bags[5] = [str(i) for i in range(MAX_BAG_SIZE + 1)]
    message = _failing_predict(parquet_model, tmp_path, capsys, _set(day, "M2", pa.array(bags, pa.list_(pa.string()))))
    assert message.endswith(
        f"day.parquet row group 0 row 5 column M2: a bag of {MAX_BAG_SIZE + 1} ids, more than "
        f"the {MAX_BAG_SIZE} places the model was exported with (serving.export --max_bag_size)"
    )


def test_ids_of_another_type_than_trainings_are_refused(parquet_model, tmp_path, capsys):
    day = click_log_day(2)
    as_text = pa.array([str(v) for v in day.column("C2").to_pylist()])  # "40000000280" hashes apart from 40000000280
    message = _failing_predict(parquet_model, tmp_path, capsys, _set(day, "C2", as_text))
    assert message.endswith(
        "day.parquet: column C2 holds string values, but the model was trained on "
        "integer values (they hash to other rows)"
    )


def test_unlabelled_input_and_bad_keep_columns(parquet_model, tmp_path, capsys):
    day = click_log_day(2).drop(["label"])
    path, output = _write_day(tmp_path, day), str(tmp_path / "preds.parquet")
    assert (
        predict.main(
            [
                "--model",
                parquet_model["model"],
                "--input",
                path,
                "--output",
                output,
                "--metrics_output",
                str(tmp_path / "m.json"),
            ]
        )
        == 0
    )
    assert pq.read_table(output).schema.names == ["probability"]
    assert not predict.read_predict_metrics(str(tmp_path / "m.json")).labelled
    capsys.readouterr()
    assert (
        predict.main(
            [
                "--model",
                parquet_model["model"],
                "--input",
                path,
                "--output",
                output,
                "--keep_columns",
                "user_id,session",
            ]
        )
        == 2
    )
    assert "--keep_columns session: not a column of --input" in capsys.readouterr().err
    assert predict.main(["--model", parquet_model["model"], "--input", path]) == 2
    assert "--output is needed: a model trained on Parquet writes its predictions as Parquet" in capsys.readouterr().err


def test_an_output_named_for_another_format_or_among_the_input_is_refused(parquet_model, tmp_path, capsys):
    """A Parquet model writes Parquet: ``--output x.csv`` is refused (before, it wrote
    Parquet bytes into x.csv); so is an output that is one of the input's files (through
    a glob) or inside the input directory. One line, exit 2, nothing written."""
    day = click_log_day(2)
    path = _write_day(tmp_path, day)
    before = open(path, "rb").read()
    cases = [
        (
            path,
            str(tmp_path / "x.csv"),
            f"--output {tmp_path / 'x.csv'}: a .csv name, but --output is written as "
            f"Parquet: name it {tmp_path / 'x.parquet'}",
        ),
        (
            str(tmp_path / "d*.parquet"),
            path,
            f"--output {path} is {path}, a file of --input "
            f"{tmp_path / 'd*.parquet'}: writing it would replace the input",
        ),
        (
            str(tmp_path),
            str(tmp_path / "preds.parquet"),
            f"--output {tmp_path / 'preds.parquet'} is in the --input directory {tmp_path}: it would become part of "
            "the input; write elsewhere",
        ),
    ]
    for input_path, output, message in cases:
        assert predict.main(["--model", parquet_model["model"], "--input", input_path, "--output", output]) == 2
        assert capsys.readouterr().err == f"python -m serving.predict: error: {message}\n"
        assert sorted(os.listdir(tmp_path)) == ["day.parquet"]
        assert open(path, "rb").read() == before


def test_the_quality_gate_scores_a_parquet_model_on_the_rows_data_names(parquet_model, tmp_path, capsys):
    """The gate reads the Parquet rows --data names as predict does: fp32's AUROC is the
    training loader's rows' through the eager model; --limit_rows takes the first rows."""
    expected, labels = _training_test_split(parquet_model)
    result = evaluate_variants(parquet_model["model"], parquet_model["test_day"])
    assert result.parquet and result.rows == len(labels) == 200 and set(result.auroc) == {"fp32", "int8"}
    assert result.auroc["fp32"] == pytest.approx(float(binary_auroc(expected, labels.int())), abs=1e-6)
    first = evaluate_variants(parquet_model["model"], parquet_model["test_day"], limit_rows=100)  # across row groups
    assert first.rows == 100
    assert first.auroc["fp32"] == pytest.approx(float(binary_auroc(expected[:100], labels[:100].int())), abs=1e-6)
    code = quality_gate.main(["--model", parquet_model["model"], "--data", parquet_model["test_day"]])
    out = capsys.readouterr().out
    assert out.startswith(f"--data {parquet_model['test_day']}, 200 rows:\n  AUROC fp32 {result.auroc['fp32']:.5f}\n")
    assert code == (0 if result.passed else 1) and out.endswith("passed\n" if result.passed else "")
    # Bad input: one line, exit 2.
    unlabelled = _write_day(tmp_path, click_log_day(2).drop_columns(["label"]))
    for argv, message in (
        (
            [],
            "--data is needed: a model trained on Parquet is gated on labelled Parquet rows you name "
            "(rows it was not trained on, such as the newest day held back)",
        ),
        (
            ["--data", unlabelled],
            f"--data {unlabelled}: has no label column: the gate scores labelled rows "
            "(it has I1, I2, C1, C2, M1, M2, user_id)",
        ),
    ):
        assert quality_gate.main(["--model", parquet_model["model"], *argv]) == 2
        assert capsys.readouterr().err == f"python -m serving.quality_gate: error: {message}\n"


def _post(url: str, body: bytes, query: str = "") -> tuple:
    request = urllib.request.Request(url + "/predict" + query, data=body, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_http_endpoint_scores_json_rows_as_predict_scores_parquet(parquet_model, tmp_path):
    output = str(tmp_path / "preds.parquet")
    assert (
        predict.main(["--model", parquet_model["model"], "--input", parquet_model["test_day"], "--output", output]) == 0
    )
    expected = pq.read_table(output).column("probability").to_numpy()
    rows = click_log_day(2).drop(["label"]).to_pylist()  # JSON objects keyed by column name
    body = "".join(json.dumps(row) + "\n" for row in rows[:50]).encode()
    with serve.serving_in_background(predict.Predictor(parquet_model["model"])) as (url, _):
        status, answer = _post(url, body)
        assert status == 200 and answer["unseen_ids"] == 0
        np.testing.assert_allclose(answer["probabilities"], expected[:50], rtol=1e-6, atol=1e-7)
        wrong = dict(rows[2], C2="40000000280")
        status, answer = _post(
            url, (json.dumps(rows[0]) + "\n" + json.dumps(rows[1]) + "\n" + json.dumps(wrong)).encode()
        )
        assert (status, answer["error"]) == (
            400,
            'request line 3 column C2: expected an integer id or null, got "40000000280"',
        )
        missing = {k: v for k, v in rows[0].items() if k != "I2"}
        assert _post(url, json.dumps(missing).encode()) == (
            400,
            {
                "error": "request line 1 column I2: missing (send null for a missing value, or POST to "
                "/predict?missing=null)"
            },
        )
        nulls = dict(rows[0], I1=None, C1=None, M1=None, M2=[])  # as a Parquet null: 0, empty bags
        status, answer = _post(url, json.dumps(nulls).encode())
        assert status == 200 and 0 < answer["probabilities"][0] < 1
        # Asked for explicitly, columns left out read as null: the same probability.
        left_out = {"I2": rows[0]["I2"], "C2": rows[0]["C2"], "user_id": "u"}
        assert _post(url, json.dumps(left_out).encode(), "?missing=null") == (200, answer)
        assert _post(url, json.dumps(left_out).encode(), "?missing=nul") == (
            400,
            {
                "error": "unknown query 'missing=nul': /predict takes none, or missing=null (a Parquet model's rows "
                "may leave columns out, read as null)"
            },
        )


def test_json_nested_deeper_than_a_row_is_refused_before_it_is_parsed(parquet_model):
    """A row nests two levels (an object of columns, lists of ids). A line nested
    100,000 deep made json.loads raise RecursionError: HTTP 500 and a traceback in
    the log; now 400 and one line, as any line nested deeper than a row, and the
    server goes on."""
    rows = click_log_day(2).drop(["label"]).to_pylist()
    deep = b"[" * 100_000 + b"]" * 100_000
    nested = dict(rows[1], M1=[[1, 2]], note='"[[[ in a string is text')
    message = "request line {}: JSON nested deeper than a row (2 levels: an object of columns, lists of ids)"
    with serve.serving_in_background(predict.Predictor(parquet_model["model"])) as (url, _):
        assert _post(url, deep) == (400, {"error": message.format(1)})
        assert _post(url, (json.dumps(rows[0]) + "\n").encode() + deep) == (400, {"error": message.format(2)})
        assert _post(url, (json.dumps(rows[0]) + "\n" + json.dumps(nested)).encode()) == (
            400,
            {"error": message.format(2)},
        )
        text = dict(rows[0], note='"[[[ {{{ in a string is text \\" [[[')
        status, answer = _post(url, json.dumps(text).encode())
        assert status == 200 and len(answer["probabilities"]) == 1


def _inputs(**preprocessing) -> ModelInputs:
    columns = dict(
        label="label",
        weight="w",
        dense_transform="none",
        id_hashing="modulo",
        hash_seed=7,
        sparse_value_types=["string", "integer_list"],
    )
    columns.update(preprocessing)
    return ModelInputs(
        dense_feature_names=["I1"],
        sparse_feature_names=["C1", "M1"],
        sparse_hotness=[1, 4],
        num_embeddings_per_feature=[10, 20],
        preprocessing=ParquetPreprocessing(**columns),
        data_path="s3://bucket/log",
        checkpoint="ckpt",
        step=3,
        variants={"fp32": Variant("fp32.pt2", "torch.export", 1)},
    )


def test_the_parquet_record_reads_back_as_written():
    inputs = _inputs()
    assert ModelInputs.from_json(inputs.to_json(), "inputs.json") == inputs
    columns = inputs.parquet_columns()
    assert (columns.dense, columns.sparse, columns.table_sizes, columns.weight, columns.hash_seed) == (
        ("I1",),
        ("C1", "M1"),
        (10, 20),
        None,
        7,
    )


# Lies about the record: (field, value, what the one line says).
RECORD_LIES = [
    ("sparse_value_types", ["string"], "preprocessing.sparse_value_types must be 2 of integer, string"),
    ("sparse_value_types", ["string", "float"], "preprocessing.sparse_value_types must be 2 of"),
    ("hash_seed", -1, "preprocessing.hash_seed must be an integer from 0 to 2^64 - 1"),
    ("hash_seed", True, "preprocessing.hash_seed must be an integer"),
    ("dense_transform", "exp", "preprocessing.dense_transform must be log1p or none"),
    ("id_hashing", "bloom", "preprocessing.id_hashing must be hash or modulo or zch or vocabulary"),
    # A zch model maps ids through its id map (docs/zch.md): claiming zch without one is refused.
    ("id_hashing", "zch", "preprocessing.zch_ids is given exactly when preprocessing.id_hashing is zch"),
    (
        "id_hashing",
        "vocabulary",
        "preprocessing.id_vocabulary is given exactly when preprocessing.id_hashing is vocabulary",
    ),
    ("label", "", "preprocessing.label must be a column name"),
    ("label", "C1", "column C1 is named twice"),
    ("weight", 3, "preprocessing.weight must be a column name or null"),
    ("sparse_value_types", ["string", "integer"], "sparse_hotness of M1 is 4, but its values are single integers"),
]


@pytest.mark.parametrize("field, value, message", RECORD_LIES)
def test_an_inputs_json_lying_about_its_columns_is_refused_with_one_line(field, value, message):
    document = json.loads(_inputs().to_json())
    document["preprocessing"][field] = value
    with pytest.raises(FileFieldError, match=f"^model/{INPUTS_FILE}: ") as refused:
        ModelInputs.from_json(json.dumps(document).encode(), f"model/{INPUTS_FILE}")
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.slow
def test_export_and_predict_on_the_test_day_give_the_trainers_test_auroc(tmp_path):
    """2-rank training on a day-partitioned log (tested on the last day), export, and
    predict on the last day's directory: the trainer's logged test AUROC."""
    import dlrm_main
    from harness.launch import eval_record, launch, read_log

    data = tmp_path / "log"
    for day, date in enumerate(DAYS):
        (data / f"date={date}").mkdir(parents=True)
        pq.write_table(click_log_day(day, rows=512), str(data / f"date={date}" / "part-0.parquet"), row_group_size=100)
    ckpt, log = str(tmp_path / "ckpt"), str(tmp_path / "log.jsonl")
    assert launch(
        dlrm_main.main,
        [
            "--parquet_path",
            str(data),
            "--time_column",
            "date",
            "--validation_window",
            "1d",
            "--test_window",
            "1d",
            "--dense_columns",
            "I*",
            "--sparse_columns",
            "C*,M*",
            "--num_embeddings_per_feature",
            ",".join(map(str, TABLE_SIZES)),
            "--batch_size",
            "32",
            "--embedding_dim",
            "4",
            "--dense_arch_layer_sizes",
            "8,4",
            "--over_arch_layer_sizes",
            "8,1",
            "--optimizer",
            "adagrad",
            "--learning_rate",
            "0.05",
            "--seed",
            "1",
            "--checkpoint_dir",
            ckpt,
            "--checkpoint_at_epoch_end",
            "--log_path",
            log,
        ],
    ) == {0: 0, 1: 0}
    model = str(tmp_path / "model")
    assert export_model(ckpt, model, []).layout == PARQUET_LAYOUT
    metrics = str(tmp_path / "m.json")
    assert (
        predict.main(
            [
                "--model",
                model,
                "--input",
                str(data / f"date={DAYS[-1]}"),
                "--output",
                str(tmp_path / "p.parquet"),
                "--metrics_output",
                metrics,
            ]
        )
        == 0
    )
    written, test = predict.read_predict_metrics(metrics), eval_record(read_log(log), "test")
    assert written.rows == test["num_samples"] == 512
    assert written.auroc == pytest.approx(test["auroc"], abs=1e-5)
