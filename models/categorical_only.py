"""DLRM, DCNv2 and the projection variant for data without numerical features.

Many click logs (Avazu among them) have categorical features only. Their models have
no bottom MLP: the interaction works over the F pooled embeddings (B, F, D) alone,
and the over arch's input shrinks accordingly:

- original: the dot products <e_i, e_j> for i < j: F choose 2 values (F >= 2);
- dcn: the low-rank cross net over the concatenated embeddings: F * D values;
- projection: the two branch MLPs over the concatenated embeddings and the product
  of their outputs, (F1 x D) @ (D x F2): F1 * F2 values.

With numerical features the models are torchrec's (``models/builder.py``); these
keep torchrec's module names (``sparse_arch``, ``inter_arch.crossnet``,
``inter_arch.interaction_branch1``, ``over_arch``) less the ``dense_arch``.
"""

from typing import Optional

import torch
from torch import nn
from torchrec.models.dlrm import DenseArch, OverArch
from torchrec.modules.crossnet import LowRankCrossNet
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

        model = build_categorical_only_dlrm(config, ebc)
        logits = model(torch.zeros(batch, 0), kjt)  # (B, 1)
    """

    def __init__(self, sparse_arch: PooledSparseArch, inter_arch: nn.Module, over_arch: OverArch) -> None:
        super().__init__()
        self.sparse_arch = sparse_arch
        self.inter_arch = inter_arch
        self.over_arch = over_arch

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        return self.over_arch(self.inter_arch(self.sparse_arch(sparse_features)))


def build_categorical_only_dlrm(config: ModelConfig, sparse_arch: PooledSparseArch,
                                dense_device: Optional[torch.device] = None) -> CategoricalOnlyDLRM:
    """The model of ``config`` (``dense_in_features == 0``, validated) over ``sparse_arch``.

    Args:
        config: the architecture; its dense_arch_layer_sizes are not used.
        sparse_arch: the embeddings.
        dense_device: where the MLPs and the cross net are created (None: the default).
    """
    num_features, dim = len(config.sparse_feature_names), config.embedding_dim
    concatenated = num_features * dim
    if config.interaction_type == "dcn":
        crossnet = LowRankCrossNet(concatenated, config.dcn_num_layers, config.dcn_low_rank_dim)
        inter_arch: nn.Module = EmbeddingCrossInteraction(crossnet)
        over_in = concatenated
    elif config.interaction_type == "projection":
        branch1, branch2 = config.interaction_branch1_layer_sizes, config.interaction_branch2_layer_sizes
        inter_arch = EmbeddingProjectionInteraction(DenseArch(concatenated, branch1, dense_device),
                                                    DenseArch(concatenated, branch2, dense_device), dim)
        over_in = (branch1[-1] // dim) * (branch2[-1] // dim)
    else:
        inter_arch = EmbeddingDotInteraction(num_features)
        over_in = num_features * (num_features - 1) // 2
    over_arch = OverArch(over_in, config.over_arch_layer_sizes, dense_device)
    if dense_device is not None:  # the cross net and the pair index are made on the default device
        inter_arch = inter_arch.to(dense_device)
    return CategoricalOnlyDLRM(sparse_arch, inter_arch, over_arch)
