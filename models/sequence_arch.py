"""The sparse arch of a model with history features (``--sequence_columns HIST:ITEM``).

Table sharing. A history HIST is looked up in the table of its candidate feature ITEM,
unpooled. TorchRec's tables belong to one collection: an EmbeddingBagCollection
(pooled) cannot share a table with an EmbeddingCollection (unpooled), and a table
registered in both would be two tables, sharded, initialised and updated apart. So
each ITEM's table ``t_ITEM`` moves into one `EmbeddingCollection` whose table serves
both features (``feature_names=[ITEM, HIST, ...]``): one table, one set of shards, one
fused optimizer, and gradients from the candidate and from every history position
meet in it. The candidate is read from it as a jagged bag and sum-pooled here, which
is what the EmbeddingBagCollection's sum pooling gave (one-hot: the row itself). The
other categorical features stay in the `EmbeddingBagCollection`, pooled by FBGEMM as
before. Both collections take the batch's KeyedJaggedTensor as it comes (each picks
its own keys), so the planner shards both and TorchRec's train pipeline starts both
input all-to-alls ahead, as for a model without histories. Table names, shapes and
the seeded init are unchanged; the state dict path of an ITEM table moves from
``embedding_bag_collection.embedding_bags`` to ``embedding_collection.embeddings``.

The arch returns (B, F + S, D): the F categorical features' pooled embeddings in the
data's order, then one vector per history (S), its sequence interaction's pooling
(models/sequence_interactions/) given the candidate. The model's interaction reads
them as F + S features.
"""

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor

from models.arch import PooledSparseArch


def sum_pooled(bag: JaggedTensor) -> torch.Tensor:
    """(B, D): each row's embeddings summed (a row without ids: zeros). A segment sum:
    its backward repeats each row's gradient over its ids (a gather). ``index_add``
    over the rows, as before, is a scatter both ways and cost a 2-rank CPU step about
    60 ms for 512 one-id rows."""
    return torch.segment_reduce(bag.values(), "sum", lengths=bag.lengths(), axis=0, unsafe=True)


