"""The ``feature_spec_csv`` layout: BYO CSV rows of a model trained with --dataset_path.

Headerless, comma-separated: the label (optional), the numerical values (none for data
of categorical features only), then each feature's ids (a feature of hotness k takes k
columns). Transforms: the transcoder's (values rounded to float16). An id at or above
its feature's cardinality, never in the training data, is not refused: it is counted
as unseen and taken modulo its table size, as the training loader takes every id beyond
its table (docs/serving.md, "Unseen ids").
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from common.errors import BadInput
from common.json_fields import TEXT, JsonObject, int_list
from data.binary.feature_spec import FeatureSpec, FeatureSpecError
from data.binary.split import SplitBinaryDataset
from data.text.csv_rows import CsvRowsError, find_bad_id, parse_csv_rows
from serving.layouts.base import (
    Checkpoint,
    Description,
    Features,
    InputLayout,
    LayoutRecord,
    MalformedLineError,
    ParsedLines,
)

if TYPE_CHECKING:
    from serving.model_inputs import ModelInputs


@dataclass
class FeatureSpecColumns(LayoutRecord):
    """BYO CSV rows of a feature-spec data set: label (optional), numerical values, ids.

    Args:
        label_name: the label column's name.
        cardinalities: each categorical feature's declared cardinality (ids below it).
    """

    LAYOUT: ClassVar[str] = "feature_spec_csv"
    label_name: str
    cardinalities: list[int]

    @classmethod
    def read(cls, document: JsonObject, legacy: bool, count: int) -> "FeatureSpecColumns":
        """``legacy``: a version-1 file, which kept the fields at the top level."""
        source = document if legacy else document.object("preprocessing")
        return cls(
            label_name=source.get("label_name", TEXT),
            cardinalities=source.get("cardinalities", int_list(count, minimum=0)),
        )


def csv_columns(inputs: "ModelInputs") -> list[str]:
    """A feature-spec model's CSV columns: the label (optional in rows), the numerical
    values, then each feature's ids (``name[i]`` for a multi-hot one)."""
    assert isinstance(inputs.preprocessing, FeatureSpecColumns)
    ids = [
        name if h == 1 else f"{name}[{i}]"
        for name, h in zip(inputs.sparse_feature_names, inputs.sparse_hotness)
        for i in range(h)
    ]
    return [inputs.preprocessing.label_name, *inputs.dense_feature_names, *ids]


def _spec(path: str) -> FeatureSpec:
    """The feature spec at ``path``, unreadable as one line naming it (BadInput)."""
    try:
        return FeatureSpec.load(path)
    except FeatureSpecError as e:
        raise BadInput(
            f"the checkpoint was trained with --dataset_path {path}, whose spec export reads for the label's name: {e}"
        ) from e


