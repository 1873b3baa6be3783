"""AOTInductor packages of exported models for the C++ server's tests and bench, made
as ``python -m serving.export --format aoti`` makes them (the fp32 program of
`serving.export.export_program`, compiled by ``aoti_compile_and_package``), so that
they do not wait for that flag."""

import os
import shutil

import torch

from serving.export import export_program
from serving.inference_model import ProbabilityModel, load_checkpoint_model
from serving.model_files import MANIFEST_FILE, write_manifest
from serving.model_inputs import read_inputs

# The package's name in the model directory, where the C++ program looks for it.
AOTI_FILE = "fp32.aoti.pt2"


def with_aoti_package(model_dir: str, output: str) -> str:
    """Copies the exported ``model_dir`` to ``output`` with its fp32 model compiled as an
    AOTInductor package (`AOTI_FILE`, in the manifest); returns the package's path."""
    shutil.copytree(model_dir, output)
    inputs = read_inputs(output)
    train_model, meta = load_checkpoint_model(inputs.checkpoint)
    model = ProbabilityModel(train_model.model, meta.model.sparse_feature_names, inputs.sparse_hotness,
                             concatenated_tables=True, padded=inputs.padded).eval()
    example = (torch.zeros(4, inputs.num_dense_features), torch.zeros(4, sum(inputs.sparse_hotness), dtype=torch.int64))
    package = os.path.join(output, AOTI_FILE)
    with torch.no_grad():
        torch._inductor.aoti_compile_and_package(export_program(model, example), package_path=package)
    os.remove(os.path.join(output, MANIFEST_FILE))
    write_manifest(output)
    return package
