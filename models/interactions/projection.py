"""DLRM's projection interaction, registered as "projection": two MLP branches over the
concatenated vectors, their outputs read as (F1, D) and (D, F2) matrices and
multiplied (torchrec's `DLRM_Projection`).

With numerical features: torchrec's `DLRM_Projection` (the bottom MLP's output among
the vectors; the top MLP reads it and the F1 * F2 products). Without: the branches
over the F * D embedding values alone (`EmbeddingProjectionInteraction`).

The torch blocks are defined on the first build (`TorchBlocks`): the flags load this
module without torch.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from common.config_flags import FlagError, check_layer_sizes, flag, option
from models.interactions.registry import Interaction, TorchBlocks, register
from models.model_sizes import ModelSizes

if TYPE_CHECKING:
    import torch
    from torch import nn

    from models.arch import PooledSparseArch


@dataclass
class ProjectionConfig:
    """The two branches' sizes (``--interaction_type projection``)."""

    interaction_branch1_layer_sizes: list[int] = flag([2048, 2048], help="projection branch 1 sizes")
    interaction_branch2_layer_sizes: list[int] = flag([2048, 2048], help="projection branch 2 sizes")

    def validate(self, model: ModelSizes) -> None:
        for name in ("interaction_branch1_layer_sizes", "interaction_branch2_layer_sizes"):
            sizes = getattr(self, name)
            check_layer_sizes(self, name, sizes)
            if sizes[-1] % model.embedding_dim != 0:
                raise FlagError(
                    f"the last {option(self, name)} value ({sizes[-1]}) must be a multiple of "
                    f"{option(model, 'embedding_dim')} ({model.embedding_dim})"
                )

    def describe(self) -> str:
        return "branches " + " and ".join(
            "-".join(map(str, sizes))
            for sizes in (self.interaction_branch1_layer_sizes, self.interaction_branch2_layer_sizes)
        )


def build_projection_model(
    model: ModelSizes, sparse_arch: "PooledSparseArch", dense_device: Optional["torch.device"]
) -> "nn.Module":
    # Here, not at the top: the flags (this module) load without torch.
    from torchrec.models.dlrm import DenseArch, DLRM_Projection

    from models.arch import categorical_only_dlrm, torchrec_dlrm

    projection: ProjectionConfig = model.interaction
    branch1, branch2 = projection.interaction_branch1_layer_sizes, projection.interaction_branch2_layer_sizes
    if model.has_dense_arch:
        return torchrec_dlrm(
            DLRM_Projection,
            model,
            sparse_arch,
            dense_device,
            interaction_branch1_layer_sizes=branch1,
            interaction_branch2_layer_sizes=branch2,
        )
    dim = model.embedding_dim
    width = len(model.sparse_feature_names) * dim
    inter_arch = blocks().EmbeddingProjectionInteraction(
        DenseArch(width, branch1, dense_device), DenseArch(width, branch2, dense_device), dim
    )
    return categorical_only_dlrm(
        model, sparse_arch, inter_arch, (branch1[-1] // dim) * (branch2[-1] // dim), dense_device
    )


register(
    Interaction(name="projection", model_name="DLRM-projection", config=ProjectionConfig, build=build_projection_model)
)


def define_blocks() -> dict[str, Any]:
    """The block of the model without numerical features (`TorchBlocks` runs this once)."""
    import torch
    from torch import nn

    class EmbeddingProjectionInteraction(nn.Module):
        """The projection interaction over the concatenated embeddings: branch 1's output
        as (F1, D) times branch 2's as (D, F2), flattened: (B, F1 * F2).

        Args:
            interaction_branch1, interaction_branch2: MLPs from F * D features to a
                multiple of D.
            embedding_dim: D.
        """

        def __init__(self, interaction_branch1: nn.Module, interaction_branch2: nn.Module, embedding_dim: int) -> None:
            super().__init__()
            self.interaction_branch1 = interaction_branch1
            self.interaction_branch2 = interaction_branch2
            self.D = embedding_dim

        def forward(self, sparse_features: torch.Tensor) -> torch.Tensor:
            batch = sparse_features.shape[0]
            combined = sparse_features.flatten(1)
            left = self.interaction_branch1(combined).reshape(batch, -1, self.D)
            right = self.interaction_branch2(combined).reshape(batch, self.D, -1)
            return torch.bmm(left, right).flatten(1)

    return locals()


blocks = TorchBlocks(__name__, define_blocks)
__getattr__ = blocks.module_getattr
