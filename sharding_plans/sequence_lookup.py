"""The unpooled (sequence) lookup of a sharded EmbeddingCollection on CPU, through
FBGEMM's pooled kernels.

An unpooled lookup returns one row per id; a sum-pooled lookup of bags of one id each
returns the same rows, and its backward and fused update apply the same gradient to the
same rows. FBGEMM 1.8's CPU kernels differ tenfold in cost: the unpooled backward
(``split_embedding_nobag_backward_codegen_*_cpu``) took 66 ms a step for 25,600 ids of
a 100k x 64 table (one thread), the pooled one of the same ids in one-id bags 6.5 ms,
with bit-identical outputs and updated weights (measured here, SGD and Adagrad).
On the 2-rank history bench it was the largest part of a step (docs/benchmarks.md).

So `BagsForSequenceLookup`, torchrec's fused sequence kernel (`BatchedFusedEmbedding`)
with its forward replaced, hands FBGEMM the same ids as one-id bags. FBGEMM's pooled
lookup takes the same number of bags for every feature of the kernel (its tables are
laid out by feature): when all features read one table (an item and its histories),
their ids are dealt to the features in order, ``ceil(N / T)`` bags each, and the
(bags, T x D) output is read back in the ids' order by a transpose; otherwise each
feature gets as many bags as the longest one, the rest empty, and its rows are
gathered. Nothing else changes: the same module, weights, optimizer state and
checkpoints. `use_bags_for_sequences` swaps the kernels of a sharded collection.
"""

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen
from torchrec.distributed.batched_embedding_kernel import BatchedFusedEmbedding
from torchrec.distributed.embedding import ShardedEmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


def _pooled(tbe: SplitTableBatchedEmbeddingBagsCodegen, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The unpooled module's sum-pooled lookup of ``offsets``' bags: its pooling mode
    is read at each forward (and handed to the backward then), so it is switched for
    this call only."""
    tbe.pooling_mode, tbe.is_nobag = PoolingMode.SUM, False
    try:
        return tbe(indices=indices, offsets=offsets)
    finally:
        tbe.pooling_mode, tbe.is_nobag = PoolingMode.NONE, True


def lookup_as_bags(
    tbe: SplitTableBatchedEmbeddingBagsCodegen, indices: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """``tbe(indices, offsets)`` of an unpooled (PoolingMode.NONE) module, (N, D) rows in
    the ids' order, computed as one-id bags (see the module's docstring)."""
    features = len(tbe.feature_table_map)
    n = indices.numel()
    if n == 0:
        return tbe(indices=indices, offsets=offsets)
    if len(set(tbe.feature_table_map)) == 1:
        # Bag b of feature f holds id f * per + b: any feature may hold any id of the one table.
        per = -(-n // features)
        bags = torch.arange(features * per + 1, dtype=offsets.dtype, device=offsets.device).clamp_(max=n)
        out = _pooled(tbe, indices, bags)
        if features == 1:
            return out
        return out.view(per, features, -1).transpose(0, 1).reshape(features * per, -1)[:n]
    # Feature f's ids, in one-id bags, then empty bags up to the longest feature's count.
    batch = (offsets.numel() - 1) // features
    starts = offsets[::batch]
    counts = starts.diff()
    per = int(counts.max())
    position = torch.arange(per, dtype=offsets.dtype, device=offsets.device)
    bags = torch.cat([(starts[:-1, None] + torch.minimum(position[None, :], counts[:, None])).reshape(-1), starts[-1:]])
    out = _pooled(tbe, indices, bags).reshape(per * features, -1)
    rows = torch.cat([f + features * torch.arange(c, device=offsets.device) for f, c in enumerate(counts.tolist())])
    return out.index_select(0, rows)


class BagsForSequenceLookup(BatchedFusedEmbedding):
    """torchrec's fused unpooled kernel whose CPU lookup goes through FBGEMM's pooled
    kernels (`lookup_as_bags`); made by `use_bags_for_sequences`, never built."""

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        if self._get_hash_zch_identities_and_metadata(features) is not None:
            return super().forward(features)
        return lookup_as_bags(
            self.emb_module,
            features.values().to(self._embedding_table_index_type),
            features.offsets().to(self._embedding_table_offset_type),
        )


def use_bags_for_sequences(sharded: ShardedEmbeddingCollection) -> int:
    """Swaps every fused unpooled CPU kernel of ``sharded`` for `BagsForSequenceLookup`,
    in place (the same object, its state untouched); returns how many. The kernels sit
    in its lookups, a plain list (``_lookups``, torchrec 1.8), not submodules."""
    swapped = 0
    for lookup in sharded._lookups:
        for kernel in lookup.modules():
            if type(kernel) is BatchedFusedEmbedding and kernel.emb_module.use_cpu and kernel.emb_module.is_nobag:
                kernel.__class__ = BagsForSequenceLookup
                swapped += 1
    return swapped
