"""The blocks every DLRM-family model shares, whatever its interaction.

- `PooledSparseArch` returns the embedding collection's pooled values as (B, F, D)
  with one reshape instead of torchrec's split-per-feature-then-concatenate. A
  sharded collection may return its features in another order (table-wise sharding
  groups them by rank): `align_to_sharded_embeddings` then either folds the order
  into an interaction that can take it (``use_sparse_order``: the dot interaction's
  pair index, no copy at all) or has the sparse arch gather the features back into
  order (DCN and projection, whose weights see positions).
- `torchrec_dlrm` makes torchrec's DLRM (or a subclass) over a `PooledSparseArch`:
  the model shape for data with numerical features.
- `CategoricalOnlyDLRM` / `categorical_only_dlrm`: the model shape for data without
  numerical features (Avazu, say): no bottom MLP, the interaction works over the F
  pooled embeddings (B, F, D) alone and the over arch's input shrinks accordingly.
  It keeps torchrec's module names (``sparse_arch``, ``inter_arch``, ``over_arch``)
  less the ``dense_arch``.
- `compile_dense_part`: torch.compile of every block but the embeddings.

Each interaction's own blocks and both of its model shapes are in its module of
`models/interactions/`. All keep the module names and parameters of the torchrec
blocks they replace, so state dicts, sharding plans and checkpoints are unchanged.
"""

from typing import Any

import torch
from torch import nn
from torchrec.models.dlrm import DLRM, OverArch
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from models.model_sizes import ModelSizes


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
        self.output_order: torch.Tensor | None = None

    @property
    def sparse_feature_names(self) -> list[str]:
        return self._sparse_feature_names

    @property
    def interaction_shape(self) -> EmbeddingBagCollection:
        """The collection whose features torchrec's DLRM classes size their interaction
        from: the one collection here (`models.sequence_arch` adds its histories)."""
        return self.embedding_bag_collection

    @torch.no_grad()
    def probe_output_order(self, device: torch.device) -> torch.Tensor | None:
        """Where the (sharded) collection puts each feature in its output; None when in order.

        Runs one lookup of a one-row batch, so on a sharded collection every rank must
        call it (it is collective).
        """
        probe = KeyedJaggedTensor(
            keys=self._sparse_feature_names,
            values=torch.zeros(self.F, dtype=torch.int64, device=device),
            lengths=torch.ones(self.F, dtype=torch.int32, device=device),
        )
        # In eval mode: a training-mode lookup of managed-collision tables (--id_hashing
        # zch) would record the probe's zeros as an id to admit.
        training = self.embedding_bag_collection.training
        self.embedding_bag_collection.eval()
        try:
            keys = list(self.embedding_bag_collection(probe).keys())
        finally:
            self.embedding_bag_collection.train(training)
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


def torchrec_dlrm(
    dlrm_class: type[DLRM],
    model: ModelSizes,
    sparse_arch: PooledSparseArch,
    dense_device: torch.device | None,
    **interaction_sizes: Any,
) -> DLRM:
    """torchrec's ``dlrm_class`` (`DLRM`, a subclass such as ``DLRM_DCN``, or the dot
    interaction's `OverlappedDLRM`) of ``model``'s sizes and ``interaction_sizes`` over
    the tables of ``sparse_arch``, which replaces torchrec's sparse arch: same
    parameters and names, fewer copies. Its MLPs are made in torchrec's order, so a
    seed gives torchrec's weights."""
    dlrm = dlrm_class(
        embedding_bag_collection=sparse_arch.interaction_shape,
        dense_in_features=model.dense_in_features,
        dense_arch_layer_sizes=model.dense_arch_layer_sizes,
        over_arch_layer_sizes=model.over_arch_layer_sizes,
        dense_device=dense_device,
        **interaction_sizes,
    )
    dlrm.sparse_arch = sparse_arch  # type: ignore[assignment]
    return dlrm


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


def categorical_only_dlrm(
    model: ModelSizes,
    sparse_arch: PooledSparseArch,
    inter_arch: nn.Module,
    inter_width: int,
    dense_device: torch.device | None,
) -> CategoricalOnlyDLRM:
    """The model over ``sparse_arch`` whose ``inter_arch`` gives ``inter_width`` values a
    row, with ``model``'s top MLP, made on ``dense_device`` (None: the default)."""
    over_arch = OverArch(inter_width, model.over_arch_layer_sizes, dense_device)
    if dense_device is not None:  # a cross net and a pair index are made on the default device
        inter_arch = inter_arch.to(dense_device)
    return CategoricalOnlyDLRM(sparse_arch, inter_arch, over_arch)


def align_to_sharded_embeddings(model: nn.Module, device: torch.device) -> int:
    """Adapts every DLRM in ``model`` (any module whose ``sparse_arch`` is a
    `PooledSparseArch`, the categorical-only models included) to the feature order of
    its sharded embeddings: an interaction with a ``use_sparse_order(order)`` method
    takes the features as they come, any other gets them gathered back into order.

    Call once after sharding, on every rank (collective). Returns how many DLRM
    modules needed a reordering.
    """
    reordered = 0
    for module in model.modules():
        if not isinstance(getattr(module, "sparse_arch", None), PooledSparseArch):
            continue
        order = module.sparse_arch.probe_output_order(device)
        reordered += order is not None
        if hasattr(module.inter_arch, "use_sparse_order"):
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