class CsvRows(InputLayout):
    """BYO CSV rows of a feature-spec model (see the module docstring).

    Args:
        inputs: the export's inputs.json (its preprocessing a `FeatureSpecColumns`).
    """

    record = FeatureSpecColumns

    def __init__(self, inputs: "ModelInputs") -> None:
        super().__init__(inputs)
        columns = inputs.preprocessing
        assert isinstance(columns, FeatureSpecColumns)
        self._features = list(zip(inputs.sparse_feature_names, inputs.sparse_hotness, columns.cardinalities))
        self._column_names = csv_columns(inputs)

    @staticmethod
    def describe(checkpoint: Checkpoint) -> Description:
        """The recorded features, their hotness and cardinalities (the predictor's CSV
        rows follow the spec's order), and the label's name, which meta.json records (of
        an older checkpoint, read from the spec again, which must still describe the
        checkpoint's features)."""
        meta, model = checkpoint.meta, checkpoint.model
        features = meta.features
        facts = checkpoint.facts()
        if facts is not None:
            label_name = facts.get("label_name", TEXT)
        else:
            spec = checkpoint.data_again(lambda data: _spec(str(data.dataset_path)))
            if (
                spec.categorical != list(model.sparse_feature_names)
                or len(spec.numerical) != model.dense_in_features
                or tuple(spec.numerical) != features.dense_feature_names
            ):
                raise BadInput(
                    f"{checkpoint.data_config().dataset_path} no longer describes the checkpoint's "
                    f"features ({len(spec.numerical)} numerical, {spec.categorical} categorical)"
                )
            label_name = spec.label
        assert features.hotness is not None and features.cardinalities is not None  # a spec declares both
        return Description(
            dense_feature_names=list(features.dense_feature_names),
            sparse_feature_names=list(features.sparse_feature_names),
            sparse_hotness=list(features.hotness),
            num_embeddings_per_feature=list(model.num_embeddings_per_feature),
            preprocessing=FeatureSpecColumns(label_name=label_name, cardinalities=list(features.cardinalities)),
            data_path=checkpoint.data_config().dataset_path,
        )

    @staticmethod
    def training_data(path: str) -> SplitBinaryDataset:
        return SplitBinaryDataset(path)

    def is_labelled(self, data: bytes) -> bool:
        return data.split(b"\n", 1)[0].count(b",") == self.num_dense + self.num_sparse_columns

    def parse(self, data: bytes, source: str, first_line: int, labelled: bool) -> ParsedLines:
        width = self.num_dense + self.num_sparse_columns
        numerical = f"{self.num_dense} numerical, " if self.num_dense else ""  # none: ids only
        features = f"{numerical}{self.num_sparse_columns} categorical ids"
        lines = data.decode("utf-8", errors="replace").splitlines()
        first_columns = lines[0].count(",") + 1 if lines and lines[0].strip() else None
        if first_line == 1 and first_columns not in (None, width, width + 1):
            raise MalformedLineError(
                f"{source} line 1: has {first_columns} columns, expected "
                f"{width + 1} (label, {features}) or {width} without the label"
            )
        expected = (
            f"{width + 1} (label, {features}) as the first line"
            if labelled
            else f"{width} ({features}, no label) as the first line"
        )
        try:
            rows = parse_csv_rows(lines, first_line, width + labelled, expected)
        except CsvRowsError as e:
            raise MalformedLineError(f"{source} line {e.line}: {e.reason}") from None
        first = int(labelled)  # the first feature's column
        dense, sparse = rows[:, first : first + self.num_dense], rows[:, first + self.num_dense :]
        bad = self.find_bad_row(sparse)
        if bad is not None:
            raise MalformedLineError(f"{source} line {first_line + bad[0]}: {bad[1]}")
        return ParsedLines(dense, sparse, rows[:, 0] if labelled else None)

    def find_bad_row(self, sparse: np.ndarray) -> tuple[int, str] | None:
        """The first row holding a value that is no id: not an integer from 0 to 2^31 - 1
        (an id at or above the cardinality is unseen, not bad: see `count_unseen`)."""
        start = 0
        found: tuple[int, str] | None = None
        for name, hotness, _ in self._features:
            bad = find_bad_id(name, sparse[:, start : start + hotness], None)
            if bad is not None and (found is None or bad[0] < found[0]):
                found = bad
            start += hotness
        return found

    def count_unseen(self, sparse: np.ndarray) -> np.ndarray:
        """Ids at or above their feature's cardinality (the transcoder refuses them in
        training data, so no model saw one)."""
        counts, start = [], 0
        for _, hotness, cardinality in self._features:
            counts.append(np.count_nonzero(sparse[:, start : start + hotness] >= cardinality))
            start += hotness
        return np.array(counts, np.int64)

    def column_names(self) -> list[str]:
        return self._column_names

    def _all_columns(self, label: np.ndarray, lines: ParsedLines) -> np.ndarray:
        return np.concatenate([label, lines.dense, lines.sparse], axis=1)

    def transform(self, dense: np.ndarray, sparse: np.ndarray) -> Features:
        # The transcoder stores numerical values as float16: round them the same way.
        return dense.astype(np.float16).astype(np.float32), sparse.astype(np.int64)
