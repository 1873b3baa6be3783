"""Faster drop-in replacements for two torchrec DLRM blocks, with the same math.

- `PooledSparseArch` returns the embedding collection's pooled values as (B, F, D)
  with one reshape instead of torchrec's split-per-feature-then-concatenate. A
  sharded collection may return its features in another order (table-wise sharding
  groups them by rank): `align_to_sharded_embeddings` then either folds the order
  into `DotInteraction`'s pair index (no copy at all) or has the sparse arch gather
  the features back into order (DCN and projection, whose weights see positions).
- `DotInteraction` computes DLRM's pairwise dot products with one batched matmul
  forward and one backward (torchrec's version needs two backward matmuls on
  transposed operands plus an index_put), gathering the upper triangle through a
  flat index.

Both keep the module names and parameters of the blocks they replace, so state dicts,
sharding plans and checkpoints are unchanged.
"""

from typing import List, Optional

import torch
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


class PooledSparseArch(nn.Module):
    """Embedding lookups, pooled, as a (B, F, D) tensor.

    Args:
        embedding_bag_collection: one table per feature, all of the same width.

    Example::

        sparse_arch = PooledSparseArch(ebc)
        sparse_arch(kjt).shape  # (B, F, D)
    """

    def __init__(self, embedding_bag_collection: EmbeddingBagCollection) -> None:
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection
        configs = embedding_bag_collection.embedding_bag_configs()
        self.D: int = configs[0].embedding_dim
        self._sparse_feature_names: List[str] = [n for c in configs for n in c.feature_names]
        self.F: int = len(self._sparse_feature_names)

        # Position in the collection's output of each feature, when not the identity.
        self.output_order: Optional[torch.Tensor] = None

    @property
    def sparse_feature_names(self) -> List[str]:
        return self._sparse_feature_names

    @torch.no_grad()
    def probe_output_order(self, device: torch.device) -> Optional[torch.Tensor]:
        """Where the (sharded) collection puts each feature in its output; None when in order.

        Runs one lookup of a one-row batch, so on a sharded collection every rank must
        call it (it is collective).
        """
        probe = KeyedJaggedTensor(
            keys=self._sparse_feature_names,
            values=torch.zeros(self.F, dtype=torch.int64, device=device),
            lengths=torch.ones(self.F, dtype=torch.int32, device=device),
        )
        keys = list(self.embedding_bag_collection(probe).keys())
        if keys == self._sparse_feature_names:
            return None
        return torch.tensor([keys.index(name) for name in self._sparse_feature_names], device=device)

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.embedding_bag_collection(features).values().reshape(-1, self.F, self.D)
        if self.output_order is not None:
            pooled = pooled.index_select(1, self.output_order)
        return pooled


def _gram_pairs(x: torch.Tensor, flat_index: torch.Tensor) -> torch.Tensor:
    return torch.bmm(x, x.transpose(1, 2)).flatten(1).index_select(1, flat_index)


class _UpperTriangleGram(torch.autograd.Function):
    """For x of shape (B, N, D): the products <x_i, x_j>, i < j, as (B, N(N-1)/2)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, flat_index: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, flat_index)
        return _gram_pairs(x, flat_index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, flat_index = ctx.saved_tensors
        n = x.shape[1]
        # Under autocast the gradient may arrive in bf16: compute in the input's dtype.
        upper = x.new_zeros(grad.shape[0], n * n).index_copy_(1, flat_index, grad.to(x.dtype)).view(-1, n, n)
        # d<x_i, x_j>/dx_i = x_j and /dx_j = x_i: one matmul with the symmetrised gradient.
        return torch.bmm(upper + upper.transpose(1, 2), x), None


@torch.fx.wrap
def upper_triangle_gram(x: torch.Tensor, flat_index: torch.Tensor) -> torch.Tensor:
    """Pairwise dot products of the N vectors of each row of x (B, N, D), i < j.

    A leaf for fx tracing (the train pipeline traces the model). TorchScript (the
    quantized inference export) cannot call an autograd.Function: it gets the forward
    alone.
    """
    if torch.jit.is_scripting():
        return _gram_pairs(x, flat_index)
    return _apply_upper_triangle_gram(x, flat_index)


@torch.jit.unused
def _apply_upper_triangle_gram(x: torch.Tensor, flat_index: torch.Tensor) -> torch.Tensor:
    return _UpperTriangleGram.apply(x, flat_index)


class DotInteraction(nn.Module):
    """DLRM's interaction: [dense, <v_i, v_j> for i < j over dense + sparse vectors].

    Same output, order and shape as torchrec's ``InteractionArch``:
    B x (D + F + F choose 2).

    Args:
        num_sparse_features: F.
    """

    def __init__(self, num_sparse_features: int) -> None:
        super().__init__()
        self.F = num_sparse_features
        self.register_buffer("flat_index", self._pair_index(None), persistent=False)

    def _pair_index(self, sparse_order: Optional[torch.Tensor]) -> torch.Tensor:
        n = self.F + 1
        position = torch.arange(n)  # where vector k (0: dense, 1 + f: feature f) sits
        if sparse_order is not None:
            position[1:] = 1 + sparse_order.cpu()
        rows, cols = torch.triu_indices(n, n, offset=1)
        # The Gram matrix is symmetric, so a pair may be read from either triangle.
        return position[rows] * n + position[cols]

    def use_sparse_order(self, sparse_order: Optional[torch.Tensor]) -> None:
        """Accepts sparse features in another order: feature f at position sparse_order[f].

        The output keeps the canonical pair order.
        """
        self.flat_index = self._pair_index(sparse_order).to(self.flat_index.device)

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        combined = torch.cat((dense_features.unsqueeze(1), sparse_features), dim=1)
        return torch.cat((dense_features, upper_triangle_gram(combined, self.flat_index)), dim=1)


def align_to_sharded_embeddings(model: nn.Module, device: torch.device) -> int:
    """Adapts every DLRM in ``model`` to the feature order of its sharded embeddings.

    Call once after sharding, on every rank (collective). Returns how many DLRM
    modules needed a reordering.
    """
    from torchrec.models.dlrm import DLRM

    reordered = 0
    for module in model.modules():
        if not (isinstance(module, DLRM) and isinstance(module.sparse_arch, PooledSparseArch)):
            continue
        order = module.sparse_arch.probe_output_order(device)
        reordered += order is not None
        if isinstance(module.inter_arch, DotInteraction):
            module.inter_arch.use_sparse_order(order)
            module.sparse_arch.output_order = None
        else:
            module.sparse_arch.output_order = order
    return reordered
