"""``python -m serving.export --format aoti``: AOTInductor packages of every precision,
loaded only with --trust_native_code and only as the manifest vouches, and the Triton
model repository beside them. One export (three compilations) per pytest run: the
`aoti_exported` fixture of tests/conftest.py."""

import hashlib
import io
import json
import os
import re
import shutil
import zipfile

import numpy as np
import pytest

from common.errors import BadInput
from serving import predict, quality_gate, serve
from serving.model_files import (
    AOTI_INPUTS_KEY,
    MANIFEST_FILE,
    TRUST_FLAG,
    NativeCodeRefused,
    package_input_columns,
    write_manifest,
)
from serving.model_inputs import PRECISIONS, aoti_file, aoti_variant, read_inputs
from serving.predict import Predictor
from serving.triton_repository import PACKAGE_NAME, TRITON_DIR, triton_model_name

pytestmark = [pytest.mark.slow, pytest.mark.native]


def criteo_rows(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Raw Criteo features: (count, 13) integers and (count, 26) hashes."""
    rng = np.random.default_rng(seed)
    return rng.integers(-2, 1000, (count, 13)), rng.integers(0, 2**32, (count, 26), dtype=np.uint64).astype(np.uint32)


def test_each_precision_has_a_package_recorded_in_inputs_and_manifest(aoti_exported):
    model = aoti_exported["model"]
    inputs = read_inputs(model)
    manifest = json.load(open(os.path.join(model, MANIFEST_FILE)))["files"]
    for precision in PRECISIONS:
        entry = inputs.variants[aoti_variant(precision)]
        assert (entry.file, entry.format) == (aoti_file(precision), "aoti")
        data = open(os.path.join(model, entry.file), "rb").read()
        assert entry.bytes == len(data)
        assert manifest[entry.file] == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        assert manifest[f"{TRITON_DIR}/{triton_model_name(precision)}/1/{PACKAGE_NAME}"] == manifest[entry.file]
        with zipfile.ZipFile(os.path.join(model, entry.file)) as archive:  # the columns loaders check
            assert package_input_columns(archive, entry.file) == {
                "dense": inputs.num_dense_features,
                "sparse": sum(inputs.sparse_hotness),
            }
    # The code-free variants are written as by the default format.
    assert {v: e.format for v, e in inputs.variants.items() if e.format != "aoti"} == {
        "fp32": "torch.export",
        "fp16": "torch.export",
        "int8": "torch.export",
    }
    print(f"export with three AOTInductor compilations: {aoti_exported['export_seconds']:.1f} s")


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_trusted_package_predicts_as_its_program(aoti_exported, precision):
    """Probabilities of the package equal the code-free variant's: within 1e-6
    (fp32: inductor's fused kernels may round the last bit differently; the quantized
    ones call the same FBGEMM kernel), at batch sizes other than the export's."""
    dense, sparse = criteo_rows(300)
    expected = Predictor(aoti_exported["model"], precision).predict(dense, sparse)
    for batch_size in (7, 300):
        got = Predictor(aoti_exported["model"], aoti_variant(precision), batch_size, trust_native_code=True).predict(
            dense, sparse
        )
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def test_without_trust_a_package_is_refused_naming_the_flag(aoti_exported, tmp_path, capsys):
    model = aoti_exported["model"]
    with pytest.raises(NativeCodeRefused, match=f"fp32.aoti.pt2 is an AOTInductor package.*pass {TRUST_FLAG}"):
        Predictor(model, "fp32_aoti")
    lines = tmp_path / "lines.tsv"
    lines.write_text("1" + "\t1" * 13 + "\ta1" * 26 + "\n")
    for main, argv in ((predict.main, ["--input", str(lines)]), (serve.main, ["--port", "0"])):
        assert main(["--model", model, "--variant", "int8_aoti", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "int8.aoti.pt2 is an AOTInductor package" in err and TRUST_FLAG in err
    # With the flag the same command runs the package.
    assert predict.main(["--model", model, "--variant", "int8_aoti", "--input", str(lines), TRUST_FLAG]) == 0
    assert 0 < float(capsys.readouterr().out.strip()) < 1


def test_the_gate_leaves_untrusted_packages_out_and_gates_trusted_ones(aoti_exported, synthetic_dir, capsys):
    model = aoti_exported["model"]
    assert quality_gate.main(["--model", model, "--data", synthetic_dir, "--limit_rows", "512"]) == 0
    out = capsys.readouterr().out
    assert "fp32_aoti" not in out.split("not gated:")[0]
    assert f"not gated: fp32_aoti, fp16_aoti, int8_aoti (AOTInductor packages, loaded only with {TRUST_FLAG})" in out
    result = quality_gate.evaluate_variants(model, synthetic_dir, 512, trust_native_code=True)
    assert set(result.auroc) == {"fp32", "fp16", "int8", "fp32_aoti", "fp16_aoti", "int8_aoti"}
    assert result.auroc["fp32_aoti"] == pytest.approx(result.auroc["fp32"], abs=1e-4)
    for precision in ("fp16", "int8"):  # compiled from the same program, the same FBGEMM kernel
        assert result.auroc[aoti_variant(precision)] == result.auroc[precision]


@pytest.mark.parametrize("change", ["flip a byte", "remove the manifest"])
def test_a_package_changed_after_export_is_refused(aoti_exported, tmp_path, change):
    """The manifest's SHA-256 is checked before the package is loaded; a package
    without a manifest to vouch for it is not loaded at all."""
    model = str(tmp_path / "model")
    shutil.copytree(aoti_exported["model"], model)
    package = os.path.join(model, aoti_file("fp32"))
    if change == "flip a byte":
        data = bytearray(open(package, "rb").read())
        data[len(data) // 2] ^= 1
        open(package, "wb").write(bytes(data))
        match = "fp32.aoti.pt2: its SHA-256 differs from the manifest's"
    else:
        os.remove(os.path.join(model, MANIFEST_FILE))
        match = "fp32.aoti.pt2: an AOTInductor package is loaded only from a model directory with its manifest.json"
    with pytest.raises(BadInput, match=match):
        Predictor(model, "fp32_aoti", trust_native_code=True)


@pytest.mark.parametrize("case", ["another model", "no record"])
def test_a_package_of_another_model_is_refused_before_its_code_runs(aoti_exported, tmp_path, capsys, case):
    """A package whose recorded input columns are not those of inputs.json (another
    model's package put in its place, or, as here, inputs.json of another model), with
    the manifest rewritten to vouch for the files, is refused in one line before it is
    loaded; so is a package that records none. Before, the first forward failed inside
    the compiled code with a C++ ``index_size`` assertion."""
    model = str(tmp_path / "model")
    shutil.copytree(aoti_exported["model"], model)
    path = os.path.join(model, aoti_file("fp32"))
    if case == "another model":  # its first feature takes two ids: 27 id columns
        inputs_path = os.path.join(model, "inputs.json")
        inputs = json.load(open(inputs_path))
        inputs["sparse_hotness"][0] = 2
        json.dump(inputs, open(inputs_path, "w"))
        message = (
            f"{path} takes inputs of 13 dense columns and 26 sparse columns, the directory's inputs.json "
            "describes 13 dense columns and 27 sparse columns: the file is another model's"
        )
    else:
        original = open(path, "rb").read()
        with zipfile.ZipFile(io.BytesIO(original)) as old, zipfile.ZipFile(path, "w") as new:
            for info in old.infolist():
                data = old.read(info)
                if info.filename.endswith("_metadata.json"):
                    data = json.dumps({k: v for k, v in json.loads(data).items() if k != AOTI_INPUTS_KEY}).encode()
                new.writestr(info, data)
        message = (
            f"{path}: an AOTInductor package that does not record its input columns (exported before "
            "packages kept them): export the checkpoint again (python -m serving.export --format aoti)"
        )
    write_manifest(model)
    lines = tmp_path / "lines.tsv"
    lines.write_text("1" + "\t1" * 13 + "\ta1" * 26 + "\n")
    assert predict.main(["--model", model, "--variant", "fp32_aoti", TRUST_FLAG, "--input", str(lines)]) == 2
    assert capsys.readouterr().err == f"python -m serving.predict: error: {message}\n"


def test_triton_config_describes_the_model_inputs(aoti_exported):
    """config.pbtxt's inputs and output: names by position, types and shapes of the
    model inputs.json describes (Triton itself does not run here)."""
    inputs = read_inputs(aoti_exported["model"])
    for precision in PRECISIONS:
        name = triton_model_name(precision)
        text = open(os.path.join(aoti_exported["model"], TRITON_DIR, name, "config.pbtxt")).read()
        assert re.search(rf'^name: "{name}"$', text, re.M) and 'platform: "torch_aoti"' in text
        assert re.search(r"^max_batch_size: 0$", text, re.M)
        tensors = re.findall(r'name: "(\w+)"\s+data_type: (\w+)\s+dims: \[ ([-\d, ]+) \]', text)
        assert tensors == [
            ("INPUT__0", "TYPE_FP32", f"-1, {inputs.num_dense_features}"),
            ("INPUT__1", "TYPE_INT64", f"-1, {sum(inputs.sparse_hotness)}"),
            ("OUTPUT__0", "TYPE_FP32", "-1"),
        ]
        package = os.path.join(aoti_exported["model"], TRITON_DIR, name, "1", PACKAGE_NAME)
        assert os.path.samefile(package, os.path.join(aoti_exported["model"], aoti_file(precision)))
