"""Uniform random Criteo-shaped batches, like the public TorchRec example's default data.

Ids are uniform over each table, dense values uniform in [0, 1) and labels fair coin
flips: nothing to learn (AUROC stays near 0.5), which makes it a pure speed test.
A few global batches are generated once and cycled, so generation does not slow
training down.

With history features (``--sequence_columns HIST:ITEM``) every row also gets, per
history, 0 to ``max_history`` ids (uniform, empty histories included) drawn from the
item feature's table, as one more jagged bag after the categorical features'.
"""

from collections.abc import Callable, Iterator, Sequence

import numpy as np
from torchrec.datasets.utils import Batch

from data.batching.batches import BatchBuilder, RankBatchLayout

NUM_GENERATED_BATCHES = 10


class RandomCriteoLoader:
    """``num_batches`` random batches of one split for one rank.

    Args:
        num_batches: batches per epoch.
        batch_size: rows per rank per batch.
        rank, world_size: this rank and the number of ranks.
        num_embeddings_per_feature: the id range of each sparse feature.
        sparse_feature_names: KJT keys.
        num_dense_features: dense columns.
        seed: data seed; ``stream`` separates splits drawn from the same seed.
        stream: 0 for train, 1 for validation, 2 for test.
        expand: turns the one-hot ids into multi-hot bags (``--multi_hot_sizes``).
        histories: (history feature name, index of its item feature) of each history
            feature, KJT keys after ``sparse_feature_names``.
        max_history: the longest history.

    Example::

        loader = RandomCriteoLoader(100, 512, 0, 1, [1000] * 26, [f"cat_{i}" for i in range(26)])
    """

    def __init__(
        self,
        num_batches: int,
        batch_size: int,
        rank: int,
        world_size: int,
        num_embeddings_per_feature: Sequence[int],
        sparse_feature_names: list[str],
        num_dense_features: int = 13,
        seed: int = 0,
        stream: int = 0,
        expand: Callable[[np.ndarray], list[np.ndarray]] | None = None,
        histories: Sequence[tuple[str, int]] = (),
        max_history: int = 0,
    ) -> None:
        self._num_batches = num_batches
        self._start_batch = 0
        global_rows = batch_size * world_size
        layout = RankBatchLayout(global_rows, batch_size, rank, world_size, drop_last=True)
        lo, hi = layout.rows(0)
        build = BatchBuilder([*sparse_feature_names, *(name for name, _ in histories)])
        sizes = np.asarray(num_embeddings_per_feature, dtype=np.int64)
        self._batches: list[Batch] = []
        for b in range(min(num_batches, NUM_GENERATED_BATCHES)):
            # Draw the whole global batch and keep this rank's rows: the same data
            # whatever the world size.
            rng = np.random.default_rng([seed, stream, b])
            dense = rng.random((global_rows, num_dense_features), dtype=np.float32)
            sparse = (rng.random((global_rows, len(sizes))) * sizes).astype(np.int32)
            labels = rng.integers(0, 2, size=(global_rows, 1), dtype=np.int32)
            rows = sparse[lo:hi]
            bags = rows if expand is None else expand(rows)
            if not histories:
                self._batches.append(build(dense[lo:hi], bags, labels[lo:hi]))
                continue
            # Their own generator: the other columns are those of the same seed without histories.
            history_rng = np.random.default_rng([seed, stream, b, 1])
            ids = (
                [bag.reshape(-1) for bag in bags.T]
                if isinstance(bags, np.ndarray)
                else [bag.reshape(-1) for bag in bags]
            )
            lengths = [np.full(hi - lo, len(bag) // (hi - lo), dtype=np.int32) for bag in ids]
            for _, item in histories:
                counts = history_rng.integers(0, max_history + 1, size=global_rows)
                drawn = (history_rng.random(int(counts.sum())) * sizes[item]).astype(np.int32)
                starts = np.concatenate(([0], np.cumsum(counts)))
                ids.append(drawn[starts[lo] : starts[hi]])
                lengths.append(counts[lo:hi].astype(np.int32))
            self._batches.append(build.bags(dense[lo:hi], ids, np.stack(lengths), labels[lo:hi]))

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Random data is the same every epoch; iteration starts at ``start_batch``."""
        self._start_batch = start_batch

    def __len__(self) -> int:
        return self._num_batches

    def __iter__(self) -> Iterator[Batch]:
        for b in range(self._start_batch, self._num_batches):
            yield self._batches[b % len(self._batches)]
