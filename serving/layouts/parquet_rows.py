"""The ``parquet_columns`` layout: rows of a model trained with --parquet_path.

Parquet tables (the predictor reads them by row group: `ParquetRows.prepare_table`) or,
as lines, JSON objects keyed by column name, one per line (the HTTP endpoint;
`ParquetRows.parse`). Both are converted by the training's own
`data.parquet.columns.ParquetColumns.convert` (transform and id hashing), then each
feature's bag is laid into its ``sparse_hotness`` places, `PADDING_ID` after its ids.
Hashing gives every value a row: an id is unseen when the training split's Bloom filter
(inputs.json's ``id_sketch``, the directory's ``id_sketch.bin``; data/parquet/id_sketch.py)
lacks it, counted by `prepare_table` (a model exported without one counts none).

A model with history features (inputs.json's ``histories``) reads each from its list
column (a JSON list of raw ids, oldest first; null or [] for none): its ids are hashed
as its item column's (the item's table size, the same seed; a history of a string item
holds strings), counted unseen against the item's filter, and a history longer than
``max_history`` keeps its newest, as training's data did. They take ``max_history``
places each after the categorical features' (`InputLayout.HISTORIES`). A
vocabulary model (--id_hashing vocabulary) maps ids through the directory's
``id_vocabulary.bin`` (inputs.json's ``id_vocabulary``; data/parquet/id_vocabulary.py)
and counts an id training never read exactly.
"""

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa

from common.errors import BadInput
from common.json_fields import OBJECT, FileFieldError, JsonObject, Kind, one_of, optional, text_list
from data.config import DENSE_TRANSFORMS, ID_HASHING
from data.parquet.columns import SPARSE_VALUE_TYPES, ColumnValueError, ParquetColumns, sparse_value_type
from data.parquet.files import list_files, read_footers
from serving.layouts.base import (
    PADDING_ID,
    Checkpoint,
    CountedLines,
    DeltaSketch,
    Description,
    Features,
    InputLayout,
    LayoutRecord,
    MalformedLineError,
    ParsedLines,
)

if TYPE_CHECKING:
    from serving.model_inputs import ModelInputs

_COLUMN_NAME = Kind(lambda v: isinstance(v, str) and bool(v), "a column name")
_HASH_SEED = Kind(
    lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64, "an integer from 0 to 2^64 - 1"
)
_VALUE_TYPES_BY_COLUMN = Kind(
    lambda v: isinstance(v, dict) and all(t in SPARSE_VALUE_TYPES for t in v.values()),
    f"an object of column: one of {', '.join(SPARSE_VALUE_TYPES)}",
)


def _value_types(count: int) -> Kind:
    return Kind(
        lambda v: isinstance(v, list) and len(v) == count and all(t in SPARSE_VALUE_TYPES for t in v),
        f"{count} of {', '.join(SPARSE_VALUE_TYPES)}",
    )


