"""The fp16/int8 variants as torch.export programs (``fp16.pt2``, ``int8.pt2``): loaded
code-free as fp32.pt2 is, with the probabilities the TorchScript files of earlier
exports gave; a directory exported before (``int8.pt``, TorchScript) is refused with
one line saying to export again, its fp32 program still loading."""

import json
import os
import shutil
import warnings

import numpy as np
import pytest
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen
from torchrec.fx import symbolic_trace

from serving import predict
from serving.export import QUANTIZED_DTYPES, export_model, quantized_model
from serving.inference_model import ProbabilityModel, load_checkpoint_model
from serving.model_files import MANIFEST_FILE, TORCH_EXPORT_FORMAT, TORCHSCRIPT_FORMAT, ReexportNeeded, write_manifest
from serving.model_inputs import INPUTS_FILE, program_file, read_inputs
from serving.predict import Predictor
from tests.support.exported_model import tiny_checkpoint


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("quantized")
    ckpt = tiny_checkpoint(root, "quantized")
    export_model(ckpt, str(root / "model"), list(QUANTIZED_DTYPES))
    return {"ckpt": ckpt, "model": str(root / "model")}


def torchscript_reference(ckpt: str, dtype: torch.dtype) -> torch.jit.ScriptModule:
    """The quantized model as exports before this one wrote it: fx-traced with FBGEMM's
    kernel as a leaf, then scripted."""
    train_model, meta = load_checkpoint_model(ckpt)
    model = ProbabilityModel(train_model.model, meta.model.sparse_feature_names, [1] * 26).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation notice
        return torch.jit.script(
            symbolic_trace(
                quantized_model(model, dtype), leaf_modules=[IntNBitTableBatchedEmbeddingBagsCodegen.__name__]
            )
        )


@pytest.mark.parametrize("precision", list(QUANTIZED_DTYPES))
def test_a_quantized_program_predicts_as_its_torchscript_did(exported, precision):
    """Bit for bit, on the same batch: the same FBGEMM kernel on the same quantized tables
    (another batching may round the dense layers' last bit differently)."""
    entry = read_inputs(exported["model"]).variants[precision]
    assert (entry.file, entry.format) == (program_file(precision), TORCH_EXPORT_FORMAT)
    rng = np.random.default_rng(0)
    predictor = Predictor(exported["model"], precision)  # one batch of 300: another size than the export's
    dense = rng.normal(size=(300, 13)).astype(np.float32)
    ids = predictor.ids_in_tables(rng.integers(0, 2**32, (300, 26), dtype=np.uint64).astype(np.uint32))
    got = predictor.predict_transformed(dense, ids)
    with torch.no_grad():
        expected = torchscript_reference(exported["ckpt"], QUANTIZED_DTYPES[precision])(
            torch.as_tensor(dense), torch.as_tensor(ids)
        ).numpy()
    np.testing.assert_array_equal(got, expected)


def test_a_directory_of_an_older_export_refuses_its_torchscript_variant(exported, tmp_path, capsys):
    """What an export before the programs wrote: inputs.json naming int8.pt as TorchScript."""
    model = str(tmp_path / "model")
    shutil.copytree(exported["model"], model)
    os.rename(os.path.join(model, "int8.pt2"), os.path.join(model, "int8.pt"))
    inputs_path = os.path.join(model, INPUTS_FILE)
    inputs = json.load(open(inputs_path))
    inputs["variants"]["int8"].update(file="int8.pt", format=TORCHSCRIPT_FORMAT)
    json.dump(inputs, open(inputs_path, "w"))
    os.remove(os.path.join(model, MANIFEST_FILE))
    write_manifest(model)
    with pytest.raises(ReexportNeeded, match="int8.pt: a TorchScript variant of an older export, no longer loaded"):
        Predictor(model, "int8")
    lines = tmp_path / "lines.tsv"
    lines.write_text("1" + "\t1" * 13 + "\ta1" * 26 + "\n")
    assert predict.main(["--model", model, "--variant", "int8", "--input", str(lines)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "export the checkpoint again (python -m serving.export)" in err
    assert predict.main(["--model", model, "--input", str(lines)]) == 0  # fp32 still loads
    assert 0 < float(capsys.readouterr().out.strip()) < 1
