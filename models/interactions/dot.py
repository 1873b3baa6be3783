"""DLRM's interaction, registered as "original" (the public example's name): the dot
products of every pair of vectors, the bottom MLP's output among them when the data
has numerical features.

With numerical features: torchrec's DLRM, its bottom MLP overlapped with the embedding
lookup (`OverlappedDLRM`), its interaction one batched matmul (`DotInteraction`); the
top MLP reads [dense, <v_i, v_j> for i < j]. Without: the F choose 2 dot products of
the embeddings alone (`EmbeddingDotInteraction`).
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from common.config_flags import FlagError, option
from models.interactions.registry import Interaction, register

if TYPE_CHECKING:
    import torch
    from torch import nn

    from models.config import ModelConfig
    from models.interaction import PooledSparseArch


@dataclass
class DotConfig:
    """The dot-product interaction's config: it has no sizes of its own (the embedding
    width and the number of features decide its output)."""

    def validate(self, model: "ModelConfig") -> None:
        if not model.has_dense_arch and len(model.sparse_feature_names) < 2:
            raise FlagError(f"{option(model, 'interaction_type')} original on data without numerical features "
                            f"multiplies pairs of embeddings and needs at least two categorical features, the data "
                            f"has {len(model.sparse_feature_names)}: use dcn or projection")

    def describe(self) -> str:
        return ""


def build_dot_model(model: "ModelConfig", sparse_arch: "PooledSparseArch",
                    dense_device: Optional["torch.device"]) -> "nn.Module":
    # Here, not at the top: the flags (this module) load without torch.
    from models.categorical_only import EmbeddingDotInteraction, categorical_only_dlrm
    from models.interaction import DotInteraction, OverlappedDLRM, torchrec_dlrm

    num_features = len(model.sparse_feature_names)
    if model.has_dense_arch:
        dlrm = torchrec_dlrm(OverlappedDLRM, model, sparse_arch, dense_device)
        dlrm.inter_arch = DotInteraction(num_features)
        return dlrm
    return categorical_only_dlrm(model, sparse_arch, EmbeddingDotInteraction(num_features),
                                 num_features * (num_features - 1) // 2, dense_device)


register(Interaction(name="original", model_name="DLRM", config=DotConfig, build=build_dot_model))