@dataclass
class ParquetPreprocessing(LayoutRecord):
    """Parquet rows (and the HTTP endpoint's JSON objects keyed by column name),
    converted as training did: through `data.parquet.columns.ParquetColumns` (the
    dense and sparse columns are the model's feature names, the table sizes its
    tables'; `parquet_columns`).

    Args:
        label: the label column.
        weight: the training's sample weight column, if any (serving does not read it).
        dense_transform: log1p or none.
        id_hashing: hash, modulo or vocabulary.
        hash_seed: the seed of the hash.
        sparse_value_types: per sparse column, one of `SPARSE_VALUE_TYPES`; a
            list column's bags are cut into ``sparse_hotness`` places (a longer bag is
            refused), a single value's into one.
    """

    LAYOUT: ClassVar[str] = "parquet_columns"
    PADDED: ClassVar[bool] = True
    label: str
    weight: str | None
    dense_transform: str
    id_hashing: str
    hash_seed: int
    sparse_value_types: list[str]
    # The seen-id filters' facts (data/parquet/id_sketch.py: hashes, seed, bits, ids,
    # false_positive_rate, per feature); their bits are the model directory's SKETCH_FILE.
    # None: a model exported without them (modulo ids, or an older checkpoint).
    id_sketch: dict[str, Any] | None = None
    # --id_hashing vocabulary: the vocabulary's facts (data/parquet/id_vocabulary.py:
    # version, min_id_count, kept and rare ids per feature, sha256); its keys are the
    # model directory's id vocabulary file. None: a model of another id mapping.
    id_vocabulary: dict[str, Any] | None = None
    # --id_hashing zch: the id map's facts (data/parquet/zch_map.py: version, hash_seed,
    # buckets, live ids and shard boundaries per feature, sha256); its ids and rows are
    # the model directory's ZCH_MAP_FILE. None: a model of another id mapping.
    zch_ids: dict[str, Any] | None = None

    @classmethod
    def read(cls, document: JsonObject, legacy: bool, count: int) -> "ParquetPreprocessing":
        source = document.object("preprocessing")
        sparse = document.get("sparse_feature_names", text_list(count))
        sketch = source.get("id_sketch", optional(OBJECT), None)
        vocabulary = source.get("id_vocabulary", optional(OBJECT), None)
        zch_ids = source.get("zch_ids", optional(OBJECT), None)
        return cls(
            zch_ids=None if zch_ids is None else zch_record(zch_ids, sparse, document.path),
            id_sketch=None if sketch is None else sketch_record(source.object("id_sketch"), sparse),
            id_vocabulary=None if vocabulary is None else vocabulary_record(vocabulary, sparse, document.path),
            label=source.get("label", _COLUMN_NAME),
            weight=source.get("weight", optional(_COLUMN_NAME)),
            dense_transform=source.get("dense_transform", one_of(*DENSE_TRANSFORMS)),
            id_hashing=source.get("id_hashing", one_of(*ID_HASHING)),
            hash_seed=source.get("hash_seed", _HASH_SEED),
            sparse_value_types=source.get("sparse_value_types", _value_types(count)),
        )

    def check(self, dense: list[str], sparse: list[str], hotness: list[int], path: str) -> None:
        """Refuses a description its own fields contradict: a column named twice (the
        label among the features, a feature twice), a single-valued column given more
        than one place."""
        if (self.id_hashing == "vocabulary") != (self.id_vocabulary is not None):
            raise FileFieldError(
                f"{path}: preprocessing.id_vocabulary is given exactly when preprocessing.id_hashing is "
                f"vocabulary (id_hashing {self.id_hashing}, id_vocabulary "
                f"{'given' if self.id_vocabulary is not None else 'missing'})"
            )
        if (self.id_hashing == "zch") != (self.zch_ids is not None):
            raise FileFieldError(
                f"{path}: preprocessing.zch_ids is given exactly when preprocessing.id_hashing is zch "
                f"(id_hashing {self.id_hashing}, zch_ids {'given' if self.zch_ids is not None else 'missing'})"
            )
        names = [self.label, *dense, *sparse]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise FileFieldError(
                f"{path}: column {repeated[0]} is named twice among the label, "
                "dense_feature_names and sparse_feature_names"
            )
        for name, kind, places in zip(sparse, self.sparse_value_types, hotness):
            if not kind.endswith("_list") and places != 1:
                raise FileFieldError(
                    f"{path}: sparse_hotness of {name} is {places}, but its values are single {kind}s (one place)"
                )


def sketch_record(record: JsonObject, sparse: list[str]) -> dict[str, Any]:
    """The ``id_sketch`` facts of meta.json's serving_facts or inputs.json, checked: this
    code's hash count and seed, and per sparse feature a bit count (a power of two, a whole
    number of bytes), an id count and a false-positive rate."""
    from data.parquet.id_sketch import HASHES, SKETCH_SEED

    record.get("hashes", Kind(lambda v: v == HASHES, f"{HASHES} (this code's hash count)"))
    record.get("seed", Kind(lambda v: v == SKETCH_SEED, f"{SKETCH_SEED} (this code's seed)"))
    per_feature = {
        "bits": Kind(lambda v: _is_json_int(v) and v >= 8 and v & (v - 1) == 0, "a power of two of at least 8"),
        "ids": Kind(lambda v: _is_json_int(v) and v >= 0, "a count"),
        "false_positive_rate": Kind(lambda v: _is_number(v) and 0 <= v <= 1, "a share between 0 and 1"),
    }
    for field, kind in per_feature.items():
        values = record.object(field)
        for name in sparse:
            values.get(name, kind)
    return record.value


