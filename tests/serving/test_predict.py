"""Inference: export of a sharded checkpoint, predictor on raw lines, quality gate,
--mode inference_benchmark on both entry points, the batching HTTP endpoint."""

import gzip
import hashlib
import json
import os
import pickle
import re
import shutil
import threading
import urllib.error
import urllib.request
import zipfile

import numpy as np
import pytest
import torch
from torchmetrics.functional.classification import binary_auroc

import dcnv2_main
import dlrm_main
from checkpoints.directory import checkpoint_to_load
from data.binary.criteo import CriteoBinaryDataset
from data.binary.criteo_layout import NUM_DENSE_FEATURES, NUM_SPARSE_FEATURES
from harness.launch import eval_record, launch, read_log
from serving import export, predict, quality_gate, serve
from serving.inference_model import ProbabilityModel, load_checkpoint_model
from serving.model_inputs import read_inputs
from serving.quality_gate import evaluate_variants
from tests.support.exported_model import MODEL_FLAGS, raw_test_lines
from training.flags import parse_config


def load_test_split(data: str, sizes):
    dataset = CriteoBinaryDataset(data)
    start, stop = dataset.split_ranges()["test"]
    dense, sparse, labels = dataset.read(start, stop)
    return dense, np.remainder(sparse.astype(np.int64), np.asarray(sizes)), labels.reshape(-1)


@pytest.mark.slow
def test_export_matches_the_training_model(trained):
    inputs = read_inputs(trained["model"])
    metadata = json.load(open(os.path.join(trained["data"], "metadata.json")))
    assert inputs.num_embeddings_per_feature == metadata["num_embeddings_per_feature"]
    assert inputs.sparse_feature_names == [f"cat_{i}" for i in range(NUM_SPARSE_FEATURES)]
    assert inputs.num_dense_features == NUM_DENSE_FEATURES
    assert inputs.preprocessing.vocabulary == "vocabulary.npz"
    for variant in ("fp32", "fp16", "int8"):
        entry = inputs.variants[variant]
        assert entry.bytes == os.path.getsize(os.path.join(trained["model"], entry.file)) > 0

    dense, sparse, labels = load_test_split(trained["data"], inputs.num_embeddings_per_feature)
    model, _ = load_checkpoint_model(inputs.checkpoint)
    eager_model = ProbabilityModel(model.model, inputs.sparse_feature_names)
    with torch.no_grad():
        eager = torch.cat(
            [
                eager_model(torch.as_tensor(dense[i : i + 1000]), torch.as_tensor(sparse[i : i + 1000]))
                for i in range(0, len(dense), 1000)
            ]
        ).numpy()
        whole_batch = eager_model(torch.as_tensor(dense), torch.as_tensor(sparse)).numpy()
    exported = predict.Predictor(trained["model"], "fp32", batch_size=1000).predict_transformed(dense, sparse)
    assert np.array_equal(exported, eager)  # fp32, the same batches: exactly
    # Across batch sizes the matmuls may block their sums differently: a few ulps.
    assert np.abs(exported - whole_batch).max() <= 1e-6

    # The 2-rank sharded model's own test AUROC, from the training log, on the same rows.
    test = eval_record(trained["log"], "test")
    assert test["num_samples"] == len(labels)
    auroc = float(binary_auroc(torch.as_tensor(exported), torch.as_tensor(labels.astype(np.int64))))
    assert auroc == pytest.approx(test["auroc"], abs=1e-5) and auroc > 0.6

    gate = evaluate_variants(trained["model"])
    assert gate.auroc["fp32"] == pytest.approx(auroc, abs=1e-7)
    assert abs(gate.auroc["fp16"] - auroc) <= 0.001 and abs(gate.auroc["int8"] - auroc) <= 0.003
    assert gate.passed


