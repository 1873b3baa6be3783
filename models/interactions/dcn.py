"""The DCNv2 interaction, registered as "dcn": a low-rank cross net (torchrec's
`LowRankCrossNet`) over the concatenated vectors, the bottom MLP's output first when
the data has numerical features.

With numerical features: torchrec's `DLRM_DCN`, whose top MLP reads the cross net's
(F + 1) * D outputs. Without: the cross net over the F * D embedding values alone
(`EmbeddingCrossInteraction`).

The torch blocks are defined on the first build (`TorchBlocks`): the flags load this
module without torch.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from common.config_flags import FlagError, flag, option
from models.interactions.registry import Interaction, TorchBlocks, register
from models.model_sizes import ModelSizes

if TYPE_CHECKING:
    import torch
    from torch import nn

    from models.arch import PooledSparseArch


@dataclass
class DCNConfig:
    """The cross net's sizes (``--interaction_type dcn``)."""

    dcn_num_layers: int = flag(3, help="DCN cross layers")
    dcn_low_rank_dim: int = flag(512, help="rank of each DCN cross layer")

    def validate(self, model: ModelSizes) -> None:
        for name in ("dcn_num_layers", "dcn_low_rank_dim"):
            if getattr(self, name) <= 0:
                raise FlagError(f"{option(self, name)} must be positive, got {getattr(self, name)}")

    def describe(self) -> str:
        return f"{self.dcn_num_layers} cross layers of rank {self.dcn_low_rank_dim}"


def build_dcn_model(
    model: ModelSizes, sparse_arch: "PooledSparseArch", dense_device: Optional["torch.device"]
) -> "nn.Module":
    # Here, not at the top: the flags (this module) load without torch.
    from torchrec.models.dlrm import DLRM_DCN
    from torchrec.modules.crossnet import LowRankCrossNet

    from models.arch import categorical_only_dlrm, torchrec_dlrm

    dcn: DCNConfig = model.interaction
    if model.has_dense_arch:
        return torchrec_dlrm(
            DLRM_DCN,
            model,
            sparse_arch,
            dense_device,
            dcn_num_layers=dcn.dcn_num_layers,
            dcn_low_rank_dim=dcn.dcn_low_rank_dim,
        )
    width = len(model.sparse_feature_names) * model.embedding_dim
    crossnet = LowRankCrossNet(width, dcn.dcn_num_layers, dcn.dcn_low_rank_dim)
    return categorical_only_dlrm(model, sparse_arch, blocks().EmbeddingCrossInteraction(crossnet), width, dense_device)


register(Interaction(name="dcn", model_name="DCNv2", config=DCNConfig, build=build_dcn_model))


def define_blocks() -> dict[str, Any]:
    """The block of the model without numerical features (`TorchBlocks` runs this once)."""
    import torch
    from torch import nn

    class EmbeddingCrossInteraction(nn.Module):
        """The DCNv2 cross net over the concatenated embeddings: (B, F * D).

        Args:
            crossnet: a cross net of F * D features.
        """

        def __init__(self, crossnet: nn.Module) -> None:
            super().__init__()
            self.crossnet = crossnet

        def forward(self, sparse_features: torch.Tensor) -> torch.Tensor:
            return self.crossnet(sparse_features.flatten(1))

    return locals()


blocks = TorchBlocks(__name__, define_blocks)
__getattr__ = blocks.module_getattr
