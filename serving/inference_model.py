"""A trained model as a single-host predictor: (dense, sparse ids) -> click probability.

`ProbabilityModel` takes plain tensors, so that exported programs need no TorchRec
types at their boundary: dense features (B, num_dense) float32, already transformed,
and categorical ids (B, sum of hotness) int64, already mapped into the table ranges:
one column per feature for Criteo (raw lines have one value per feature), a fixed
number per multi-hot feature of a feature-spec data set. `load_checkpoint_model` rebuilds the
unsharded model from a (sharded) checkpoint in one process.

Example::

    model, meta = load_checkpoint_model("ckpt/step_000000100")
    probabilities = ProbabilityModel(model.model, meta.model.sparse_feature_names)(dense, sparse)
"""

from typing import List, Optional, Tuple

import torch
from torch import nn
from torchrec.models.dlrm import DLRMTrain
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from models import build_dlrm_train
from training.checkpoint import check_stored_shapes, load_checkpoint, read_meta
from training.checkpoint_meta import CheckpointMeta


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


def load_checkpoint_model(path: str) -> Tuple[DLRMTrain, CheckpointMeta]:
    """The unsharded fp32 model of a checkpoint (any world size and plan), in eval mode,
    and the checkpoint's meta.json. Needs no process group.

    Raises CheckpointError when the checkpoint is missing, incomplete or unreadable.
    """
    meta = read_meta(path)
    model_config = meta.model
    # fp32 tables whatever the training precision: DCP casts fp16 weights on load, and
    # quantization starts from fp32.
    model_config.embedding_precision = "fp32"
    # The tables meta.json declares, checked against what is stored before any is allocated.
    on_meta = build_dlrm_train(model_config, dense_device=torch.device("meta"), embedding_device=torch.device("meta"))
    check_stored_shapes(path, {"model": on_meta.state_dict()})
    model = build_dlrm_train(model_config, dense_device=torch.device("cpu"), embedding_device=torch.device("cpu"))
    state = {"model": model.state_dict()}
    load_checkpoint(path, state, rank=0, restore_rng=False)
    model.load_state_dict(state["model"])
    return model.eval(), meta

