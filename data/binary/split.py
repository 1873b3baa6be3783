"""Reads a feature-spec data set in split_binary files (``--dataset_path``).

The train mapping is the training split; the test mapping's first half (rows
0 .. N/2) is validation and its second half test, as the Criteo loader halves its
last day. Rows are numbered train first, then test, so `CriteoBinaryLoader` reads
this data set exactly as it reads day files: each rank only its own rows, with the
same per-global-batch layout (`data.batching.RankBatchLayout`). A spec's weight
feature is read (and its values checked) only when training weights by it
(``weight_column``); otherwise it is neither read nor checked (its size still is).
"""

import numpy as np

from data.batching.value_checks import DENSE, IDS, LABELS, WEIGHTS, ValueFile
from data.binary.feature_spec import FeatureSpec, FeatureSpecError

Arrays = tuple[np.ndarray, list[np.ndarray], np.ndarray]


def _open(path: str, dtype: np.dtype, rows: int, width: int) -> np.ndarray:
    if rows == 0:  # numpy cannot memory-map an empty file
        return np.zeros((0, width), dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(rows, width))


class SplitBinaryDataset:
    """A spec's train and test mappings, seen as one memory-mapped array of rows.

    Args:
        spec_path: the feature_spec.yaml; its files are relative to its directory.
        weight_column: the spec's weight feature, to read sample weights (`take_weights`).

    Raises:
        FeatureSpecError: one line naming the spec and the problem.

    Example::

        dataset = SplitBinaryDataset("byo/feature_spec.yaml")
        dense, sparse, labels = dataset.read(0, 10)  # float16 (10, n), [ids (10, hotness)], bool (10,);
                                                     # n may be 0 (categorical features only)
        SplitBinaryDataset("byo/feature_spec.yaml", weight_column="w").take_weights(np.arange(10))
    """

    def __init__(self, spec_path: str, weight_column: str | None = None) -> None:
        self.spec = FeatureSpec.load(spec_path)
        if weight_column is not None and weight_column != self.spec.weight:
            declared = f"its weight is {self.spec.weight!r}" if self.spec.weight else "it declares no weight"
            raise FeatureSpecError(
                f"{spec_path}: weight column {weight_column!r} is not the spec's channel_spec weight ({declared})"
            )
        self.weight_column = weight_column
        rows = self.spec.check_split_binary_files()
        self._mappings: dict[str, dict[str, tuple[np.ndarray, int]]] = {}
        self._value_files: list[ValueFile] = []
        for mapping, chunks in self.spec.source_spec.items():
            where: dict[str, tuple[np.ndarray, int]] = {}
            for chunk in chunks:
                dtype, width = self.spec.binary_layout(chunk)
                array = _open(self.spec.file_path(chunk.files[0]), dtype, rows[mapping], width)
                for column, name in enumerate(chunk.features):
                    where[name] = (array, column)
                if self.spec.channel_of(chunk.features[0]) == "weight" and weight_column is None:
                    continue  # unweighted training: the weights are neither read nor checked
                self._value_files.append(
                    self._value_file(chunk.files[0], chunk.features, array, 0 if mapping == "train" else rows["train"])
                )
            self._mappings[mapping] = where
        self._rows = [rows["train"], rows["test"]]
        for split, (start, stop) in self.split_ranges().items():
            if start == stop:
                raise FeatureSpecError(
                    f"{spec_path}: the {split} split has no rows (train mapping: "
                    f"{rows['train']} rows, test mapping: {rows['test']}, halved)"
                )

    def _value_file(self, relative: str, features: list[str], array: np.ndarray, first_row: int) -> ValueFile:
        channel = self.spec.channel_of(features[0])
        path = self.spec.file_path(relative)
        if channel == "numerical":
            return ValueFile(path, array, DENSE, list(features), first_row)
        if channel == "label":
            return ValueFile(path, array, LABELS, list(features), first_row)
        if channel == "weight":
            return ValueFile(path, array, WEIGHTS, list(features), first_row)
        name = features[0]
        return ValueFile(
            path,
            array,
            IDS,
            [name] * array.shape[1],
            first_row,
            [int(self.spec.feature_spec[name]["cardinality"])],
            f"in {self.spec.path}",
        )

    def value_files(self) -> list[ValueFile]:
        """Every file's array, with what its values must be (``data.batching.value_checks``)."""
        return list(self._value_files)

    @property
    def sparse_feature_names(self) -> list[str]:
        return list(self.spec.categorical)

    @property
    def num_embeddings_per_feature(self) -> list[int]:
        return self.spec.cardinalities

    @property
    def num_rows(self) -> int:
        return sum(self._rows)

    def split_ranges(self) -> dict:
        """{"train" | "validation" | "test": (start, stop)} in global row numbers."""
        train, test = self._rows
        middle = train + test // 2
        return {"train": (0, train), "validation": (train, middle), "test": (middle, train + test)}

    def _rows_of(self, mapping: str, index) -> Arrays:
        where = self._mappings[mapping]
        array, _ = where[self.spec.label]
        labels = np.array(array[index]).reshape(-1)
        # Categorical features only: dense is (rows, 0), so every batch still knows its size.
        dense = (
            np.stack([where[n][0][index, where[n][1]] for n in self.spec.numerical], axis=1)
            if self.spec.numerical
            else np.zeros((len(labels), 0), dtype=np.float16)
        )
        sparse = [np.array(where[n][0][index]) for n in self.spec.categorical]
        return dense, sparse, labels

    def take_weights(self, rows: np.ndarray) -> np.ndarray:
        """float32 sample weights of the rows at the given global numbers (any order);
        needs ``weight_column``."""
        assert self.weight_column is not None, "opened without a weight column"
        rows = np.asarray(rows, dtype=np.int64)
        train = self._rows[0]
        in_test = rows >= train
        weights = np.empty(len(rows), dtype=np.float32)
        for mapping, chosen, first in (("train", ~in_test, 0), ("test", in_test, train)):
            if chosen.any():
                array, _ = self._mappings[mapping][self.weight_column]
                weights[chosen] = array[rows[chosen] - first].reshape(-1)
        return weights

    def read(self, start: int, stop: int) -> Arrays:
        """Rows [start, stop) (global numbers, across the train/test boundary), in memory."""
        train = self._rows[0]
        if stop <= train:
            return self._rows_of("train", slice(start, stop))
        if start >= train:
            return self._rows_of("test", slice(start - train, stop - train))
        return self.take(np.arange(start, stop))

    def take(self, rows: np.ndarray) -> Arrays:
        """Rows at the given global numbers (any order), copied into memory."""
        rows = np.asarray(rows, dtype=np.int64)
        train = self._rows[0]
        in_test = rows >= train
        if not in_test.any():
            return self._rows_of("train", rows)
        if in_test.all():
            return self._rows_of("test", rows - train)
        a, b = self._rows_of("train", rows[~in_test]), self._rows_of("test", rows[in_test] - train)
        order = np.empty(len(rows), dtype=np.int64)
        order[np.flatnonzero(~in_test)] = np.arange(len(a[2]))
        order[np.flatnonzero(in_test)] = len(a[2]) + np.arange(len(b[2]))
        return (
            np.concatenate([a[0], b[0]])[order],
            [np.concatenate([x, y])[order] for x, y in zip(a[1], b[1])],
            np.concatenate([a[2], b[2]])[order],
        )
