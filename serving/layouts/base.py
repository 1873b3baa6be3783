"""What every serving input layout is made of (serving/layouts/__init__.py lists them).

A layout is one module of this package holding three things under one name:

- its record in inputs.json (``"layout"`` and ``"preprocessing"``): a `LayoutRecord`
  dataclass, written with the export and read back typed by `LayoutRecord.read`;
- its export description, from the checkpoint's meta.json alone: `InputLayout.describe`
  turns the model's config and what training recorded (``serving_facts``) into a
  `Description`; a checkpoint older than meta.json version 6 records no facts, and
  the layout reads the training data again (`data_again`);
- its reader: the `InputLayout` subclass itself, which turns whole input lines (or a
  table) into the model's inputs for the predictor, the endpoint and the quality gate.

Nothing here imports serving.model_inputs (which reads inputs.json through the
registry): a layout names `ModelInputs` only in annotations.
"""

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar

import numpy as np

from checkpoints.meta import CheckpointMeta
from common.errors import BadInput
from common.json_fields import JsonObject
from common.manifest import ManifestEntry
from data.config import DataConfig
from data.sources import SOURCES
from models.config import ModelConfig

if TYPE_CHECKING:  # serving.model_inputs imports the layouts
    from serving.model_inputs import ModelInputs

# In the sparse input of a padded model (Parquet data): a place its bag leaves empty.
PADDING_ID = -1
# The flag of ``python -m serving.export`` that names where an old checkpoint's data is now.
TRAINING_DATA_FLAG = "--training_data"

Features = tuple[np.ndarray, np.ndarray]
T = TypeVar("T")


# A delta export's seen-id filters rebuilt from its base's (one uint8 array a feature, the
# features named): serving/delta.py's apply_sketch_delta, bound to the delta's directory.
DeltaSketch = Callable[[list[np.ndarray], list[str]], list[np.ndarray]]


@dataclass
class LayoutRecord(ABC):
    """inputs.json's ``preprocessing`` of one layout (a dataclass of JSON values)."""

    # The layout's name: inputs.json's "layout", a key of serving.layouts.LAYOUTS.
    LAYOUT: ClassVar[str]
    # Whether the model's sparse input may hold `PADDING_ID` (bags of any length).
    PADDED: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def read(cls, document: JsonObject, legacy: bool, count: int) -> "LayoutRecord":
        """The record in inputs.json ``document`` (``legacy``: a version-1 file;
        ``count``: the sparse features), checked field by field (FileFieldError)."""

    def check(self, dense: list[str], sparse: list[str], hotness: list[int], path: str) -> None:  # noqa: B027
        """Optional (a layout whose record holds nothing to contradict keeps it): refuses a record the rest of inputs.json contradicts (FileFieldError naming ``path``)."""


@dataclass
class Description:
    """inputs.json without the checkpoint, the variants and the calibration: what an
    export describes of a model's inputs.

    Args:
        dense_feature_names, sparse_feature_names: the model's inputs, in column order.
        sparse_hotness: ids per row of each categorical feature (places of a bag).
        num_embeddings_per_feature: the table sizes.
        preprocessing: the layout's record.
        data_path: the training data the quality gate may read, if any.
    """

    dense_feature_names: list[str]
    sparse_feature_names: list[str]
    sparse_hotness: list[int]
    num_embeddings_per_feature: list[int]
    preprocessing: LayoutRecord
    data_path: str | None


@dataclass(frozen=True)
class Checkpoint:
    """What a layout describes a model from: the checkpoint's meta.json and model.

    Args:
        path: the checkpoint directory (its meta.json names errors).
        meta: its meta.json.
        model: the model it holds.
        max_bag_size: the places of a bag whose length varies (serving.export --max_bag_size).
        training_data: where an old checkpoint's training data is now (--training_data), if given.
    """

    path: str
    meta: CheckpointMeta
    model: ModelConfig
    max_bag_size: int
    training_data: str | None = None

    @property
    def meta_path(self) -> str:
        return f"{self.path}/meta.json"

    def facts(self) -> JsonObject | None:
        """meta.json's ``serving_facts`` (read typed by the layout), or None when the
        checkpoint records none (older than version 6)."""
        facts = self.meta.serving_facts
        return None if facts is None else JsonObject(facts, self.meta_path, "serving_facts")

    def data_config(self) -> DataConfig:
        """The recorded data flags, with the source's path flag at ``training_data`` when given."""
        data = self.meta.data
        field = SOURCES[self.meta.source_name].path_field
        if self.training_data is None or field is None:
            return data
        options = dataclasses.replace(data.source_options, **{field: self.training_data})
        return dataclasses.replace(data, source_options=options)

    def data_again(self, read: Callable[[DataConfig], T]) -> T:
        """``read`` of the training data, for a checkpoint whose meta.json records
        nothing of it; unreadable, one line saying what to pass (BadInput)."""
        try:
            return read(self.data_config())
        except (BadInput, OSError) as e:
            raise BadInput(
                f"{e}; {self.meta_path} (version {self.meta.version}) predates the record of what "
                f"serving needs, so export reads the training data: pass {TRAINING_DATA_FLAG} "
                "with where that data is now"
            ) from e


