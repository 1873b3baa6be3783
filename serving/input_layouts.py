"""The predictor's input layouts: how whole input lines become a model's features.

One class per layout an export can name (inputs.json "layout"), with one interface:
`InputLayout.is_labelled` judges a file by its first line, `parse` turns whole lines
into the data's features and labels (refusing a malformed line by file and line
number), `transform` applies the training data's transforms, `count_unseen` counts the
ids the training data never held, `column_names`/`columns` give the input columns a
caller may pass through to its output, and `training_data` opens the binary data set
such models train on (for the quality gate).

- `CriteoLines`: raw Criteo lines, tab-separated: label, 13 integer features, 26
  hexadecimal hashes (40 fields), or the same without the label (39 fields); any
  feature may be empty. Transforms: preprocessing's (data/criteo_transforms.py).
- `CsvRows`: BYO CSV rows of a feature-spec model: headerless, comma-separated, the
  label (optional), the numerical values (none for data of categorical features
  only), then each feature's ids (a feature of hotness k takes k columns). Transforms:
  the transcoder's (values rounded to float16). An id at or above its feature's
  cardinality, never in the training data, is not refused: it is counted as unseen
  and taken modulo its table size, as the training loader takes every id beyond its
  table (docs/serving.md, "Unseen ids").
- `ParquetRows`: rows of a model trained with --parquet_path: Parquet tables (the
  predictor reads them by row group: `prepare_table`) or, as lines, JSON objects keyed
  by column name, one per line (the HTTP endpoint; `parse`). Both are converted by
  the training's own `data.parquet_columns.ParquetColumns.convert` (transform and id
  hashing), then each feature's bag is laid into its ``sparse_hotness`` places,
  `PADDING_ID` after its ids. No id is unseen: hashing gives every value a row.

Example::

    layout = load_layout(inputs, "model_dir", manifest)
    lines = layout.parse(b"1\\t5\\t...\\n", "in.tsv", first_line=1, labelled=True)
    dense, ids = layout.transform(lines.dense, lines.sparse)  # ids before the modulo of the table sizes
"""

import io
import json
import os
import re
import zipfile
from abc import ABC, abstractmethod
from typing import Any, NamedTuple, Optional, Union
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from common.errors import BadInput
from common.manifest import ManifestEntry
from data.criteo_binary import CriteoBinaryDataset
from data.criteo_transforms import read_vocabulary, transform_dense, transform_sparse
from data.criteo_layout import NUM_DENSE_FEATURES, NUM_SPARSE_FEATURES
from data.criteo_tsv import NUM_FIELDS, parse_criteo_lines
from data.csv_rows import CsvRowsError, find_bad_id, parse_csv_rows
from data.parquet_columns import ColumnValueError, sparse_value_type
from data.split_binary import SplitBinaryDataset
from serving.model_files import read_file
from serving.model_inputs import (CRITEO_LAYOUT, FEATURE_SPEC_LAYOUT, PADDING_ID, PARQUET_LAYOUT,
                                  CriteoPreprocessing, FeatureSpecColumns, ModelInputs, ParquetPreprocessing)

Features = tuple[np.ndarray, np.ndarray]


class ParsedLines(NamedTuple):
    """Whole lines' features as the data gives them, and their labels.

    Args:
        dense: (N, num_dense).
        sparse: (N, sum of hotness).
        labels: (N,) 0/1, or None for lines without a label.
    """

    dense: np.ndarray
    sparse: np.ndarray
    labels: Optional[np.ndarray]


class MalformedLineError(BadInput):
    """An input line not in the model's input layout; the message names the file and line."""


class InputLayout(ABC):
    """Whole lines of one layout -> the data's features -> the model's inputs.

    Args:
        inputs: the export's inputs.json.
    """

    def __init__(self, inputs: ModelInputs) -> None:
        self.num_dense = inputs.num_dense_features
        self.num_sparse_columns = int(sum(inputs.sparse_hotness))

    @classmethod
    def load(cls, inputs: ModelInputs, model_dir: str, manifest: Optional[dict[str, ManifestEntry]]) -> "InputLayout":
        """The layout of an exported model directory (reading the files it needs)."""
        return cls(inputs)

    @staticmethod
    @abstractmethod
    def training_data(path: str) -> Union[CriteoBinaryDataset, SplitBinaryDataset]:
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

    def find_bad_row(self, sparse: np.ndarray) -> Optional[tuple[int, str]]:
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