@pytest.mark.slow
def test_predictor_on_raw_lines_applies_the_preprocessing(trained, tmp_path, capsys):
    lines = raw_test_lines(trained, 300)
    assert any(b"\t\t" in line for line in lines)  # missing fields
    empty_line = b"0" + b"\t" * 39 + b"\n"  # every feature missing
    labelled = tmp_path / "labelled.tsv.gz"
    with gzip.open(labelled, "wb") as f:
        f.write(b"".join(lines) + empty_line)
    unlabelled = tmp_path / "unlabelled.tsv"
    unlabelled.write_bytes(b"".join(line.split(b"\t", 1)[1] for line in lines + [empty_line]))
    for source, name in ((labelled, "a.csv"), (unlabelled, "b.csv")):
        assert (
            predict.main(["--model", trained["model"], "--input", str(source), "--output", str(tmp_path / name)]) == 0
        )
    said = capsys.readouterr().out.splitlines()
    assert said == [
        f"wrote {tmp_path / name}: 301 probabilities (fp32 model {trained['model']})" for name in ("a.csv", "b.csv")
    ]
    got = np.loadtxt(tmp_path / "a.csv", dtype=np.float32)
    assert np.array_equal(got, np.loadtxt(tmp_path / "b.csv", dtype=np.float32))

    predictor = predict.Predictor(trained["model"])
    dense, sparse, _ = load_test_split(trained["data"], predictor.table_sizes)
    expected = predictor.predict_transformed(dense[:300], sparse[:300])
    np.testing.assert_allclose(got[:300], expected, rtol=1e-6)
    # A row with every feature missing: zeros in, id 0 (rare or missing) everywhere.
    np.testing.assert_allclose(
        got[300], predictor.predict(np.zeros((1, NUM_DENSE_FEATURES)), np.zeros((1, NUM_SPARSE_FEATURES)))[0], rtol=1e-6
    )