def vocabulary_record(record: dict[str, Any], sparse: list[str], path: str) -> dict[str, Any]:
    """The ``id_vocabulary`` facts of meta.json's serving_facts or inputs.json, checked
    (data.parquet.id_vocabulary.check_facts): this code's version, the model's features."""
    from data.parquet.id_vocabulary import VocabularyError, check_facts

    try:
        check_facts(record, sparse)
    except VocabularyError as e:
        raise FileFieldError(f"{path}: {e}") from None
    return record


def zch_record(record: dict[str, Any], sparse: list[str], path: str) -> dict[str, Any]:
    """The ``zch_ids`` facts of inputs.json, checked (data.parquet.zch_map.check_facts)."""
    from data.parquet.zch_map import ZchMapError, check_facts

    try:
        check_facts(record, sparse)
    except ZchMapError as e:
        raise FileFieldError(f"{path}: {e}") from None
    return record


def parquet_columns(inputs: "ModelInputs") -> ParquetColumns:
    """A Parquet model's columns, as its training converted rows (without the weight:
    serving reads none)."""
    columns = inputs.preprocessing
    assert isinstance(columns, ParquetPreprocessing)
    return ParquetColumns(
        label=columns.label,
        dense=tuple(inputs.dense_feature_names),
        sparse=tuple(inputs.sparse_feature_names),
        table_sizes=tuple(inputs.num_embeddings_per_feature),
        dense_transform=columns.dense_transform,
        id_hashing=columns.id_hashing,
        hash_seed=columns.hash_seed,
        # The histories as training read them: hashed as their items, cut to their newest.
        sequences=tuple((h.name, h.item) for h in inputs.histories),
        max_history=max((h.max_history for h in inputs.histories), default=0),
    )


def _training_schema(path: str) -> pa.Schema:
    """The schema of the training table (its first file's footer and partitions)."""
    filesystem, root, files = list_files(path)
    return read_footers(filesystem, root, files[:1])[2]


