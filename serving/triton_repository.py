"""A model repository for Triton Inference Server's PyTorch backend, beside an export's AOTInductor packages.

``python -m serving.export --format aoti`` writes, for each AOTInductor package
(``fp32.aoti.pt2``, and ``fp16.aoti.pt2``/``int8.aoti.pt2`` with --quantize), one model::

    triton/dlrm_fp32/config.pbtxt     backend "pytorch", platform "torch_aoti", the inputs and output
    triton/dlrm_fp32/1/model.pt2      the package (a hard link to fp32.aoti.pt2)

Triton's PyTorch backend loads AOTInductor packages (PT2 archives) with ``platform:
"torch_aoti"`` from its 26.03 release on, as a feature in development; it does not yet
batch requests for them, so the configuration says ``max_batch_size: 0`` and the
batch dimension is the inputs' own first dimension (-1): a client sends whole
batches. Inputs and output are named by position (``INPUT__0`` is the model's first
argument), as the backend addresses them. Untested here: no Triton server runs on this
machine; a test checks the names, types and shapes against the directory's inputs.json.

Example::

    write_triton_model("model_dir.tmp", "fp32", "fp32.aoti.pt2", num_dense=13, num_sparse_columns=26)
"""

import os

TRITON_DIR = "triton"
MODEL_VERSION = "1"
PACKAGE_NAME = "model.pt2"


def triton_model_name(precision: str) -> str:
    """The Triton model of a precision's package (``dlrm_fp32``)."""
    return f"dlrm_{precision}"


def config_text(name: str, num_dense: int, num_sparse_columns: int, num_histories: int = 0) -> str:
    """The config.pbtxt of one model: (dense (B, num_dense) float32, sparse ids
    (B, num_sparse_columns) int64; with ``num_histories`` history features, history ids
    (N,) int64 and their lengths (B, num_histories) int64) -> probabilities (B,) float32."""
    histories = (
        f""",
  {{
    # every history id of the batch, row by row, history by history (inputs.json histories)
    name: "INPUT__2"
    data_type: TYPE_INT64
    dims: [ -1 ]
  }},
  {{
    # how many ids each history of each row holds
    name: "INPUT__3"
    data_type: TYPE_INT64
    dims: [ -1, {num_histories} ]
  }}"""
        if num_histories
        else ""
    )
    return f"""# Written by python -m serving.export --format aoti (serving/triton_repository.py).
name: "{name}"
backend: "pytorch"
platform: "torch_aoti"
default_model_name: "{PACKAGE_NAME}"
# The backend does not batch requests for AOTInductor packages yet: the batch is the inputs' first dimension.
max_batch_size: 0
input [
  {{
    # dense features, transformed as in training (inputs.json)
    name: "INPUT__0"
    data_type: TYPE_FP32
    dims: [ -1, {num_dense} ]
  }},
  {{
    # categorical ids below the table sizes, each feature in its hotness' columns (inputs.json)
    name: "INPUT__1"
    data_type: TYPE_INT64
    dims: [ -1, {num_sparse_columns} ]
  }}{histories}
]
output [
  {{
    # click probabilities
    name: "OUTPUT__0"
    data_type: TYPE_FP32
    dims: [ -1 ]
  }}
]
instance_group [ {{ kind: KIND_CPU }} ]
"""


def write_triton_model(
    directory: str, precision: str, package: str, num_dense: int, num_sparse_columns: int, num_histories: int = 0
) -> str:
    """Writes ``triton/<name>/`` under ``directory`` (the export's temporary
    directory) for the package ``package`` (a file of ``directory``); returns the
    model's name."""
    name = triton_model_name(precision)
    model_dir = os.path.join(directory, TRITON_DIR, name)
    os.makedirs(os.path.join(model_dir, MODEL_VERSION))
    with open(os.path.join(model_dir, "config.pbtxt"), "w") as f:
        f.write(config_text(name, num_dense, num_sparse_columns, num_histories))
    # The same bytes under the name Triton loads, without a second copy on disk.
    os.link(os.path.join(directory, package), os.path.join(model_dir, MODEL_VERSION, PACKAGE_NAME))
    return name
