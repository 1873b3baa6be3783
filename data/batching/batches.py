"""Per-rank batch layout and conversion of numpy rows into torchrec `Batch` objects.

Every loader splits a *global* batch of ``batch_size * world_size`` consecutive rows
(in the split's, possibly shuffled, row order) into one contiguous block per rank.
So step k on W ranks sees exactly the rows that step k sees on one rank with a W
times larger batch: runs at different world sizes are comparable step by step. (The
Parquet loader, data/parquet/loader.py, keeps the batch counts and sizes but cuts the
epoch's rows into ``--epoch_shares`` shares instead, each rank reading its own, so that
each row is read by one rank; one rank given W shares takes W ranks' steps.)

With sample weights (``--weight_column``) a batch is a `WeightedBatch`: torchrec's
`Batch` plus each row's weight and the normalizer that makes the ranks' weighted
losses average to the global batch's weighted mean loss.
"""

from dataclasses import dataclass

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

# One-hot ids (B, F), or one (B, k_f) array of ids per feature for multi-hot bags.
Sparse = np.ndarray | list[np.ndarray]


@dataclass(frozen=True)
class RankBatchLayout:
    """Which rows of a split a rank reads for each global batch.

    A final partial global batch is split evenly over the ranks, dropping at most
    ``world_size - 1`` rows so every rank takes a batch of the same size (the
    embedding all-to-all needs equal batch counts on all ranks).

    Args:
        num_rows: rows in the split.
        batch_size: rows per rank per batch.
        rank: this rank.
        world_size: number of ranks.
        drop_last: drop the final partial global batch instead.

    Example::

        layout = RankBatchLayout(num_rows=10, batch_size=2, rank=1, world_size=2, drop_last=False)
        layout.rows(0)  # (2, 4): rank 1 reads rows 2 and 3 of global batch 0
    """

    num_rows: int
    batch_size: int
    rank: int
    world_size: int
    drop_last: bool

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    def __len__(self) -> int:
        full, rest = divmod(self.num_rows, self.global_batch_size)
        if self.drop_last or rest < self.world_size:
            return full
        return full + 1

    def rows(self, batch: int) -> tuple[int, int]:
        """[start, stop) of this rank's rows of global batch ``batch``, in split order."""
        start = batch * self.global_batch_size
        per_rank = min(self.batch_size, (self.num_rows - start) // self.world_size)
        first = start + self.rank * per_rank
        return first, first + per_rank

    def global_rows(self, batch: int) -> tuple[int, int]:
        """[start, stop) of all ranks' rows of global batch ``batch``, in split order."""
        start = batch * self.global_batch_size
        return start, start + self.world_size * (self.rows(batch)[1] - self.rows(batch)[0])


@dataclass
class WeightedBatch(Batch):
    """A `Batch` with sample weights; Pipelineable like it (``to``, ``record_stream``,
    ``pin_memory`` carry the weights along).

    Args:
        weights: float32 (rows,), each row's weight (finite, not negative).
        weight_normalizer: float32 scalar, the weight sum of the global batch (all
            ranks' rows) divided by the number of ranks, 1 when that sum is 0. A rank's
            loss sum(w * l) / weight_normalizer, averaged over the ranks as their
            gradients are, is the global batch's sum(w * l) / sum(w): the same step as
            one rank reading the whole global batch.
    """

    weights: torch.Tensor
    weight_normalizer: torch.Tensor

    def to(self, device: torch.device, non_blocking: bool = False) -> "WeightedBatch":
        batch = super().to(device, non_blocking)
        return WeightedBatch(
            batch.dense_features,
            batch.sparse_features,
            batch.labels,
            self.weights.to(device=device, non_blocking=non_blocking),
            self.weight_normalizer.to(device=device, non_blocking=non_blocking),
        )

    def record_stream(self, stream: torch.Stream) -> None:
        super().record_stream(stream)
        self.weights.record_stream(stream)
        self.weight_normalizer.record_stream(stream)

    def pin_memory(self) -> "WeightedBatch":
        batch = super().pin_memory()
        return WeightedBatch(
            batch.dense_features,
            batch.sparse_features,
            batch.labels,
            self.weights.pin_memory(),
            self.weight_normalizer.pin_memory(),
        )


class BatchBuilder:
    """Turns (dense, sparse, labels) arrays into a `Batch`, with weights a `WeightedBatch`.

    The KJT is built feature-major (all rows of feature 0, then feature 1, ...)
    without a Python loop over rows: from one-hot ids (B, F), one id per bag, or from
    one (B, k_f) array per feature, bags of k_f ids; or (`bags`) from bags of any
    length. Fixed-size lengths and offsets are cached per batch shape.

    Args:
        sparse_feature_names: the KJT keys, one per sparse feature.
    """

    def __init__(self, sparse_feature_names: list[str]) -> None:
        self._keys = list(sparse_feature_names)
        self._lengths: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def _lengths_offsets(self, batch_size: int, hotness: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        key = (batch_size, *hotness)
        if key not in self._lengths:
            lengths = torch.from_numpy(np.repeat(np.asarray(hotness, dtype=np.int32), batch_size))
            offsets = torch.zeros(len(lengths) + 1, dtype=torch.int32)
            torch.cumsum(lengths, 0, out=offsets[1:])
            self._lengths[key] = (lengths, offsets)
        return self._lengths[key]

    def __call__(
        self,
        dense: np.ndarray,
        sparse: Sparse,
        labels: np.ndarray,
        weights: np.ndarray | None = None,
        weight_normalizer: float = 1.0,
    ) -> Batch:
        batch_size = dense.shape[0]
        if isinstance(sparse, np.ndarray):
            hotness: tuple[int, ...] = (1,) * sparse.shape[1]
            values = np.ascontiguousarray(sparse.T, dtype=np.int32).reshape(-1)
        else:
            hotness = tuple(part.shape[1] for part in sparse)
            values = np.concatenate([np.asarray(part, dtype=np.int32).reshape(-1) for part in sparse])
        lengths, offsets = self._lengths_offsets(batch_size, hotness)
        return self._batch(dense, values, lengths, offsets, labels, weights, weight_normalizer)

    def bags(
        self,
        dense: np.ndarray,
        ids: list[np.ndarray],
        lengths: np.ndarray,
        labels: np.ndarray,
        weights: np.ndarray | None = None,
        weight_normalizer: float = 1.0,
        flat_ids: np.ndarray | None = None,
    ) -> Batch:
        """A batch of bags of any length: ``ids[f]`` holds feature f's ids of every row,
        row after row, ``lengths`` (F, B) the bag sizes (0 for an empty bag); ``flat_ids``,
        when given, is ``ids`` already concatenated (no copy then)."""
        flat_lengths = torch.from_numpy(np.ascontiguousarray(lengths, dtype=np.int32).reshape(-1))
        offsets = torch.zeros(len(flat_lengths) + 1, dtype=torch.int32)
        torch.cumsum(flat_lengths, 0, out=offsets[1:])
        if flat_ids is not None:
            values = flat_ids
        else:
            values = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        wide = values.size and int(values.max()) > np.iinfo(np.int32).max
        values = values.astype(np.int64 if wide else np.int32, copy=False)
        return self._batch(dense, values, flat_lengths, offsets, labels, weights, weight_normalizer)

    def _batch(
        self,
        dense: np.ndarray,
        values: np.ndarray,
        lengths: torch.Tensor,
        offsets: torch.Tensor,
        labels: np.ndarray,
        weights: np.ndarray | None,
        weight_normalizer: float,
    ) -> Batch:
        batch = Batch(
            dense_features=torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)),
            sparse_features=KeyedJaggedTensor(
                keys=self._keys, values=torch.from_numpy(values), lengths=lengths, offsets=offsets
            ),
            labels=torch.from_numpy(np.ascontiguousarray(labels.reshape(-1), dtype=np.int32)),
        )
        if weights is None:
            return batch
        return WeightedBatch(
            batch.dense_features,
            batch.sparse_features,
            batch.labels,
            torch.from_numpy(np.ascontiguousarray(weights, dtype=np.float32)),
            torch.tensor(weight_normalizer, dtype=torch.float32),
        )