class CriteoLines(InputLayout):
    """Raw Criteo lines (see the module docstring).

    Args:
        inputs: the export's inputs.json (its preprocessing a `CriteoPreprocessing`).
        vocabulary: each feature's kept hashes, for data made with a frequency threshold.
    """

    def __init__(self, inputs: ModelInputs, vocabulary: Optional[list[np.ndarray]] = None) -> None:
        super().__init__(inputs)
        preprocessing = inputs.preprocessing
        assert isinstance(preprocessing, CriteoPreprocessing)
        modulo = preprocessing.modulo_num_embeddings_per_feature
        self._modulo = None if modulo is None else np.asarray(modulo, dtype=np.int64)
        self._vocabulary = vocabulary
        self._num_features = len(inputs.sparse_feature_names)

    @classmethod
    def load(cls, inputs: ModelInputs, model_dir: str, manifest: Optional[dict[str, ManifestEntry]]) -> "CriteoLines":
        name = inputs.preprocessing.vocabulary  # type: ignore[union-attr]
        if not name:
            return cls(inputs)
        data = read_file(model_dir, name, manifest)
        try:  # np.load refuses pickled arrays by default
            return cls(inputs, read_vocabulary(io.BytesIO(data), len(inputs.sparse_feature_names)))
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
            raise BadInput(f"{os.path.join(model_dir, name)}: not the model's vocabulary "
                           f"({type(e).__name__}: {e})") from e

    @staticmethod
    def training_data(path: str) -> CriteoBinaryDataset:
        return CriteoBinaryDataset(path)

    def is_labelled(self, data: bytes) -> bool:
        return data.split(b"\n", 1)[0].count(b"\t") != NUM_FIELDS - 2

    def parse(self, data: bytes, source: str, first_line: int, labelled: bool) -> Features:
        if not labelled:  # give every line a dummy label: one parser for both layouts
            data = b"0\t" + data.replace(b"\n", b"\n0\t")
            data = data[:-2] if data.endswith(b"\n0\t") else data
        chunk = parse_criteo_lines(data)
        if chunk.bad_lines:
            index, reason = chunk.bad_lines[0]
            raise MalformedLineError(f"{source} line {first_line + index}: {self._reason(reason, labelled)}")
        return ParsedLines(chunk.dense_raw, chunk.sparse_hash, chunk.labels if labelled else None)

    @staticmethod
    def _reason(reason: str, labelled: bool) -> str:
        """The parser's reason, in the terms of the input's own layout."""
        match = re.match(r"expected \d+ tab-separated fields, found (\d+)", reason)
        if match:
            found = int(match.group(1)) - (not labelled)
            return (f"expected {NUM_FIELDS} tab-separated fields (label, {NUM_DENSE_FEATURES} integer, {NUM_SPARSE_FEATURES} categorical) "
                    f"or {NUM_FIELDS - 1} without the label, found {found}")
        return reason

    def count_unseen(self, sparse: np.ndarray) -> np.ndarray:
        """Hashes missing from the vocabulary (preprocessing maps them to its
        out-of-vocabulary id 0, and so does the predictor); an empty field (hash 0) is
        not counted. Without a vocabulary every hash has its id (its low 31 bits, modulo
        the table size, as in training): none is unseen."""
        if self._vocabulary is None:
            return np.zeros(self._num_features, np.int64)
        return np.array([np.count_nonzero((sparse[:, f] != 0) & ~np.isin(sparse[:, f], vocab))
                         for f, vocab in enumerate(self._vocabulary)], np.int64)

    def column_names(self) -> list[str]:
        return ["label"]  # the raw features are hashes: the label is what a scorer keeps

    def _all_columns(self, label: np.ndarray, lines: ParsedLines) -> np.ndarray:
        return label

    def transform(self, dense: np.ndarray, sparse: np.ndarray) -> Features:
        ids = transform_sparse(sparse.astype(np.uint32), self._vocabulary, self._modulo).astype(np.int64)
        return transform_dense(dense.astype(np.int64)), ids


class CsvRows(InputLayout):
    """BYO CSV rows of a feature-spec model (see the module docstring).

    Args:
        inputs: the export's inputs.json (its preprocessing a `FeatureSpecColumns`).
    """

    def __init__(self, inputs: ModelInputs) -> None:
        super().__init__(inputs)
        columns = inputs.preprocessing
        assert isinstance(columns, FeatureSpecColumns)
        self._features = list(zip(inputs.sparse_feature_names, inputs.sparse_hotness, columns.cardinalities))
        self._column_names = inputs.csv_columns

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
            raise MalformedLineError(f"{source} line 1: has {first_columns} columns, expected "
                                     f"{width + 1} (label, {features}) or {width} without the label")
        expected = (f"{width + 1} (label, {features}) as the first line" if labelled
                    else f"{width} ({features}, no label) as the first line")
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

    def find_bad_row(self, sparse: np.ndarray) -> Optional[tuple[int, str]]:
        """The first row holding a value that is no id: not an integer from 0 to 2^31 - 1
        (an id at or above the cardinality is unseen, not bad: see `count_unseen`)."""
        start = 0
        found: Optional[tuple[int, str]] = None
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


