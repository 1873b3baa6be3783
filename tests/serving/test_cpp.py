"""serving/cpp's dlrm_predict: built once per session with the system g++ against the
torch wheel, serving the AOTInductor package of the shared trained model (exported
again with --format aoti, fp32 only: one compilation) and of a Parquet model's
(tests/support/parquet_model.py, its JSON rows hashed by the trainer's C header); its
probabilities against the Python predictor's, its refusals, and the latency bench's record."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bench.serve_cpp_latency import run as run_latency_bench
from serving.export import export_model
from serving.layouts.base import MalformedLineError
from serving.model_files import AOTI_FORMAT, MANIFEST_FILE, write_manifest
from serving.model_inputs import INPUTS_FILE, aoti_file
from serving.predict import Predictor
from tests.support.exported_model import raw_test_lines
from tests.support.parquet_model import MAX_BAG_SIZE, click_log_day, save_parquet_model

CPP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "serving", "cpp")
AOTI_FILE = aoti_file("fp32")  # the package dlrm_predict loads

pytestmark = pytest.mark.native  # make test-native (compiles the program and an AOTInductor package)


@pytest.fixture(scope="session")
def program(tmp_path_factory) -> str:
    """dlrm_predict, built by serving/cpp's Makefile into a directory of this session."""
    assert shutil.which("g++"), "g++ is missing: apt-get install g++ (the Dockerfile does)"
    build_dir = tmp_path_factory.mktemp("dlrm_predict_build")
    subprocess.run(["make", "-s", "-C", CPP_DIR, f"PYTHON={sys.executable}", f"BUILD_DIR={build_dir}"], check=True)
    return str(build_dir / "dlrm_predict")


@pytest.fixture(scope="session")
def aoti_model(trained, tmp_path_factory) -> str:
    """The shared trained model's checkpoint exported with its fp32 AOTInductor package
    (and the vocabulary of its data's frequency threshold)."""
    model = str(tmp_path_factory.mktemp("aoti") / "model")
    export_model(trained["ckpt"], model, [], fmt=AOTI_FORMAT)
    return model


