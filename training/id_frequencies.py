"""How often each embedding row is looked up in training (``--collect_multi_hot_freqs_stats``).

Each rank counts the ids of the training batches it loads, per table, and writes
``multi_hot_freqs_rank_<rank>.npz`` in the current directory when training ends (as
the public example writes its ``stats_*_hash_<rank>_*.npy`` there). Keys, for every
table (``t_cat_0`` ...), int64 arrays of the table's length:

    t_cat_0          lookups of every id of every bag (the multi-hot ids)
    t_cat_0.first    lookups of the first id of each bag: with --multi_hot_sizes the
                     one-hot id before expansion (data/batching/multi_hot.py puts it first)

Validation and test batches are not counted. Sum the files over ranks for the whole
run; the file is written under a temporary name and renamed when complete.
"""

import os
from collections.abc import Iterator

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from common.atomic import atomic_path


def frequencies_file(rank: int) -> str:
    return f"multi_hot_freqs_rank_{rank}.npz"


class IdFrequencies:
    """Per-table lookup counts of the training batches this rank loads.

    Args:
        feature_names: the KJT keys, in table order.
        table_names: the table of each feature.
        num_embeddings: rows of each table.

    Example::

        counts = IdFrequencies(["cat_0"], ["t_cat_0"], [1000])
        batches = counts.counting(iter(loader))  # counts each batch as it passes
        counts.save(".", rank=0)
    """

    def __init__(self, feature_names: list[str], table_names: list[str], num_embeddings: list[int]) -> None:
        self._tables = dict(zip(feature_names, table_names))
        self.counts: dict[str, np.ndarray] = {}
        for table, rows in zip(table_names, num_embeddings):
            self.counts[table] = np.zeros(rows, dtype=np.int64)
            self.counts[f"{table}.first"] = np.zeros(rows, dtype=np.int64)

    def add(self, features: KeyedJaggedTensor) -> None:
        for feature, bags in features.to_dict().items():
            table = self._tables[feature]
            values, lengths = bags.values().cpu(), bags.lengths().cpu()
            self._accumulate(table, values)
            starts = torch.cumsum(lengths, 0) - lengths
            self._accumulate(f"{table}.first", values[starts[lengths > 0]])

    def _accumulate(self, key: str, ids: torch.Tensor) -> None:
        counts = self.counts[key]
        counts += np.bincount(ids.numpy().astype(np.int64), minlength=len(counts))[: len(counts)]

    def counting(self, batches: Iterator) -> Iterator:
        """Passes the batches on, counting the sparse features of each."""
        for batch in batches:
            self.add(batch.sparse_features)
            yield batch

    def save(self, directory: str, rank: int) -> str:
        path = os.path.join(directory, frequencies_file(rank))
        with atomic_path(path, suffix=".tmp.npz") as tmp:
            np.savez(tmp, allow_pickle=False, **self.counts)  # integer counts: nothing to pickle
        return path
