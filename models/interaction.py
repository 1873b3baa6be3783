"""Faster drop-in replacements for torchrec DLRM blocks, with the same math.

- `PooledSparseArch` returns the embedding collection's pooled values as (B, F, D)
  with one reshape instead of torchrec's split-per-feature-then-concatenate. A
  sharded collection may return its features in another order (table-wise sharding
  groups them by rank): `align_to_sharded_embeddings` then either folds the order
  into `DotInteraction`'s pair index (no copy at all) or has the sparse arch gather
  the features back into order (DCN and projection, whose weights see positions).
- `DotInteraction` computes DLRM's pairwise dot products with one batched matmul
  forward, gathering the upper triangle through a flat index. Its backward (one
  autograd node for the whole block) reads the symmetric gradient matrix straight
  out of the pair gradients with a second index, and returns the dense and sparse
  gradients as contiguous tensors (torchrec's version needs two backward matmuls on
  transposed operands plus an index_put, and copies to split its concatenation).
- `OverlappedDLRM` is torchrec's DLRM with the bottom MLP run while the sharded
  embeddings' all-to-alls (forward and backward) are in flight.

All keep the module names and parameters of the blocks they replace, so state dicts,
sharding plans and checkpoints are unchanged.
"""

from typing import Any, Optional

import torch
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.models.dlrm import DLRM
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from models.config import ModelConfig


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
        self._sparse_feature_names: list[str] = [n for c in configs for n in c.feature_names]
        self.F: int = len(self._sparse_feature_names)

        # Position in the collection's output of each feature, when not the identity.
        self.output_order: Optional[torch.Tensor] = None

    @property
    def sparse_feature_names(self) -> list[str]:
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

    def lookup(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """The collection's pooled output. A sharded collection under the train pipeline
        returns it lazily: its output all-to-all runs until `arrange` reads it."""
        return self.embedding_bag_collection(features)

    def arrange(self, pooled: KeyedTensor) -> torch.Tensor:
        """The lookup's output as (B, F, D)."""
        values = pooled.values().reshape(-1, self.F, self.D)
        if self.output_order is not None:
            values = values.index_select(1, self.output_order)
        return values

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return self.arrange(self.lookup(features))


def gram_pairs(x: torch.Tensor, flat_index: torch.Tensor) -> torch.Tensor:
    """The cells ``flat_index`` of each row's Gram matrix x x^T (x: (B, n, D)), flattened."""
    return torch.bmm(x, x.transpose(1, 2)).flatten(1).index_select(1, flat_index)


def _interact(dense: torch.Tensor, sparse: torch.Tensor, flat_index: torch.Tensor) -> torch.Tensor:
    combined = torch.cat((dense.unsqueeze(1), sparse), dim=1)
    return torch.cat((dense, gram_pairs(combined, flat_index)), dim=1)


class _DotInteractionFunction(torch.autograd.Function):
    """[dense, <x_i, x_j> for i < j] where x = [dense, sparse_1 .. sparse_F]."""

    @staticmethod
    def forward(ctx, dense: torch.Tensor, sparse: torch.Tensor, flat_index: torch.Tensor,  # type: ignore[override]
                symmetric_index: torch.Tensor) -> torch.Tensor:
        combined = torch.cat((dense.unsqueeze(1), sparse), dim=1)
        ctx.save_for_backward(combined, symmetric_index)
        return torch.cat((dense, gram_pairs(combined, flat_index)), dim=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        combined, symmetric_index = ctx.saved_tensors
        n, d = combined.shape[1], combined.shape[2]
        # Under autocast the gradient may arrive in bf16: compute in the input's dtype.
        grad = grad.to(combined.dtype)
        # d<x_i, x_j>/dx_i = x_j: vector k's gradient is row k of S @ x, S holding each
        # pair's gradient at (i, j) and (j, i). One gather builds S, the diagonal reading
        # an appended zero column: no scatter, no transposed add.
        sym = torch.nn.functional.pad(grad[:, d:], (0, 1)).index_select(1, symmetric_index).view(-1, n, n)
        # Row 0 (dense) and rows 1.. (sparse) apart, so both gradients come out
        # contiguous and need no copy downstream.
        grad_dense = grad[:, :d] + torch.bmm(sym[:, :1], combined).squeeze(1)
        return grad_dense, torch.bmm(sym[:, 1:], combined), None, None


@torch.fx.wrap
def dot_interaction(dense: torch.Tensor, sparse: torch.Tensor, flat_index: torch.Tensor,
                    symmetric_index: torch.Tensor) -> torch.Tensor:
    """[dense, pairwise dot products of dense and the F sparse vectors, i < j]: (B, D + P).

    A leaf for fx tracing (the train pipeline traces the model). TorchScript (the
    quantized inference export) cannot call an autograd.Function: it gets the forward
    alone.
    """
    if torch.jit.is_scripting():
        return _interact(dense, sparse, flat_index)
    return _apply_dot_interaction(dense, sparse, flat_index, symmetric_index)


@torch.jit.unused
def _apply_dot_interaction(dense: torch.Tensor, sparse: torch.Tensor, flat_index: torch.Tensor,
                           symmetric_index: torch.Tensor) -> torch.Tensor:
    return _DotInteractionFunction.apply(dense, sparse, flat_index, symmetric_index)


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
        flat_index, symmetric_index = self._pair_indices(None)
        self.register_buffer("flat_index", flat_index, persistent=False)
        self.register_buffer("symmetric_index", symmetric_index, persistent=False)

    def _pair_indices(self, sparse_order: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The flat Gram-matrix cell of each output pair, and for each cell its pair
        (the pair count for the diagonal, which has none)."""
        n = self.F + 1
        position = torch.arange(n)  # where vector k (0: dense, 1 + f: feature f) sits
        if sparse_order is not None:
            position[1:] = 1 + sparse_order.cpu()
        rows, cols = torch.triu_indices(n, n, offset=1)
        # The Gram matrix is symmetric, so a pair may be read from either triangle.
        flat_index = position[rows] * n + position[cols]
        pairs = torch.arange(len(flat_index))
        symmetric_index = torch.full((n * n,), len(flat_index), dtype=torch.int64)
        symmetric_index[flat_index] = pairs
        symmetric_index[(flat_index % n) * n + flat_index // n] = pairs
        return flat_index, symmetric_index

    def use_sparse_order(self, sparse_order: Optional[torch.Tensor]) -> None:
        """Accepts sparse features in another order: feature f at position sparse_order[f].

        The output keeps the canonical pair order.
        """
        flat_index, symmetric_index = self._pair_indices(sparse_order)
        self.flat_index = flat_index.to(self.flat_index.device)
        self.symmetric_index = symmetric_index.to(self.symmetric_index.device)

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        return dot_interaction(dense_features, sparse_features, self.flat_index, self.symmetric_index)


class OverlappedDLRM(DLRM):
    """torchrec's DLRM with a `PooledSparseArch`, running the bottom MLP while the
    embeddings' output all-to-all is in flight.

    torchrec's forward waits for the embeddings before the bottom MLP starts. Here the
    lookup starts first and its result is read after the bottom MLP, which also puts
    the bottom MLP's backward between the start of the gradient all-to-all and its
    wait (autograd runs the most recently created ready node first). Same modules,
    parameters and results as `DLRM`.
    """

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.sparse_arch.lookup(sparse_features)  # type: ignore[operator]
        embedded_dense = self.dense_arch(dense_features)
        embedded_sparse = self.sparse_arch.arrange(pooled)  # type: ignore[operator]
        concatenated_dense = self.inter_arch(dense_features=embedded_dense, sparse_features=embedded_sparse)
        return self.over_arch(concatenated_dense)


def torchrec_dlrm(dlrm_class: type[DLRM], model: ModelConfig, sparse_arch: PooledSparseArch,
                  dense_device: Optional[torch.device], **interaction_sizes: Any) -> DLRM:
    """torchrec's ``dlrm_class`` (`DLRM`, a subclass such as ``DLRM_DCN``, or
    `OverlappedDLRM`) of ``model``'s sizes and ``interaction_sizes`` over the tables of
    ``sparse_arch``, which replaces torchrec's sparse arch: same parameters and names,
    fewer copies. Its MLPs are made in torchrec's order, so a seed gives torchrec's
    weights."""
    dlrm = dlrm_class(
        embedding_bag_collection=sparse_arch.embedding_bag_collection,
        dense_in_features=model.dense_in_features,
        dense_arch_layer_sizes=model.dense_arch_layer_sizes,
        over_arch_layer_sizes=model.over_arch_layer_sizes,
        dense_device=dense_device,
        **interaction_sizes,
    )
    dlrm.sparse_arch = sparse_arch  # type: ignore[assignment]
    return dlrm


def align_to_sharded_embeddings(model: nn.Module, device: torch.device) -> int:
    """Adapts every DLRM in ``model`` (any module whose ``sparse_arch`` is a
    `PooledSparseArch`, the categorical-only models included) to the feature order of
    its sharded embeddings.

    Call once after sharding, on every rank (collective). Returns how many DLRM
    modules needed a reordering.
    """
    reordered = 0
    for module in model.modules():
        if not isinstance(getattr(module, "sparse_arch", None), PooledSparseArch):
            continue
        order = module.sparse_arch.probe_output_order(device)
        reordered += order is not None
        if isinstance(module.inter_arch, DotInteraction):
            module.inter_arch.use_sparse_order(order)
            module.sparse_arch.output_order = None
        else:
            module.sparse_arch.output_order = order
    return reordered


def compile_dense_part(model: nn.Module) -> int:
    """torch.compile, in place, every block of every DLRM in ``model`` (any module whose
    ``sparse_arch`` is a `PooledSparseArch`) but the sparse arch: the bottom MLP, the
    interaction and the over arch. The embeddings stay eager, as torchrec recommends,
    and so does the DLRM's own forward, which orders the lookup around the bottom MLP.

    ``nn.Module.compile`` keeps the modules, their names and their state dicts, so
    checkpoints load with or without it, and torchrec's train pipeline, whose fx trace
    stops at modules without a sharded one inside, finds the sharded embeddings as
    before. Returns how many blocks were compiled.
    """
    compiled = 0
    for module in model.modules():
        if not isinstance(getattr(module, "sparse_arch", None), PooledSparseArch):
            continue
        for name, block in module.named_children():
            if name != "sparse_arch":
                block.compile()
                compiled += 1
    return compiled