class ParquetRows(InputLayout):
    """Rows of a model trained with --parquet_path (see the module docstring).

    A JSON row must name every dense and sparse column (null where the value is
    missing: 0 for a dense column, an empty bag for a sparse one, as a Parquet null in
    training); other keys (the label, a request id) are ignored. Sparse values must be
    of the type training read (integers and strings hash differently).

    Args:
        inputs: the export's inputs.json (its preprocessing a `ParquetPreprocessing`).
    """

    def __init__(self, inputs: ModelInputs) -> None:
        super().__init__(inputs)
        preprocessing = inputs.preprocessing
        assert isinstance(preprocessing, ParquetPreprocessing)
        self.columns = inputs.parquet_columns()
        self._value_types = dict(zip(inputs.sparse_feature_names, preprocessing.sparse_value_types))
        self._hotness = list(inputs.sparse_hotness)
        self._starts = np.cumsum([0] + self._hotness[:-1])

    @staticmethod
    def training_data(path: str) -> Any:
        raise BadInput("the quality gate reads binary training data; check a Parquet model with "
                       "python -m serving.predict --metrics_output on a labelled Parquet day")

    def is_labelled(self, data: bytes) -> bool:
        return False  # JSON rows are scored; a label key is ignored like any other extra key

    def parse(self, data: bytes, source: str, first_line: int, labelled: bool,
              missing_as_null: bool = False) -> ParsedLines:
        """JSON objects, one per line (blank lines skipped), keyed by column name; a
        line nested deeper than a row can be is refused before it is parsed. A row
        without one of the model's columns is refused, unless ``missing_as_null`` (the
        caller asked for it explicitly: a misspelt key then reads as null)."""
        rows, line_of_row = [], []
        for index, line in enumerate(data.splitlines()):
            if not line.strip():
                continue
            if _nested_deeper(line, _JSON_ROW_DEPTH):
                raise MalformedLineError(f"{source} line {first_line + index}: JSON nested deeper than a row "
                                         f"({_JSON_ROW_DEPTH} levels: an object of columns, lists of ids)")
            try:
                row = json.loads(line)
            except ValueError as e:  # UnicodeDecodeError too
                raise MalformedLineError(f"{source} line {first_line + index}: not JSON ({e})") from None
            if not isinstance(row, dict):
                raise MalformedLineError(f"{source} line {first_line + index}: expected a JSON object keyed by "
                                         f"column name, got {type(row).__name__}")
            rows.append(row)
            line_of_row.append(first_line + index)
        table = self._json_table(rows, lambda row: f"{source} line {line_of_row[row]}", missing_as_null)
        return self.prepare_table(table, lambda row: f"{source} line {line_of_row[row]}", labelled=False)

    def check_schema(self, schema: pa.Schema, where: str, labelled: bool) -> None:
        """Refuses a Parquet input whose schema lacks a column, gives one a type
        conversion refuses, or gives a sparse column another value type than training's."""
        self.columns.check_schema(schema, where, labelled)
        for name, expected in self._value_types.items():
            found = sparse_value_type(schema.field(name).type)
            if found != expected:
                raise BadInput(f"{where}: column {name} holds {found.replace('_', ' ')} values, but the model "
                               f"was trained on {expected.replace('_', ' ')} values (they hash to other rows)")

    def prepare_table(self, table: Union[pa.Table, pa.RecordBatch], where: Callable[[int], str],
                      labelled: bool) -> ParsedLines:
        """The model's inputs of a block of rows whose schema passed `check_schema`:
        dense (N, num_dense) float32 transformed, ids (N, sum of hotness) in the tables
        with `PADDING_ID` after each bag, the labels (``labelled``) or None.

        Args:
            where: a row of the block -> where it is, for errors ("FILE row group 2 row 5").

        Raises MalformedLineError naming the row and the column: a value conversion
        refuses, a bag longer than its feature's places.
        """
        try:
            converted = self.columns.convert(table, labelled)
        except ColumnValueError as e:
            raise MalformedLineError(f"{where(e.row)} column {e.column}: {e.what}") from None
        ids = np.full((converted.num_rows, int(sum(self._hotness))), PADDING_ID, dtype=np.int64)
        for f, (name, places) in enumerate(zip(self.columns.sparse, self._hotness)):
            lengths = converted.lengths[f]
            too_long = lengths > places
            if too_long.any():
                row = int(np.argmax(too_long))
                raise MalformedLineError(f"{where(row)} column {name}: a bag of {lengths[row]} ids, more than the "
                                         f"{places} places the model was exported with (serving.export "
                                         "--max_bag_size)")
            row_of_id = np.repeat(np.arange(len(lengths)), lengths)
            place = np.arange(len(row_of_id)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            ids[row_of_id, self._starts[f] + place] = converted.ids[f]
        return ParsedLines(converted.dense, ids, converted.labels)

    def _json_table(self, rows: list[dict[str, Any]], where: Callable[[int], str],
                    missing_as_null: bool = False) -> pa.Table:
        """The Arrow table of JSON rows, each column of the type training read; a
        missing column (unless ``missing_as_null``) or a value of another type is
        refused naming the row."""
        arrays = {}
        for name in self.columns.dense:
            arrays[name] = pa.array(self._column(rows, name, where, _is_number, "a number or null", missing_as_null),
                                    pa.float64())
        for name in self.columns.sparse:
            kind = self._value_types[name]
            single = _is_json_int if kind.startswith("integer") else _is_text
            words = "an integer id" if kind.startswith("integer") else "a string id"
            if kind.endswith("_list"):
                values = self._column(rows, name, where,
                                      lambda v: isinstance(v, list) and all(x is None or single(x) for x in v),
                                      f"a list of {words}s, or null", missing_as_null)
            else:
                values = self._column(rows, name, where, single, f"{words} or null", missing_as_null)
            arrays[name] = pa.array(values, _ARROW_TYPES[kind])
        return pa.table(arrays)

    @staticmethod
    def _column(rows: list[dict[str, Any]], name: str, where: Callable[[int], str],
                accepts: Callable[[Any], bool], expected: str, missing_as_null: bool = False) -> list[Any]:
        values = []
        for row, values_of_row in enumerate(rows):
            if name not in values_of_row and not missing_as_null:
                raise MalformedLineError(f"{where(row)} column {name}: missing (send null for a missing value, "
                                         "or POST to /predict?missing=null)")
            value = values_of_row.get(name)
            if value is not None and not accepts(value):
                raise MalformedLineError(f"{where(row)} column {name}: expected {expected}, "
                                         f"got {json.dumps(value)[:40]}")
            values.append(_as_int64(value))
        return values

    def count_unseen(self, sparse: np.ndarray) -> np.ndarray:
        """None: the hash gives every value a row (its collisions are training's statistics)."""
        return np.zeros(len(self._hotness), np.int64)

    def column_names(self) -> list[str]:
        return []  # Parquet output keeps any input column (serving.predict reads them from the table)

    def _all_columns(self, label: np.ndarray, lines: ParsedLines) -> np.ndarray:
        return label[:, :0]

    def transform(self, dense: np.ndarray, sparse: np.ndarray) -> Features:
        return dense, sparse  # `prepare_table` converted the rows as training did


# A JSON row nests two levels: the object of columns, a list column's list of ids.
_JSON_ROW_DEPTH = 2
# What nesting depends on: every byte but quotes and brackets goes (after escapes).
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'"[]{}')))
_ESCAPE = re.compile(rb"\\.", re.S)
_STRING = re.compile(rb'"[^"]*"')