class ParquetRows(InputLayout):
    """Rows of a model trained with --parquet_path (see the module docstring).

    A JSON row must name every dense and sparse column (null where the value is
    missing: 0 for a dense column, an empty bag for a sparse one, as a Parquet null in
    training); other keys (the label, a request id) are ignored. Sparse values must be
    of the type training read (integers and strings hash differently).

    Args:
        inputs: the export's inputs.json (its preprocessing a `ParquetPreprocessing`).
    """

    record = ParquetPreprocessing
    HISTORIES = True

    def __init__(self, inputs: "ModelInputs") -> None:
        super().__init__(inputs)
        preprocessing = inputs.preprocessing
        assert isinstance(preprocessing, ParquetPreprocessing)
        self._preprocessing = preprocessing
        self.columns = parquet_columns(inputs)
        self._value_types = dict(zip(inputs.sparse_feature_names, preprocessing.sparse_value_types))
        # The history columns, converted as lists of their items' ids: the items' table sizes and hashing.
        self.histories = list(inputs.histories)
        self.history_names = [h.name for h in self.histories]
        self._items = [inputs.sparse_feature_names.index(h.item) for h in self.histories]
        for h in self.histories:  # a list of the item's values, whether the item is single or a list
            self._value_types[h.name] = self._value_types[h.item].removesuffix("_list") + "_list"
        self._hotness = list(inputs.sparse_hotness)
        # The places of each feature's ids: the categorical features', then each history's max_history.
        self._places = [*self._hotness, *(h.max_history for h in self.histories)]
        self._starts = np.cumsum([0] + self._places[:-1])
        self.sketches: list[Any] | None = (
            None  # `read_own_files` reads them: data.parquet.id_sketch.IdSketch per feature
        )

    def read_own_files(self, model_dir: str, manifest: Any, delta_sketch: DeltaSketch | None = None) -> None:
        """The id vocabulary and the seen-id filters of the model directory when inputs.json
        records them (a delta export's own: its base's are an older model's)."""
        if self._preprocessing.id_vocabulary is not None:
            self._load_vocabulary(model_dir, manifest)
        if self._preprocessing.zch_ids is not None:
            self._load_zch_map(model_dir, manifest)
        facts = self._preprocessing.id_sketch
        if facts is not None:
            from data.parquet.id_sketch import SKETCH_FILE, sketches_from_bytes
            from serving.model_files import read_file

            names = list(self.columns.sparse)  # the sparse features, in order (not the histories)
            if delta_sketch is not None and self.sketches is not None:
                # A delta export's filters: the bytes changed since its base's, read just before.
                data = b"".join(f.tobytes() for f in delta_sketch([s.packed for s in self.sketches], names))
            else:
                data = read_file(model_dir, SKETCH_FILE, manifest)
            self.sketches = sketches_from_bytes(
                data, [facts["bits"][n] for n in names], [facts["ids"][n] for n in names]
            )
            if self.sketches is None:
                raise BadInput(
                    f"{model_dir}/{SKETCH_FILE}: {len(data)} bytes, not the seen-id filters inputs.json describes "
                    f"({sum(facts['bits'][n] for n in names) // 8} bytes)"
                )

    def _load_vocabulary(self, model_dir: str, manifest: Any) -> None:
        """Reads the model directory's id vocabulary, refusing one whose bytes or sizes are
        not those inputs.json records (another model's, or a file that lies)."""
        import dataclasses

        from data.parquet.id_vocabulary import VOCABULARY_FILE, IdVocabulary, VocabularyError, check_facts
        from serving.model_files import read_file

        facts = self._preprocessing.id_vocabulary
        names = list(self.columns.sparse)
        try:
            check_facts(facts, names, list(self.columns.table_sizes))
            vocabulary = IdVocabulary.from_bytes(read_file(model_dir, VOCABULARY_FILE, manifest), names, facts)
        except VocabularyError as e:
            raise BadInput(f"{model_dir}/{VOCABULARY_FILE}: {e}") from None
        self.columns = dataclasses.replace(self.columns, vocabulary=vocabulary)

    def _load_zch_map(self, model_dir: str, manifest: Any) -> None:
        """Reads the model directory's zch id map (maps ids to rows and counts the unseen,
        through the columns' ``vocabulary``), refusing one that is not what inputs.json records."""
        import dataclasses

        from data.parquet.zch_map import ZCH_MAP_FILE, ZchIdMap, ZchMapError
        from serving.model_files import read_file

        names = list(self.columns.sparse)
        try:
            data = read_file(model_dir, ZCH_MAP_FILE, manifest)
            zch_map = ZchIdMap.from_bytes(data, names, self._preprocessing.zch_ids, list(self.columns.table_sizes))
        except ZchMapError as e:
            raise BadInput(f"{model_dir}/{ZCH_MAP_FILE}: {e}") from None
        self.columns = dataclasses.replace(self.columns, vocabulary=zch_map)

    @staticmethod
    def describe(checkpoint: Checkpoint) -> Description:
        """Its columns, transform and hashing (the checkpoint's data flags and features,
        the model's table sizes) and each sparse column's value type (the ids' type
        decides their hash), which meta.json records; of an older checkpoint, read from
        the training table's schema again. A list column's bag gets ``max_bag_size``
        places, a single value one."""
        meta, model = checkpoint.meta, checkpoint.model
        data_config = checkpoint.data_config()
        columns = ParquetColumns.from_flags(data_config, meta.features, model.num_embeddings_per_feature)
        if list(columns.sparse) != list(model.sparse_feature_names) or len(columns.dense) != model.dense_in_features:
            raise BadInput(
                f"--parquet_path {data_config.parquet_path} no longer has the checkpoint's features "
                f"({len(columns.dense)} dense, sparse {', '.join(columns.sparse)})"
            )
        facts = checkpoint.facts()
        if facts is not None:
            recorded = facts.get("sparse_value_types", _VALUE_TYPES_BY_COLUMN)
            missing = [name for name in columns.sparse if name not in recorded]
            if missing:
                raise FileFieldError(
                    f"{checkpoint.meta_path}: serving_facts.sparse_value_types has no "
                    f"{missing[0]}, a sparse column of the model"
                )
            value_types = [recorded[name] for name in columns.sparse]
        else:
            schema = checkpoint.data_again(lambda data: _training_schema(data.parquet_path or ""))
            columns.check_schema(schema, data_config.parquet_path or "")
            value_types = [sparse_value_type(schema.field(name).type) for name in columns.sparse]
        sketch = None
        if facts is not None and facts.get("id_sketch", optional(OBJECT), None) is not None:
            sketch = sketch_record(facts.object("id_sketch"), list(columns.sparse))
        vocabulary = None
        if facts is not None and facts.get("id_vocabulary", optional(OBJECT), None) is not None:
            vocabulary = vocabulary_record(facts.value["id_vocabulary"], list(columns.sparse), checkpoint.meta_path)
        return Description(
            dense_feature_names=list(columns.dense),
            sparse_feature_names=list(columns.sparse),
            sparse_hotness=[checkpoint.max_bag_size if kind.endswith("_list") else 1 for kind in value_types],
            num_embeddings_per_feature=list(columns.table_sizes),
            preprocessing=ParquetPreprocessing(
                label=columns.label,
                weight=columns.weight,
                dense_transform=columns.dense_transform,
                id_hashing=columns.id_hashing,
                hash_seed=columns.hash_seed,
                sparse_value_types=value_types,
                id_sketch=sketch,
                id_vocabulary=vocabulary,
            ),
            data_path=data_config.parquet_path,
        )

    @staticmethod
    def training_data(path: str) -> Any:
        # serving.quality_gate reads the Parquet rows its --data names instead (ParquetInput).
        raise BadInput("a model trained on Parquet has no binary training data: name labelled Parquet rows")

    def is_labelled(self, data: bytes) -> bool:
        return False  # JSON rows are scored; a label key is ignored like any other extra key

    def parse(
        self, data: bytes, source: str, first_line: int, labelled: bool, missing_as_null: bool = False
    ) -> ParsedLines:
        """JSON objects, one per line (blank lines skipped), keyed by column name; a
        line nested deeper than a row can be is refused before it is parsed. A row
        without one of the model's columns is refused, unless ``missing_as_null`` (the
        caller asked for it explicitly: a misspelt key then reads as null)."""
        rows, line_of_row = [], []
        for index, line in enumerate(data.splitlines()):
            if not line.strip():
                continue
            if _nested_deeper(line, _JSON_ROW_DEPTH):
                raise MalformedLineError(
                    f"{source} line {first_line + index}: JSON nested deeper than a row "
                    f"({_JSON_ROW_DEPTH} levels: an object of columns, lists of ids)"
                )
            try:
                row = json.loads(line)
            except ValueError as e:  # UnicodeDecodeError too
                raise MalformedLineError(f"{source} line {first_line + index}: not JSON ({e})") from None
            if not isinstance(row, dict):
                raise MalformedLineError(
                    f"{source} line {first_line + index}: expected a JSON object keyed by "
                    f"column name, got {type(row).__name__}"
                )
            rows.append(row)
            line_of_row.append(first_line + index)
        table = self._json_table(rows, lambda row: f"{source} line {line_of_row[row]}", missing_as_null)
        return self.prepare_table(table, lambda row: f"{source} line {line_of_row[row]}", labelled=False)

    def check_schema(self, schema: pa.Schema, where: str, labelled: bool) -> None:
        """Refuses a Parquet input whose schema lacks a column, gives one a type
        conversion refuses, or gives a sparse column another value type than training's."""
        self.columns.check_schema(schema, where, labelled)
        for name in self.history_names:
            if schema.get_field_index(name) < 0:
                raise BadInput(f"{where}: no column {name} (a history column; the file has {', '.join(schema.names)})")
        for name, expected in self._value_types.items():
            found = sparse_value_type(schema.field(name).type)
            if found != expected:
                raise BadInput(
                    f"{where}: column {name} holds {found.replace('_', ' ')} values, but the model "
                    f"was trained on {expected.replace('_', ' ')} values (they hash to other rows)"
                )

    def prepare_table(
        self, table: pa.Table | pa.RecordBatch, where: Callable[[int], str], labelled: bool
    ) -> ParsedLines:
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
        ids = np.full((converted.num_rows, int(sum(self._places))), PADDING_ID, dtype=np.int64)
        # The histories come cut to their newest max_history: never longer than their places.
        for f, (name, places) in enumerate(zip(self.columns.kjt_keys, self._places)):
            lengths = converted.lengths[f]
            too_long = lengths > places
            if too_long.any():
                row = int(np.argmax(too_long))
                raise MalformedLineError(
                    f"{where(row)} column {name}: a bag of {lengths[row]} ids, more than the "
                    f"{places} places the model was exported with (serving.export "
                    "--max_bag_size)"
                )
            row_of_id = np.repeat(np.arange(len(lengths)), lengths)
            place = np.arange(len(row_of_id)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            ids[row_of_id, self._starts[f] + place] = converted.ids[f]
        lines = ParsedLines(converted.dense, ids, converted.labels)
        if self.columns.vocabulary is not None:  # exact: an id the training split never read
            features = [*range(len(self.columns.sparse)), *self._items]  # a history's vocabulary is its item's
            return CountedLines.of(lines, np.array(self.columns.vocabulary.unseen(converted.keys, features), np.int64))
        if self.sketches is None:
            return lines
        # An id the training split's filter lacks is new; a history's, when its item's filter lacks it.
        sketches = [*self.sketches, *(self.sketches[f] for f in self._items)]
        unseen = np.array([int((~s.contains(k)).sum()) for s, k in zip(sketches, converted.keys)], np.int64)
        return CountedLines.of(lines, unseen)

    def _json_table(
        self, rows: list[dict[str, Any]], where: Callable[[int], str], missing_as_null: bool = False
    ) -> pa.Table:
        """The Arrow table of JSON rows, each column of the type training read; a
        missing column (unless ``missing_as_null``) or a value of another type is
        refused naming the row."""
        arrays = {}
        for name in self.columns.dense:
            arrays[name] = pa.array(
                self._column(rows, name, where, _is_number, "a number or null", missing_as_null), pa.float64()
            )
        for name in (*self.columns.sparse, *self.history_names):
            kind = self._value_types[name]
            single = _is_json_int if kind.startswith("integer") else _is_text
            words = "integer id" if kind.startswith("integer") else "string id"
            if name in self.history_names:
                values = self._column(
                    rows,
                    name,
                    where,
                    lambda v: isinstance(v, list) and all(x is None or single(x) for x in v),
                    f"a history: a list of {words}s (those of its item column), oldest first, or null",
                    missing_as_null,
                )
            elif kind.endswith("_list"):
                values = self._column(
                    rows,
                    name,
                    where,
                    lambda v: isinstance(v, list) and all(x is None or single(x) for x in v),
                    f"a list of {words}s, or null",
                    missing_as_null,
                )
            else:
                article = "an" if words.startswith("integer") else "a"
                values = self._column(rows, name, where, single, f"{article} {words} or null", missing_as_null)
            arrays[name] = pa.array(values, _ARROW_TYPES[kind])
        return pa.table(arrays)

    @staticmethod
    def _column(
        rows: list[dict[str, Any]],
        name: str,
        where: Callable[[int], str],
        accepts: Callable[[Any], bool],
        expected: str,
        missing_as_null: bool = False,
    ) -> list[Any]:
        values = []
        for row, values_of_row in enumerate(rows):
            if name not in values_of_row and not missing_as_null:
                raise MalformedLineError(
                    f"{where(row)} column {name}: missing (send null for a missing value, "
                    "or POST to /predict?missing=null)"
                )
            value = values_of_row.get(name)
            if value is not None and not accepts(value):
                raise MalformedLineError(
                    f"{where(row)} column {name}: expected {expected}, got {json.dumps(value)[:40]}"
                )
            values.append(_as_int64(value))
        return values

    def count_unseen(self, sparse: np.ndarray) -> np.ndarray:
        """None from the rows: `prepare_table` counts the ids the seen-id filters lack
        (``ParsedLines.unseen``), which the rows (hashed) no longer tell."""
        return np.zeros(len(self._hotness) + len(self.histories), np.int64)

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
    of both, data.parquet.id_hashing.integer_keys); anything else as it is."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1 << 63:
        return value - (1 << 64)
    if isinstance(value, list):
        return [_as_int64(v) for v in value]
    return value


_ARROW_TYPES = {
    "integer": pa.int64(),
    "string": pa.string(),
    "integer_list": pa.list_(pa.int64()),
    "string_list": pa.list_(pa.string()),
}