def _predict(program: str, model: str, data: bytes, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([program, model, *flags], input=data, capture_output=True, timeout=120)


def _edge_lines(lines: list[bytes]) -> list[bytes]:
    """Test lines with the rare forms of each field: negative, empty and 18-digit integers,
    short, upper-case and empty hashes, a CRLF ending."""
    fields = [line.rstrip(b"\n").split(b"\t") for line in lines[:4]]
    fields[0][1], fields[0][2], fields[0][3] = b"-7", b"", b"123456789012345678"
    fields[1][14], fields[1][15], fields[1][16] = b"a1", fields[1][15].upper(), b""
    fields[2][39] = b"0" * 3 + b"F"
    return [b"\t".join(f) + b"\n" for f in fields[:3]] + [b"\t".join(fields[3]) + b"\r\n"] + lines[4:]


@pytest.mark.slow
def test_probabilities_equal_the_python_predictors(program, aoti_model, trained):
    lines = _edge_lines(raw_test_lines(trained, 1000))
    expected = Predictor(aoti_model).predict_lines(b"".join(lines))
    labelled = _predict(program, aoti_model, b"".join(lines))
    assert labelled.returncode == 0, labelled.stderr.decode()
    got = np.loadtxt(labelled.stdout.decode().splitlines(), dtype=np.float64)
    assert len(got) == 1000
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    # Without the labels (39 fields), in batches of 7 that do not divide the rows.
    unlabelled = b"".join(line.split(b"\t", 1)[1] for line in lines)
    batched = _predict(program, aoti_model, unlabelled, "--batch_size", "7", "--num_threads", "1")
    assert batched.returncode == 0, batched.stderr.decode()
    np.testing.assert_allclose(np.loadtxt(batched.stdout.decode().splitlines()), expected, rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(
    "field, value", [(0, b"2"), (5, b"1x"), (6, b"1234567890123456789"), (20, b"123456789"), (39, b"g0"), (None, None)]
)
def test_a_malformed_line_is_refused_as_the_python_predictor_refuses_it(program, aoti_model, trained, field, value):
    lines = raw_test_lines(trained, 5)
    fields = lines[3].rstrip(b"\n").split(b"\t")
    if field is None:
        del fields[-1]  # 39 fields after a labelled first line
    else:
        fields[field] = value
    lines[3] = b"\t".join(fields) + b"\n"
    with pytest.raises(MalformedLineError) as python_error:
        Predictor(aoti_model).predict_lines(b"".join(lines), source="stdin")
    result = _predict(program, aoti_model, b"".join(lines))
    assert result.returncode == 2
    assert result.stderr.decode() == f"dlrm_predict: error: {python_error.value}\n"
    assert result.stdout == b""  # the bad line's batch is refused whole


@pytest.mark.slow
def test_a_model_it_cannot_serve_is_refused_in_one_line(program, aoti_model, tmp_path):
    line = b"1" + b"\t" * 39 + b"\n"
    damaged = str(tmp_path / "damaged")
    shutil.copytree(aoti_model, damaged)
    with open(os.path.join(damaged, AOTI_FILE), "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    other_layout = str(tmp_path / "csv")
    shutil.copytree(aoti_model, other_layout)
    with open(os.path.join(other_layout, INPUTS_FILE), "rb") as f:
        inputs = json.load(f)
    inputs["layout"] = "feature_spec_csv"
    with open(os.path.join(other_layout, INPUTS_FILE), "w") as f:
        json.dump(inputs, f)
    os.remove(os.path.join(other_layout, MANIFEST_FILE))
    write_manifest(other_layout)
    # A model with history features (inputs.json version 4): no jagged inputs here.
    histories = str(tmp_path / "histories")
    shutil.copytree(aoti_model, histories)
    with open(os.path.join(histories, INPUTS_FILE), "rb") as f:
        inputs = json.load(f)
    inputs.update(version=4, histories=[{"name": "h3", "item": "cat_3", "max_history": 5}])
    with open(os.path.join(histories, INPUTS_FILE), "w") as f:
        json.dump(inputs, f)
    os.remove(os.path.join(histories, MANIFEST_FILE))
    write_manifest(histories)
    no_package = str(tmp_path / "no_package")
    shutil.copytree(aoti_model, no_package)
    os.remove(os.path.join(no_package, AOTI_FILE))
    cases = {
        damaged: f"{damaged}/{AOTI_FILE}: its SHA-256 differs from the manifest's: the file is damaged",
        other_layout: f"{other_layout}: its input layout is feature_spec_csv; dlrm_predict reads raw Criteo lines "
        "(criteo_raw) and a Parquet model's JSON rows (parquet_columns) only: serve this model with python -m "
        "serving.predict",
        no_package: f"{no_package} has no {AOTI_FILE}: export it with python -m serving.export --format aoti",
        histories: f"{histories}: a model with history features (h3); dlrm_predict does not read histories: "
        "serve it with python -m serving.predict or python -m serving.serve",
    }
    for model, message in cases.items():
        result = _predict(program, model, line)
        assert (result.returncode, result.stderr.decode(), result.stdout) == (
            2,
            f"dlrm_predict: error: {message}\n",
            b"",
        )
    bad_flag = _predict(program, aoti_model, line, "--batch_size", "0")
    assert bad_flag.stderr.decode() == "dlrm_predict: error: argument --batch_size: must be a positive integer, got 0\n"
    assert bad_flag.returncode == 2


@pytest.mark.slow
def test_the_latency_bench_records_both_servers_at_each_batch_size(program, aoti_model, trained):
    record = run_latency_bench(program, aoti_model, raw_test_lines(trained, 50), [1, 8], requests=2, num_threads=1)
    assert record["benchmark"] == "serve_cpp_latency" and record["num_threads"] == 1 and record["load_average"] >= 0
    assert [r["batch_size"] for r in record["results"]] == [1, 8]
    for r in record["results"]:
        assert r["requests"] == 2
        assert r["python_over_cpp"] == pytest.approx(r["python_ms_per_row"] / r["cpp_ms_per_row"])
        assert all(r[key] > 0 for key in ("cpp_request_p50_ms", "python_request_p50_ms", "cpp_ms_per_row"))
    json.dumps(record)  # the bench prints it as one JSON line


@pytest.fixture(scope="module")
def parquet_aoti_model(tmp_path_factory) -> str:
    """A model of a Parquet click log (its initial weights: no training) exported with its
    fp32 AOTInductor package."""
    saved = save_parquet_model(tmp_path_factory.mktemp("parquet_aoti"))
    model = str(saved["root"] / "model")
    export_model(saved["ckpt"], model, [], fmt=AOTI_FORMAT, max_bag_size=MAX_BAG_SIZE)
    return model


def _json_rows() -> list[dict]:
    """Rows of a day training never read (mostly unseen ids), and rows with the rare
    forms of each column: nulls, empty and null bags, nulls inside lists, empty,
    non-ASCII and long strings, the int64 and uint64 extremes, negative dense values."""
    rows = click_log_day(11, 60).to_pylist()
    rows[0].update(I1=None, I2=-3.5, C1=None, C2=None, M1=None, M2=[])
    rows[1].update(I1=-0.0, C1="日本-é 🙂", C2=2**64 - 1, M1=[None, 5, None, -(2**63)], M2=[None, "", "a\u0000b"])
    rows[2].update(I1=1e300, C1="", C2=-(2**63), M1=[2**63 + 5, 0], M2=["x" * 300, None])
    rows[3].update(C2=2**63, M1=[], M2=None, I2=7)
    del rows[4]["label"], rows[4]["user_id"]  # other keys are ignored, present or not
    return rows


@pytest.mark.slow
def test_parquet_json_rows_give_the_python_predictors_probabilities(program, parquet_aoti_model):
    rows = _json_rows()
    lines = [json.dumps(row, ensure_ascii=i % 2 == 0).encode() + b"\n" for i, row in enumerate(rows)]
    body = b"".join(lines[:10]) + b"\n  \n" + b"".join(lines[10:])  # a blank line is skipped
    expected = Predictor(parquet_aoti_model).predict_lines(body)
    assert len(expected) == len(rows)
    for flags in ([], ["--batch_size", "7", "--num_threads", "1"]):
        result = _predict(program, parquet_aoti_model, body, *flags)
        assert result.returncode == 0, result.stderr.decode()
        got = np.loadtxt(result.stdout.decode().splitlines(), dtype=np.float64)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"M1": list(range(MAX_BAG_SIZE + 1))},
            f"column M1: a bag of {MAX_BAG_SIZE + 1} ids, more than the {MAX_BAG_SIZE} places the model was "
            "exported with (serving.export --max_bag_size)",
        ),
        ({"C2": "40000000280"}, "column C2: expected an integer id or null"),
        ({"M2": ["a", 3]}, "column M2: expected a list of string ids, or null"),
        ({"I2": "1.5"}, "column I2: expected a number or null"),
        ({"C1": None, "I1": None, "drop": "I2"}, "column I2: missing"),
    ],
)
def test_a_bad_parquet_row_is_refused_in_one_line(program, parquet_aoti_model, change, message):
    rows = _json_rows()[:3]
    bad = dict(rows[1], **{k: v for k, v in change.items() if k != "drop"})
    bad.pop(change.get("drop", ""), None)
    body = b"".join(json.dumps(row).encode() + b"\n" for row in [rows[0], bad, rows[2]])
    with pytest.raises(MalformedLineError) as python_error:
        Predictor(parquet_aoti_model).predict_lines(body, source="stdin")
    assert str(python_error.value).startswith(f"stdin line 2 {message}")
    result = _predict(program, parquet_aoti_model, body)
    assert (result.returncode, result.stdout) == (2, b"")
    assert result.stderr.decode().startswith(f"dlrm_predict: error: stdin line 2 {message}")
    assert result.stderr.decode().count("\n") == 1
