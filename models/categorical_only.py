"""DLRM, DCNv2 and the projection variant for data without numerical features.

Many click logs (Avazu among them) have categorical features only. Their models have
no bottom MLP: the interaction works over the F pooled embeddings (B, F, D) alone,
and the over arch's input shrinks accordingly:

- original: the dot products <e_i, e_j> for i < j: F choose 2 values (F >= 2);
- dcn: the low-rank cross net over the concatenated embeddings: F * D values;
- projection: the two branch MLPs over the concatenated embeddings and the product
  of their outputs, (F1 x D) @ (D x F2): F1 * F2 values.

Each interaction's build function (models/interactions/) assembles one with
`categorical_only_dlrm`; with numerical features the models are torchrec's. These
keep torchrec's module names (``sparse_arch``, ``inter_arch.crossnet``,
``inter_arch.interaction_branch1``, ``over_arch``) less the ``dense_arch``.
"""

from typing import Optional

import torch
from torch import nn
from torchrec.models.dlrm import OverArch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from models.config import ModelConfig
from models.interaction import PooledSparseArch, gram_pairs


class EmbeddingDotInteraction(nn.Module):
    """[<e_i, e_j> for i < j] over F embeddings, in torchrec's pair order: (B, F choose 2).

    Args:
        num_sparse_features: F.
    """

    def __init__(self, num_sparse_features: int) -> None:
        super().__init__()
        rows, cols = torch.triu_indices(num_sparse_features, num_sparse_features, offset=1)
        self.register_buffer("flat_index", rows * num_sparse_features + cols, persistent=False)

    def forward(self, sparse_features: torch.Tensor) -> torch.Tensor:
        return gram_pairs(sparse_features, self.flat_index)


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


class CategoricalOnlyDLRM(nn.Module):
    """A DLRM-family model without a bottom MLP: embeddings -> interaction -> over arch.

    Takes the same inputs as torchrec's DLRM, so the train wrapper, the pipelines and
    the export need no other path; the dense features, (B, 0), are not read.

    Args:
        sparse_arch: the pooled embeddings (B, F, D).
        inter_arch: (B, F, D) -> (B, over arch input).
        over_arch: the top MLP, ending in one logit.

    Example::

        model = categorical_only_dlrm(config, sparse_arch, EmbeddingDotInteraction(F), F * (F - 1) // 2, None)
        logits = model(torch.zeros(batch, 0), kjt)  # (B, 1)
    """

    def __init__(self, sparse_arch: PooledSparseArch, inter_arch: nn.Module, over_arch: OverArch) -> None:
        super().__init__()
        self.sparse_arch = sparse_arch
        self.inter_arch = inter_arch
        self.over_arch = over_arch

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        return self.over_arch(self.inter_arch(self.sparse_arch(sparse_features)))


def categorical_only_dlrm(model: ModelConfig, sparse_arch: PooledSparseArch, inter_arch: nn.Module,
                          inter_width: int, dense_device: Optional[torch.device]) -> CategoricalOnlyDLRM:
    """The model over ``sparse_arch`` whose ``inter_arch`` gives ``inter_width`` values a
    row, with ``model``'s top MLP, made on ``dense_device`` (None: the default)."""
    over_arch = OverArch(inter_width, model.over_arch_layer_sizes, dense_device)
    if dense_device is not None:  # a cross net and a pair index are made on the default device
        inter_arch = inter_arch.to(dense_device)
    return CategoricalOnlyDLRM(sparse_arch, inter_arch, over_arch)