class ParsedLines(NamedTuple):
    """Whole lines' features as the data gives them, and their labels.

    Args:
        dense: (N, num_dense).
        sparse: (N, sum of hotness).
        labels: (N,) 0/1, or None for lines without a label.
    """

    dense: np.ndarray
    sparse: np.ndarray
    labels: np.ndarray | None


class CountedLines(ParsedLines):
    """`ParsedLines` (unpacked as three) with ``unseen``: per categorical feature, the
    ids the training data never held, counted by the layout as it converted them (a
    hashed model's rows no longer tell: `InputLayout.count_unseen` cannot)."""

    unseen: np.ndarray

    @classmethod
    def of(cls, lines: ParsedLines, unseen: np.ndarray) -> "CountedLines":
        counted = cls(*lines)
        counted.unseen = unseen
        return counted


class MalformedLineError(BadInput):
    """An input line not in the model's input layout; the message names the file and line."""


class InputLayout(ABC):
    """Whole lines of one layout -> the data's features -> the model's inputs.

    Args:
        inputs: the export's inputs.json.
    """

    # inputs.json's record of this layout (its LAYOUT is the layout's name).
    record: ClassVar[type[LayoutRecord]]
    # Whether its lines can carry history features (inputs.json's histories): each then
    # takes max_history more columns of the sparse features, after the categorical ones,
    # the history's newest ids oldest first and `PADDING_ID` in the places it leaves empty.
    HISTORIES: ClassVar[bool] = False

    def __init__(self, inputs: "ModelInputs") -> None:
        self.num_dense = inputs.num_dense_features
        self.num_sparse_columns = int(sum(inputs.sparse_hotness)) + sum(h.max_history for h in inputs.histories)

    @staticmethod
    @abstractmethod
    def describe(checkpoint: Checkpoint) -> Description:
        """The model's inputs in this layout, from ``checkpoint``'s meta.json (its
        ``serving_facts``; of an older version, the training data read again).

        Raises:
            BadInput: one line naming the file (and what to pass).
        """

    @classmethod
    def load(cls, inputs: "ModelInputs", model_dir: str, manifest: dict[str, ManifestEntry] | None) -> "InputLayout":
        """The layout of an exported model directory (reading the files it needs)."""
        layout = cls(inputs)
        layout.read_own_files(model_dir, manifest)
        return layout

    def read_own_files(
        self, model_dir: str, manifest: dict[str, ManifestEntry] | None, delta_sketch: "DeltaSketch | None" = None
    ) -> None:
        """Reads the files that belong to the model itself, not to its inputs' shape (the
        seen-id filters): a delta export's own, where its other files are its base's
        (``delta_sketch``: a delta's filters from its base's, which this layout read
        first, when the delta carries only their changes). None by default."""
        return None

    @staticmethod
    @abstractmethod
    def training_data(path: str) -> Any:
        """The binary data set at ``path`` that models of this layout train on."""

    @abstractmethod
    def is_labelled(self, data: bytes) -> bool:
        """Whether lines carry a label, judged by the first line of ``data``."""

    @abstractmethod
    def parse(self, data: bytes, source: str, first_line: int, labelled: bool) -> ParsedLines:
        """The features and labels of whole lines.

        Args:
            data: whole lines.
            source, first_line: the file and 1-based number of the first line, for errors.
            labelled: whether lines start with a label.

        Raises MalformedLineError naming ``source`` and the line of the first bad line.
        """

    def find_bad_row(self, sparse: np.ndarray) -> tuple[int, str] | None:
        """(row, reason) of the first row of features whose ids the training data could
        not hold, or None."""
        return None

    @abstractmethod
    def count_unseen(self, sparse: np.ndarray) -> np.ndarray:
        """Per categorical feature, how many of the ids of ``sparse`` (checked) the
        training data never held (int64, one count per feature)."""

    @abstractmethod
    def column_names(self) -> list[str]:
        """The input columns `columns` gives, by name."""

    def columns(self, lines: ParsedLines, names: list[str]) -> np.ndarray:
        """(N, len(names)) the input's values of the columns ``names`` (of `column_names`).

        Raises BadInput when the label is asked of lines without one."""
        every = self.column_names()
        if lines.labels is None and every[0] in names:
            raise BadInput(f"--keep_columns {every[0]}: the input lines have no label")
        label = lines.labels if lines.labels is not None else np.zeros(len(lines.dense))
        values = self._all_columns(label.reshape(-1, 1), lines)
        return values[:, [every.index(name) for name in names]]

    @abstractmethod
    def _all_columns(self, label: np.ndarray, lines: ParsedLines) -> np.ndarray:
        """(N, len(column_names())): the label column (N, 1), then the other columns."""

    @abstractmethod
    def transform(self, dense: np.ndarray, sparse: np.ndarray) -> Features:
        """Features (checked) -> dense float32 and int64 ids as the training data holds them."""