def padded_history(bag: JaggedTensor, max_history: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(embeddings (B, L, D) left-aligned, zeros after each row's items; mask (B, L),
    True at the items), L = ``max_history``; a longer row keeps its first L items (the
    data truncates histories to their newest L)."""
    lengths = bag.lengths()
    padded = bag.to_padded_dense(desired_length=max_history)
    mask = torch.arange(max_history, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)
    return padded, mask


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension's valid positions (``mask`` broadcasts to
    ``scores``), 0 at the others and everywhere in a row without one: the masked
    scores are the dtype's smallest finite value, never -inf, so such a row stays
    finite before its weights are zeroed."""
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return filled.softmax(dim=-1) * mask.to(scores.dtype)


class _PReLUFunction(torch.autograd.Function):
    """PReLU with one shared slope: the forward is torch's own; its backward,
    ``aten::_prelu_kernel_backward``, takes 15-20x as long as the forward on CPU, so
    the input's gradient is leaky ReLU's backward (the slope as a number, one
    vectorized pass) and the slope's one dot product. Measured on a (512, 50, 80)
    block, one thread: 1.3 ms + 1.0 ms, against 11.4 ms for torch's backward and 16.5
    ms for ``torch.where(x > 0, grad, w * grad)``, which this replaced (as ``where``
    in the forward, 9 ms against 0.6 ms)."""

    # Under --amp x is bf16/fp16 and the slope fp32: the output and x's gradient keep x's
    # dtype (as nn.PReLU's), the slope's gradient is summed in the slope's dtype.
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return torch.nn.functional.prelu(x, weight.to(x.dtype))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, weight = ctx.saved_tensors
        negative = x.clamp(max=0).reshape(-1).to(weight.dtype)
        grad_weight = torch.dot(grad.reshape(-1).to(weight.dtype), negative).reshape(weight.shape)
        # The slope rounded to x's dtype first, as the forward multiplied by it.
        slope = weight.to(x.dtype).item()
        grad_x = torch.ops.aten.leaky_relu_backward(grad.to(x.dtype), x, slope, False)
        return grad_x, grad_weight


def prelu(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``torch.nn.functional.prelu(x, weight)`` for a one-slope ``weight`` (nn.PReLU's
    default), with a fast backward: for training (an exported program calls the plain
    operator, which the serving loaders accept)."""
    if weight.numel() != 1:
        return torch.nn.functional.prelu(x, weight)
    return _PReLUFunction.apply(x, weight)


# Leaves for fx tracing (torchrec's train pipeline traces the model): their sizes come
# from the batch, which a symbolic trace cannot read, and prelu's autograd function
# takes no proxies.
torch.fx.wrap("sum_pooled")
torch.fx.wrap("padded_history")
torch.fx.wrap("masked_softmax")
torch.fx.wrap("prelu")


class SequenceSparseArch(PooledSparseArch):
    """Pooled embeddings of the categorical features and target-attention pooling of
    the histories: (B, F + S, D) (see the module's docstring for the table sharing).

    Args:
        embedding_bag_collection: the tables of the features that are no history's item.
        embedding_collection: one table per item feature, its features the item and
            its histories.
        sequence_pooling: one sequence interaction per history, by history name.
        sparse_feature_names: the F categorical features in the data's order.
        sequences: (history, item) pairs, in the data's order.
        max_history: L.
    """

    feature_index: torch.Tensor  # a buffer

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        embedding_collection: EmbeddingCollection,
        sequence_pooling: nn.ModuleDict,
        sparse_feature_names: list[str],
        sequences: list[tuple[str, str]],
        max_history: int,
    ) -> None:
        super().__init__(embedding_bag_collection)
        self.embedding_collection = embedding_collection
        self.sequence_pooling = sequence_pooling
        self._bag_feature_names = self._sparse_feature_names
        self._items = list(dict.fromkeys(item for _, item in sequences))
        self._sequences = list(sequences)
        self._kjt_keys = [*sparse_feature_names, *(history for history, _ in sequences)]
        self._sparse_feature_names = list(sparse_feature_names)
        self.F = len(sparse_feature_names) + len(sequences)
        self.max_history = max_history
        # Where each categorical feature is in [bag features..., item features...].
        stacked = [*self._bag_feature_names, *self._items]
        self.register_buffer(
            "feature_index", torch.tensor([stacked.index(name) for name in sparse_feature_names]), persistent=False
        )
        self.bag_order: torch.Tensor | None = None

    @property
    def sequences(self) -> list[tuple[str, str]]:
        """The (history, item) pairs, in the data's order."""
        return list(self._sequences)

    @property
    def interaction_shape(self) -> EmbeddingBagCollection:
        """A stand-in collection of the F + S vectors the interaction reads (on the meta
        device): torchrec's DLRM classes size their blocks from a collection's features."""
        return EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(name=f"shape_{name}", embedding_dim=self.D, num_embeddings=1, feature_names=[name])
                for name in self._kjt_keys
            ],
            device=torch.device("meta"),
        )

    @torch.no_grad()
    def probe_output_order(self, device: torch.device) -> torch.Tensor | None:
        """Keeps the bag collection's output order itself (the items and histories come
        after it, so no interaction can fold it in): always None for the caller.
        Collective on a sharded collection, as the base class's. The probe holds every
        key of the batches, in their order: a sharded collection sets its input
        permutation from the first batch it sees."""
        probe = KeyedJaggedTensor(
            keys=self._kjt_keys,
            values=torch.zeros(len(self._kjt_keys), dtype=torch.int64, device=device),
            lengths=torch.ones(len(self._kjt_keys), dtype=torch.int32, device=device),
        )
        self.feature_index = self.feature_index.to(device)  # made on the CPU, with the model
        keys = list(self.embedding_bag_collection(probe).keys())
        if keys != self._bag_feature_names:
            self.bag_order = torch.tensor([keys.index(name) for name in self._bag_feature_names], device=device)
        return None

    def lookup(self, features: KeyedJaggedTensor):
        """Both collections' outputs (lazy when sharded under the train pipeline)."""
        return self.embedding_bag_collection(features), self.embedding_collection(features)

    def arrange(self, looked) -> torch.Tensor:
        pooled, unpooled = looked
        bags = pooled.values().reshape(-1, len(self._bag_feature_names), self.D)
        if self.bag_order is not None:
            bags = bags.index_select(1, self.bag_order)
        # In the bag collection's output dtype (fp32, also for fp16 tables), which the attention computes in.
        candidates = {item: sum_pooled(unpooled[item]).to(bags.dtype) for item in self._items}
        items = torch.stack([candidates[item] for item in self._items], dim=1)
        vectors = torch.cat((bags, items), dim=1).index_select(1, self.feature_index)
        pooled_histories = []
        for history, item in self._sequences:
            padded, mask = padded_history(unpooled[history], self.max_history)
            pooled_histories.append(self.sequence_pooling[history](padded.to(bags.dtype), mask, candidates[item]))
        return torch.cat((vectors, torch.stack(pooled_histories, dim=1)), dim=1)

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return self.arrange(self.lookup(features))


def build_sequence_sparse_arch(
    bag_configs: list[EmbeddingBagConfig],
    sequences: list[tuple[str, str]],
    max_history: int,
    sequence_pooling: dict[str, nn.Module],
    embedding_device: torch.device,
) -> SequenceSparseArch:
    """The arch over ``bag_configs`` (one table per categorical feature, in the data's
    order) whose item features' tables move into an EmbeddingCollection shared with
    their histories."""
    items = {item for _, item in sequences}
    histories_of = {item: [h for h, i in sequences if i == item] for item in items}
    bags = [c for c in bag_configs if c.feature_names[0] not in items]
    shared = [
        EmbeddingConfig(
            name=c.name,
            embedding_dim=c.embedding_dim,
            num_embeddings=c.num_embeddings,
            feature_names=[c.feature_names[0], *histories_of[c.feature_names[0]]],
            data_type=c.data_type,
        )
        for c in bag_configs
        if c.feature_names[0] in items
    ]
    return SequenceSparseArch(
        EmbeddingBagCollection(tables=bags, device=embedding_device),
        EmbeddingCollection(tables=shared, device=embedding_device),
        nn.ModuleDict(sequence_pooling),
        [c.feature_names[0] for c in bag_configs],
        sequences,
        max_history,
    )
