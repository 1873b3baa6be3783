"""A trained model as a single-host predictor: (dense, sparse ids) -> click probability.

`ProbabilityModel` takes plain tensors, so that exported programs need no TorchRec
types at their boundary: dense features (B, 13) float32, already transformed, and one
categorical id per feature (B, 26) int64, already mapped into the table ranges (raw
Criteo lines have one value per feature). `load_checkpoint_model` rebuilds the
unsharded model from a (sharded) checkpoint in one process.

Example::

    model, meta = load_checkpoint_model("ckpt/step_000000100")
    probabilities = ProbabilityModel(model.model)(dense, sparse)
"""

import json
import os
from typing import Any, Dict, List, Tuple

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torchrec.models.dlrm import DLRMTrain
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from models import build_dlrm_train
from models.config import ModelConfig
from training.checkpoint import load_checkpoint, read_meta


@torch.fx.wrap
def single_hot_features(keys: List[str], sparse: torch.Tensor) -> KeyedJaggedTensor:
    """One id per feature per row, (B, F), as a KJT (feature-major values).

    A leaf for fx tracing, so the quantized model's TorchScript compiles it as is.
    """
    values = sparse.t().reshape(-1)
    return KeyedJaggedTensor(
        keys=keys,
        values=values,
        lengths=torch.ones_like(values, dtype=torch.int32),
        offsets=torch.arange(values.shape[0] + 1, dtype=torch.int32, device=values.device),
    )


class ProbabilityModel(nn.Module):
    """Wraps a DLRM (any interaction) to map (dense, sparse ids) to probabilities (B,).

    Args:
        dlrm: the model without its loss (``DLRMTrain.model``), plain or quantized.
        sparse_feature_names: the KJT keys, in the column order of ``sparse``.
    """

    def __init__(self, dlrm: nn.Module, sparse_feature_names: List[str]) -> None:
        super().__init__()
        self.dlrm = dlrm
        self.sparse_feature_names = list(sparse_feature_names)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        logits = self.dlrm(dense, single_hot_features(self.sparse_feature_names, sparse))
        return torch.sigmoid(logits.squeeze(-1))


def load_checkpoint_model(path: str) -> Tuple[DLRMTrain, Dict[str, Any]]:
    """The unsharded fp32 model of a checkpoint (any world size and plan), in eval mode,
    and the checkpoint's meta.json. Needs no process group.

    Raises CheckpointError when the checkpoint is missing, incomplete or unreadable.
    """
    meta = read_meta(path)
    model_config = ModelConfig(**meta["model"])
    # fp32 tables whatever the training precision: DCP casts fp16 weights on load, and
    # quantization starts from fp32.
    model_config.embedding_precision = "fp32"
    model = build_dlrm_train(model_config, dense_device=torch.device("cpu"), embedding_device=torch.device("cpu"))
    state = {"model": model.state_dict()}
    load_checkpoint(path, state, rank=0, restore_rng=False)
    model.load_state_dict(state["model"])
    return model.eval(), meta


INPUTS_FILE = "inputs.json"


def read_inputs(model_dir: str) -> Dict[str, Any]:
    """An exported model directory's inputs.json (ValueError naming the file otherwise)."""
    path = os.path.join(model_dir, INPUTS_FILE)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not an exported model's inputs description ({e})") from e