def _nested_deeper(line: bytes, limit: int) -> bool:
    """Whether the brackets of a JSON line, strings aside, nest deeper than ``limit``.
    json.loads recurses once per level (100,000 nested brackets raise RecursionError),
    so this is asked before; a few microseconds a row (the line is reduced to its
    quotes and brackets first)."""
    if line.count(b"[") + line.count(b"{") <= limit:
        return False  # too few to nest deeper: a row of single values, at no cost
    if b"\\" in line:
        line = _ESCAPE.sub(b"", line)  # an escaped quote does not end its string
    depth = 0
    for bracket in _STRING.sub(b"", line.translate(None, _NOT_STRUCTURE)):
        depth += 1 if bracket in b"[{" else -1
        if depth > limit:
            return True
    return False


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_json_int(value: Any) -> bool:
    """An id a Parquet integer column can hold: int64 or uint64 (same 64-bit key)."""
    return isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < (1 << 64)


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _as_int64(value: Any) -> Any:
    """A uint64 id above int64's range as the int64 of the same 64 bits (the hash key
    of both, data.id_hashing.integer_keys); anything else as it is."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1 << 63:
        return value - (1 << 64)
    if isinstance(value, list):
        return [_as_int64(v) for v in value]
    return value


_ARROW_TYPES = {"integer": pa.int64(), "string": pa.string(), "integer_list": pa.list_(pa.int64()),
                "string_list": pa.list_(pa.string())}


LAYOUTS: dict[str, type[InputLayout]] = {CRITEO_LAYOUT: CriteoLines, FEATURE_SPEC_LAYOUT: CsvRows,
                                         PARQUET_LAYOUT: ParquetRows}


def load_layout(inputs: ModelInputs, model_dir: str, manifest: Optional[dict[str, ManifestEntry]]) -> InputLayout:
    """The input layout an exported model directory names, ready to parse lines."""
    return LAYOUTS[inputs.layout].load(inputs, model_dir, manifest)
