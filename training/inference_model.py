"""A trained model as a single-host predictor: (dense, sparse ids) -> click probability.

`ProbabilityModel` takes plain tensors, so that exported programs need no TorchRec
types at their boundary: dense features (B, num_dense) float32, already transformed,
and categorical ids (B, sum of hotness) int64, already mapped into the table ranges:
one column per feature for Criteo (raw lines have one value per feature), a fixed
number per multi-hot feature of a feature-spec data set. `load_checkpoint_model` rebuilds the
unsharded model from a (sharded) checkpoint in one process.

Example::

    model, meta = load_checkpoint_model("ckpt/step_000000100")
    probabilities = ProbabilityModel(model.model, meta["model"]["sparse_feature_names"])(dense, sparse)
"""

import json
import os
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn
from torchrec.models.dlrm import DLRMTrain
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from common.errors import BadInput
from common.manifest import ManifestEntry
from models import build_dlrm_train
from models.config import ModelConfig
from training.checkpoint import load_checkpoint, read_meta
from training.model_files import read_file


@torch.fx.wrap
def fixed_hot_features(keys: List[str], hotness: List[int], sparse: torch.Tensor) -> KeyedJaggedTensor:
    """Rows of ids (B, sum(hotness)), feature f taking hotness[f] consecutive columns,
    as a KJT (feature-major values; every bag of feature f has hotness[f] ids).

    A leaf for fx tracing, so the quantized model's TorchScript compiles it as is.
    """
    batch = sparse.shape[0]
    num_features = len(hotness)
    device = sparse.device
    if hotness == [hotness[0]] * num_features:
        # Every bag the same size (Criteo: one id each): a transpose and ranges, no
        # per-feature ops; this runs on every serving request.
        size = hotness[0]
        values = sparse.reshape(batch, num_features, size).transpose(0, 1).reshape(-1)
        lengths = torch.full([num_features * batch], size, dtype=torch.int32, device=device)
        offsets = torch.arange(num_features * batch + 1, dtype=torch.int32, device=device) * size
        return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths, offsets=offsets)
    parts: List[torch.Tensor] = []
    start = 0
    for size in hotness:
        parts.append(sparse[:, start : start + size].reshape(-1))
        start += size
    lengths = torch.repeat_interleave(torch.tensor(hotness, dtype=torch.int32, device=device), batch)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int32, device=device),
                         torch.cumsum(lengths, 0, dtype=torch.int32)])
    return KeyedJaggedTensor(keys=keys, values=torch.cat(parts), lengths=lengths, offsets=offsets)


class ProbabilityModel(nn.Module):
    """Wraps a DLRM (any interaction) to map (dense, sparse ids) to probabilities (B,).

    Args:
        dlrm: the model without its loss (``DLRMTrain.model``), plain or quantized.
        sparse_feature_names: the KJT keys, in the column order of ``sparse``.
        hotness: ids per row of each feature (default one each): feature f takes
            hotness[f] consecutive columns of ``sparse``.
    """

    def __init__(self, dlrm: nn.Module, sparse_feature_names: List[str],
                 hotness: Optional[List[int]] = None) -> None:
        super().__init__()
        self.dlrm = dlrm
        self.sparse_feature_names = list(sparse_feature_names)
        self.hotness = list(hotness) if hotness is not None else [1] * len(self.sparse_feature_names)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        logits = self.dlrm(dense, fixed_hot_features(self.sparse_feature_names, self.hotness, sparse))
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
# inputs.json "layout": what the predictor reads. Raw Criteo lines for models trained on
# Criteo's binary layout; BYO CSV rows for models trained with --dataset_path.
CRITEO_LAYOUT = "criteo_raw"
FEATURE_SPEC_LAYOUT = "feature_spec_csv"


def read_inputs(model_dir: str, manifest: Optional[Dict[str, ManifestEntry]] = None) -> Dict[str, Any]:
    """An exported model directory's inputs.json, checked against ``manifest`` (when
    given) and for the fields loaders use; BadInput naming the file otherwise."""
    path = os.path.join(model_dir, INPUTS_FILE)
    try:
        inputs = json.loads(read_file(model_dir, INPUTS_FILE, manifest))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"{path}: not an exported model's inputs description ({e})") from e
    check_inputs(inputs, path)
    return inputs


def check_inputs(inputs: Any, path: str) -> None:
    """Raises BadInput naming ``path`` and the field when inputs.json lacks a field the
    loaders use or has one of the wrong type or length."""
    def fail(field: str, expected: str) -> None:
        value = inputs.get(field) if isinstance(inputs, dict) else inputs
        raise BadInput(f"{path}: {field} must be {expected}, got {json.dumps(value)[:60]} "
                         "(not an exported model's inputs description)")

    def int_list(value: Any, length: int, minimum: int) -> bool:
        return (isinstance(value, list) and len(value) == length
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in value))

    if not isinstance(inputs, dict):
        fail("the content", "a JSON object")
    names = inputs.get("sparse_feature_names")
    if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
        fail("sparse_feature_names", "a non-empty list of names")
    count = len(names)
    dense = inputs.get("num_dense_features")
    if not (isinstance(dense, int) and not isinstance(dense, bool) and dense >= 0):
        fail("num_dense_features", "a count")
    if not int_list(inputs.get("num_embeddings_per_feature"), count, 1):
        fail("num_embeddings_per_feature", f"{count} positive integers")
    if inputs.get("sparse_hotness") is not None and not int_list(inputs["sparse_hotness"], count, 1):
        fail("sparse_hotness", f"{count} positive integers")
    if inputs.get("cardinalities") is not None and not int_list(inputs["cardinalities"], count, 0):
        fail("cardinalities", f"{count} integers")
    if inputs.get("layout", CRITEO_LAYOUT) not in (CRITEO_LAYOUT, FEATURE_SPEC_LAYOUT):
        fail("layout", f"{CRITEO_LAYOUT} or {FEATURE_SPEC_LAYOUT}")
    variants = inputs.get("variants")
    if not (isinstance(variants, dict) and variants and all(
            isinstance(v, dict) and isinstance(v.get("file"), str) and isinstance(v.get("format"), str)
            for v in variants.values())):
        fail("variants", "an object of {\"file\": ..., \"format\": ...} per variant")
    preprocessing = inputs.get("preprocessing") or {}
    if not isinstance(preprocessing, dict):
        fail("preprocessing", "an object")
    modulo = preprocessing.get("modulo_num_embeddings_per_feature")
    if modulo is not None and not int_list(modulo, count, 1):
        fail("preprocessing", f"an object whose modulo_num_embeddings_per_feature has {count} positive integers")
    if not isinstance(preprocessing.get("vocabulary") or "", str):
        fail("preprocessing", "an object whose vocabulary is a file name")
