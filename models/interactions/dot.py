"""DLRM's interaction, registered as "original" (the public example's name): the dot
products of every pair of vectors, the bottom MLP's output among them when the data
has numerical features.

With numerical features: torchrec's DLRM, its bottom MLP overlapped with the embedding
lookup (`OverlappedDLRM`), its interaction one batched matmul (`DotInteraction`); the
top MLP reads [dense, <v_i, v_j> for i < j]. Without: the F choose 2 dot products of
the embeddings alone (`EmbeddingDotInteraction`).

- `DotInteraction` computes DLRM's pairwise dot products with one batched matmul
  forward, gathering the upper triangle through a flat index. Its backward (one
  autograd node for the whole block) reads the symmetric gradient matrix straight
  out of the pair gradients with a second index, and returns the dense and sparse
  gradients as contiguous tensors (torchrec's version needs two backward matmuls on
  transposed operands plus an index_put, and copies to split its concatenation).
  A sharded collection's feature order is folded into its pair index
  (`use_sparse_order`): no copy at all.
- `OverlappedDLRM` is torchrec's DLRM with the bottom MLP run while the sharded
  embeddings' all-to-alls (forward and backward) are in flight.

The torch blocks are defined on the first build (`TorchBlocks`): the flags load this
module without torch.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from common.config_flags import FlagError, option
from models.interactions.registry import Interaction, TorchBlocks, register
from models.model_sizes import ModelSizes

if TYPE_CHECKING:
    import torch
    from torch import nn

    from models.arch import PooledSparseArch


@dataclass
class DotConfig:
    """The dot-product interaction's config: it has no sizes of its own (the embedding
    width and the number of features decide its output)."""

    def validate(self, model: ModelSizes) -> None:
        if not model.has_dense_arch and len(model.sparse_feature_names) < 2:
            raise FlagError(
                f"{option(model, 'interaction_type')} original on data without numerical features "
                f"multiplies pairs of embeddings and needs at least two categorical features, the data "
                f"has {len(model.sparse_feature_names)}: use dcn or projection"
            )

    def describe(self) -> str:
        return ""


def build_dot_model(
    model: ModelSizes, sparse_arch: "PooledSparseArch", dense_device: Optional["torch.device"]
) -> "nn.Module":
    # Here, not at the top: the flags (this module) load without torch.
    from models.arch import categorical_only_dlrm, torchrec_dlrm

    made = blocks()
    num_features = len(model.sparse_feature_names)
    if model.has_dense_arch:
        dlrm = torchrec_dlrm(made.OverlappedDLRM, model, sparse_arch, dense_device)
        dlrm.inter_arch = made.DotInteraction(num_features)
        return dlrm
    return categorical_only_dlrm(
        model,
        sparse_arch,
        made.EmbeddingDotInteraction(num_features),
        num_features * (num_features - 1) // 2,
        dense_device,
    )


register(Interaction(name="original", model_name="DLRM", config=DotConfig, build=build_dot_model))


def define_blocks() -> dict[str, Any]:
    """The torch blocks of both model shapes (`TorchBlocks` runs this once)."""
    global dot_interaction  # an fx leaf: looked up where fx patches it
    import torch
    from torch import nn
    from torchrec.models.dlrm import DLRM
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    def gram_pairs(x: torch.Tensor, flat_index: torch.Tensor) -> torch.Tensor:
        """The cells ``flat_index`` of each row's Gram matrix x x^T (x: (B, n, D)), flattened."""
        return torch.bmm(x, x.transpose(1, 2)).flatten(1).index_select(1, flat_index)

    def _interact(dense: torch.Tensor, sparse: torch.Tensor, flat_index: torch.Tensor) -> torch.Tensor:
        combined = torch.cat((dense.unsqueeze(1), sparse), dim=1)
        return torch.cat((dense, gram_pairs(combined, flat_index)), dim=1)

    class _DotInteractionFunction(torch.autograd.Function):
        """[dense, <x_i, x_j> for i < j] where x = [dense, sparse_1 .. sparse_F]."""

        @staticmethod
        def forward(
            ctx,
            dense: torch.Tensor,
            sparse: torch.Tensor,  # type: ignore[override]
            flat_index: torch.Tensor,
            symmetric_index: torch.Tensor,
        ) -> torch.Tensor:
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

    @torch.jit.unused
    def _apply_dot_interaction(
        dense: torch.Tensor, sparse: torch.Tensor, flat_index: torch.Tensor, symmetric_index: torch.Tensor
    ) -> torch.Tensor:
        return _DotInteractionFunction.apply(dense, sparse, flat_index, symmetric_index)

    def dot_interaction(
        dense: torch.Tensor, sparse: torch.Tensor, flat_index: torch.Tensor, symmetric_index: torch.Tensor
    ) -> torch.Tensor:
        """[dense, pairwise dot products of dense and the F sparse vectors, i < j]: (B, D + P).

        A leaf for fx tracing (the train pipeline traces the model). TorchScript (the
        quantized inference export) cannot call an autograd.Function: it gets the forward
        alone.
        """
        if torch.jit.is_scripting():
            return _interact(dense, sparse, flat_index)
        return _apply_dot_interaction(dense, sparse, flat_index, symmetric_index)

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

        def _pair_indices(self, sparse_order: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
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

        def use_sparse_order(self, sparse_order: torch.Tensor | None) -> None:
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

    return locals()


blocks = TorchBlocks(__name__, define_blocks, fx_leaves=("dot_interaction",))
__getattr__ = blocks.module_getattr