def _files(directory: str) -> dict[str, bytes]:
    return {
        os.path.join(parent, name): open(os.path.join(parent, name), "rb").read()
        for parent, _, names in os.walk(directory)
        for name in names
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "how", ["model file", "new file", "dot-dot", "directory symlink", "file symlink", "hard link", "metrics"]
)
def test_predict_refuses_an_output_that_would_change_the_model(trained, tmp_path, capsys, how):
    """An output in the model directory, under any name (``..``, a symlink to the
    directory or to one of its files, a hard link), is refused in one line, exit 2,
    the model and the output untouched. Before, ``--output MODEL/fp32.pt2`` replaced the
    program being loaded and exited 0."""
    model = trained["model"]
    lines = tmp_path / "day.tsv"
    lines.write_bytes(b"".join(raw_test_lines(trained, 3)))
    option, output = (
        "--output",
        {
            "model file": os.path.join(model, "fp32.pt2"),
            "new file": os.path.join(model, "preds.csv"),
            "dot-dot": os.path.join(model, "..", os.path.basename(model), "inputs.json"),
            "directory symlink": str(tmp_path / "alias" / "preds.csv"),
            "file symlink": str(tmp_path / "link.csv"),
            "hard link": str(tmp_path / "hard.csv"),
            "metrics": os.path.join(model, "manifest.json"),
        }[how],
    )
    if how == "directory symlink":
        os.symlink(model, tmp_path / "alias")
    elif how == "file symlink":
        os.symlink(os.path.join(model, "inputs.json"), output)
    elif how == "hard link":
        os.link(os.path.join(model, "inputs.json"), output)
    elif how == "metrics":
        option = "--metrics_output"
    before = _files(model)
    outside = {path: open(path, "rb").read() for path in [output] if os.path.exists(output)}
    assert predict.main(["--model", model, "--input", str(lines), option, output]) == 2
    why = (
        f"is {os.path.join(model, 'inputs.json')} of the --model directory (a link to it): writing it would "
        "change the model being read"
        if how == "hard link"
        else f"is in the --model directory {model}: writing it would change the model being read; write elsewhere"
    )
    assert capsys.readouterr().err == f"python -m serving.predict: error: {option} {output} {why}\n"
    assert _files(model) == before
    assert {path: open(path, "rb").read() for path in outside} == outside
    assert not os.path.exists(output + ".tmp")


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--output", "{tmp}/preds.parquet"],
            "--output {tmp}/preds.parquet: a .parquet name, but --output is written "
            "as text (one probability per line, or CSV): name it {tmp}/preds.csv",
        ),
        (
            ["--output", "{tmp}/preds.csv.gz"],
            "--output {tmp}/preds.csv.gz: a .gz name, but --output is written as "
            "text (one probability per line, or CSV): name it {tmp}/preds.csv",
        ),
        (
            ["--metrics_output", "{tmp}/m.csv"],
            "--metrics_output {tmp}/m.csv: a .csv name, but --metrics_output is written as JSON: name it {tmp}/m.json",
        ),
        (
            ["--output", "{tmp}/p.csv", "--metrics_output", "{tmp}/../{name}/p.csv"],
            "--metrics_output {tmp}/../{name}/p.csv is the --output {tmp}/p.csv: give two files",
        ),
    ],
)
def test_predict_refuses_an_output_name_that_contradicts_its_format(trained, tmp_path, capsys, flags, message):
    """A reader goes by the name: a suffix of another format than the one written is
    refused in one line, exit 2, nothing written."""
    lines = tmp_path / "day.tsv"
    lines.write_bytes(b"".join(raw_test_lines(trained, 3)))
    fill = {"tmp": str(tmp_path), "name": tmp_path.name}
    argv = [flag.format(**fill) for flag in flags]
    assert predict.main(["--model", trained["model"], "--input", str(lines), *argv]) == 2
    assert capsys.readouterr().err == f"python -m serving.predict: error: {message.format(**fill)}\n"
    assert sorted(os.listdir(tmp_path)) == ["day.tsv"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "bad_line, message",
    [
        (
            b"1\t2\t3\n",
            "line 3: expected 40 tab-separated fields (label, 13 integer, 26 categorical) or 39 "
            "without the label, found 3",
        ),
        (None, "line 3: categorical feature 4 is not a hexadecimal hash"),
    ],
)
def test_malformed_lines_name_the_line(trained, tmp_path, capsys, bad_line, message):
    good = raw_test_lines(trained, 3)
    if bad_line is None:
        fields = good[0].split(b"\t")
        fields[1 + 13 + 4] = b"zz12"
        bad_line = b"\t".join(fields)
    source = tmp_path / "in.tsv"
    source.write_bytes(good[0] + good[1] + bad_line + good[2])
    output = tmp_path / "out.csv"
    assert predict.main(["--model", trained["model"], "--input", str(source), "--output", str(output)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"python -m serving.predict: error: {source} {message}"
    assert not os.path.exists(output) and os.listdir(tmp_path) == ["in.tsv"]


def check_benchmark_record(record: dict, batch_sizes: list, world_size: int) -> None:
    assert [r["batch_size"] for r in record["results"]] == batch_sizes
    for r in record["results"]:
        assert r["global_batch_size"] == r["batch_size"] * world_size
        assert r["records_per_sec"] > 0 and 0 < r["latency_p50_ms"] <= r["latency_p90_ms"] <= r["latency_p99_ms"]


@pytest.mark.slow
def test_inference_benchmark_two_ranks_on_a_checkpoint(trained):
    log = str(trained["root"] / "bench.jsonl")
    assert launch(
        dlrm_main.main,
        [
            "--in_memory_binary_criteo_path",
            trained["data"],
            *MODEL_FLAGS,
            "--mode",
            "inference_benchmark",
            "--restore_checkpoint_path",
            checkpoint_to_load(trained["ckpt"], "--checkpoint"),
            "--inference_benchmark_batch_sizes",
            "1,64,512",
            "--inference_benchmark_iterations",
            "4",
            "--log_path",
            log,
        ],
    ) == {0: 0, 1: 0}
    records = read_log(log)
    assert not [r for r in records if r["event"] in ("train", "eval")]  # forward-only
    check_benchmark_record([r for r in records if r["event"] == "inference_benchmark"][0], [1, 64, 512], 2)


def test_inference_benchmark_dcnv2_fresh_model_prints_a_table(tmp_path, capsys):
    log = str(tmp_path / "log.jsonl")
    assert (
        dcnv2_main.main(
            [
                "--num_embeddings",
                "1000",
                "--embedding_dim",
                "16",
                "--dense_arch_layer_sizes",
                "32,16",
                "--over_arch_layer_sizes",
                "32,1",
                "--dcn_low_rank_dim",
                "8",
                "--mode",
                "inference_benchmark",
                "--inference_benchmark_iterations",
                "3",
                "--log_path",
                log,
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    table = out[out.index("batch/rank") :].splitlines()[1:4]
    assert [int(row.split()[0]) for row in table] == [1, 64, 4096]  # the default batch sizes
    for row in table:
        rate, p50, p90, p99 = (float(v.replace(",", "")) for v in row.split()[2:6])
        assert rate > 0 and 0 < p50 <= p90 <= p99
    records = read_log(log)
    # The trainer's one config record, then the benchmark's, which names its stage.
    assert [r["event"] for r in records] == ["startup", "config", "inference_benchmark"]
    assert records[1]["mode"] == "inference_benchmark" and records[2]["stage"] == "inference_benchmark"
    check_benchmark_record(records[2], [1, 64, 4096], 1)


def test_inference_benchmark_flags(capsys):
    config = parse_config(["--mode", "inference_benchmark"], "dlrm_main.py", "")
    assert config.inference_benchmark.batch_sizes == [1, 64, 4096] and config.checkpoint.restore_checkpoint_path is None
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["--mode", "inference_benchmark", "--inference_benchmark_batch_sizes", "64,0"], "dlrm_main.py", "")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "dlrm_main.py: error: --inference_benchmark_batch_sizes must be positive, got [64, 0]"
    )


@pytest.mark.slow
def test_http_endpoint_batches_concurrent_requests(trained):
    predictor = predict.Predictor(trained["model"], "int8")
    lines = raw_test_lines(trained, 40)
    bodies = [b"".join(lines[i * 5 : (i + 1) * 5]) for i in range(8)]
    answers = {}

    def post(i: int) -> None:
        with urllib.request.urlopen(urllib.request.Request(url + "/predict", data=bodies[i], method="POST")) as r:
            answers[i] = np.array(r.read().decode().split(), dtype=np.float32)

    with serve.serving_in_background(predictor, max_batch_delay_ms=200) as (url, batcher):
        threads = [threading.Thread(target=post, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, body in enumerate(bodies):
            np.testing.assert_allclose(answers[i], predictor.predict_lines(body), rtol=1e-6)
        assert max(batcher.batch_requests) > 1 and sum(batcher.batch_requests) == 8  # shared forwards
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(urllib.request.Request(url + "/predict", data=lines[0] + b"1\t2\n", method="POST"))
        assert bad.value.code == 400 and json.loads(bad.value.read())["error"].startswith("request line 2: expected 40")
        assert urllib.request.urlopen(url + "/health").read() == b"ok\n"


@pytest.mark.slow
def test_export_bad_input_is_one_line(trained, tmp_path, capsys):
    assert export.main(["--checkpoint", str(tmp_path / "nowhere"), "--output", str(tmp_path / "m")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"python -m serving.export: error: --checkpoint {tmp_path / 'nowhere'}: neither a checkpoint "
        "nor a directory holding a complete one"
    )
    assert export.main(["--checkpoint", trained["ckpt"], "--output", trained["model"]]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == []  # nothing half-written


class _CreatesFile:
    """A pickle payload that creates a file when unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return exec, (f"open({self.path!r}, 'w').close()",)


def _rewrite_member(archive: str, pattern: str, change) -> None:
    """Replaces the archive members whose name matches ``pattern`` (at the end) by ``change(bytes)``."""
    with zipfile.ZipFile(archive) as z:
        members = [(info.filename, z.read(info.filename)) for info in z.infolist()]
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as z:
        for name, data in members:
            z.writestr(name, change(data) if re.search(pattern + "$", name) else data)


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if "error" in line]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


@pytest.mark.slow
def test_model_files_are_checked_and_never_run_code(trained, tmp_path, capsys):
    """The manifest refuses damaged files by name; a crafted fp32.pt2 (whose manifest
    matches) runs nothing; missing or truncated model files and a malformed inputs.json
    are one line, exit 2, in predict, the quality gate and serve."""
    model = str(tmp_path / "model")
    shutil.copytree(trained["model"], model)
    manifest = json.load(open(os.path.join(model, "manifest.json")))["files"]
    assert sorted(manifest) == sorted(set(os.listdir(model)) - {"manifest.json"})
    lines = str(tmp_path / "lines.tsv")
    with open(lines, "w") as f:
        f.write("1" + "\t1" * 13 + "\tab" * 26 + "\n")

    def refused(*argv: str, module=predict) -> str:
        assert module.main(["--model", model, *argv]) == 2
        return _one_line(capsys.readouterr().err)

    def rewrite_manifest() -> None:  # what someone crafting the directory would do
        json.dump(
            {
                "manifest_version": 1,
                "files": {
                    n: {
                        "bytes": os.path.getsize(os.path.join(model, n)),
                        "sha256": hashlib.sha256(open(os.path.join(model, n), "rb").read()).hexdigest(),
                    }
                    for n in os.listdir(model)
                    if n != "manifest.json"
                },
            },
            open(os.path.join(model, "manifest.json"), "w"),
        )

    fp32 = os.path.join(model, "fp32.pt2")
    original = open(fp32, "rb").read()
    flipped = bytearray(original)
    flipped[len(flipped) // 2] ^= 1
    open(fp32, "wb").write(flipped)
    assert f"{fp32}: its SHA-256 differs from the manifest's" in refused("--input", lines)

    created = tmp_path / "payload_ran"
    open(fp32, "wb").write(original)
    payload = pickle.dumps(_CreatesFile(str(created)))

    def pickled_weight(config: bytes) -> bytes:
        entries = json.loads(config)
        first = next(iter(entries["config"].values()))
        first["use_pickle"] = True
        return json.dumps(entries).encode()

    _rewrite_member(fp32, "data/weights/model_weights_config.json", pickled_weight)
    _rewrite_member(fp32, "data/weights/weight_0", lambda _: payload)
    rewrite_manifest()
    assert "fp32.pt2: refused: dlrm.sparse_arch.weight is stored as a pickled object" in refused("--input", lines)
    assert not created.exists()
    open(fp32, "wb").write(original)
    _rewrite_member(
        fp32,
        "models/model.json",
        lambda d: json.dumps({**json.loads(d), "guards_code": [f"open({str(created)!r}, 'w') and True"]}).encode(),
    )
    rewrite_manifest()
    assert "fp32.pt2: refused: a guard is not a size comparison" in refused("--input", lines)
    assert not created.exists()

    int8 = os.path.join(model, "int8.pt2")
    _rewrite_member(
        int8,
        r"models/\w+\.json",
        lambda d: d.replace(b'"torch.ops.aten.linear.default"', b'"torch.ops.aten.from_file.default"', 1),
    )
    rewrite_manifest()
    line = refused("--input", lines, "--variant", "int8")
    assert "int8.pt2: refused: a graph node calls torch.ops.aten.from_file.default" in line, line

    open(fp32, "wb").write(original[: len(original) // 2])
    os.remove(os.path.join(model, "manifest.json"))  # an export made before manifests: no size to compare
    line = refused("--input", lines)
    assert f"{fp32}: not a model archive (truncated or damaged?)" in line
    os.remove(fp32)
    assert f"{fp32}: missing or unreadable" in refused("--input", lines)
    inputs = os.path.join(model, "inputs.json")
    json.dump({**json.load(open(inputs)), "num_embeddings_per_feature": [10, 20]}, open(inputs, "w"))
    assert f"{inputs}: num_embeddings_per_feature must be {NUM_SPARSE_FEATURES} positive integers" in refused(
        "--input", lines
    )
    assert f"{inputs}: num_embeddings_per_feature must be {NUM_SPARSE_FEATURES}" in refused(module=quality_gate)
    assert f"{inputs}: num_embeddings_per_feature must be {NUM_SPARSE_FEATURES}" in refused("--port", "0", module=serve)
    open(inputs, "w").write("[1, 2")
    assert f"{inputs}: not an exported model's inputs description" in refused("--input", lines)
