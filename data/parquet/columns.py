"""Which Parquet columns mean what, and how a block of rows becomes model inputs.

One `ParquetColumns` describes a click log's columns (label, dense, sparse, optional
weight), the dense transform and how raw categorical values become embedding rows.
The trainer's loader, the export's ``inputs.json``, the predictor and the HTTP endpoint
all convert rows through `ParquetColumns.convert`, so training and serving cannot
disagree (no train/serve skew). It converts each column in one compiled pass
(data.parquet.kernel) where the kernels are built, else with numpy: the methods below are
that reference, which the kernels are tested against bit for bit.

Column types accepted (checked on every file's schema by `ParquetColumns.check_schema`):
- label: integer, boolean or floating; values 0 or 1.
- dense: integer or floating, nullable (a null is 0, counted).
- sparse: integers of any width, strings or binary (dictionary-encoded too), or lists of
  these (multi-hot bags of any length, empty allowed); a null is a bag of length 0, a
  null inside a list is left out of the bag.
- weight: integer or floating, finite and not negative.
- history (``--sequence_columns HIST:ITEM``): a list of ids of the item column's kind
  (integers, or strings/binary), its elements oldest first; a null is an empty history,
  a null element is left out. Its ids become rows of ITEM's table exactly as ITEM's own
  do (same hash, seed and table size), and a row keeps its newest ``max_history``.

Example::

    columns = ParquetColumns(label="label", dense=("I1", "I2"), sparse=("C1",),
                             table_sizes=(1000,))
    block = columns.convert(pyarrow.parquet.read_table("day.parquet"))
"""

import ctypes
import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.errors import BadInput
from data.parquet import kernel
from data.parquet.id_hashing import embedding_rows, integer_keys, string_keys, zch_ids

if TYPE_CHECKING:
    from data.config import DataConfig
    from data.sources import FeatureDescription


class ColumnValueError(BadInput):
    """A value the column must not hold. ``row`` is the row within the converted block;
    the reader turns it into a message naming the file, row group, row and column."""

    def __init__(self, column: str, row: int, what: str) -> None:
        super().__init__(f"row {row} column {column}: {what}")
        self.column, self.row, self.what = column, row, what


@dataclass(frozen=True)
class ConvertedRows:
    """A block of rows as model inputs.

    Args:
        labels: float32 (N,), 0 or 1; None for rows converted without their label (serving).
        dense: float32 (N, D), transformed.
        ids: per sparse feature, int64 embedding rows of all its bags, concatenated;
            then per history feature (``ParquetColumns.sequences``) the rows of its
            items in its item's table, each row's newest ``max_history``, oldest first.
        lengths: int32 (F + S, N): the bag size of each feature and row, then each
            history's length (the KeyedJaggedTensor's lengths, keys in
            ``ParquetColumns.kjt_keys``' order).
        weights: float32 (N,) or None.
        dense_nulls: per dense feature, the nulls read as 0.
        keys: per sparse feature, then per history, the 64-bit keys of its values before
            the table modulo (what collision statistics count; `ParquetColumns.table_keys`
            gives them per table).
        flat_ids: ``ids`` concatenated, where the conversion wrote them so (the kernels
            write every feature's ids back to back in one array); None otherwise.
        distinct_keys: per feature as ``keys``, the same set of keys, each at least once:
            fewer where a dictionary-encoded column lists each entry it reads once (what
            the set-valued id counters take: seen-id filters, collision counts); None:
            ``keys`` themselves.
    """

    labels: np.ndarray | None
    dense: np.ndarray
    ids: list[np.ndarray]
    lengths: np.ndarray
    weights: np.ndarray | None
    dense_nulls: np.ndarray
    keys: list[np.ndarray]
    flat_ids: np.ndarray | None = None
    distinct_keys: list[np.ndarray] | None = None

    @property
    def num_rows(self) -> int:
        return len(self.dense)


def resolve_column_patterns(patterns: Sequence[str], names: Sequence[str], flag: str) -> tuple[str, ...]:
    """Column names matching ``patterns`` (exact names, or a prefix ending in ``*``
    such as ``I*``), in the order given, each pattern's matches in schema order.

    Raises:
        BadInput: a pattern that matches no column (naming ``flag``), or a column
            named twice.
    """
    chosen: list[str] = []
    for pattern in patterns:
        if pattern.endswith("*"):
            matches = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        else:
            matches = [pattern] if pattern in names else []
        if not matches:
            raise BadInput(f"{flag} {pattern}: no such column (the table has {', '.join(names)})")
        for name in matches:
            if name in chosen:
                raise BadInput(f"{flag}: column {name} given twice")
            chosen.append(name)
    return tuple(chosen)


# What a sparse column holds, as the id hashing sees it (`sparse_value_type`): integers
# and strings (binary too) hash differently, so serving must read the type training read.
SPARSE_VALUE_TYPES = ("integer", "string", "integer_list", "string_list")


def sparse_value_type(t: pa.DataType) -> str:
    """The `SPARSE_VALUE_TYPES` entry of a sparse column's Arrow type (one
    `check_schema` accepts)."""
    listed = pa.types.is_list(t) or pa.types.is_large_list(t)
    return ("integer" if _is_integer_id(t) else "string") + ("_list" if listed else "")


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _is_id(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return (
        pa.types.is_integer(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    )


def _is_integer_id(t: pa.DataType) -> bool:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_integer(t)


def _is_id_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_id(t.value_type)


def id_kind(t: pa.DataType) -> str | None:
    """How the hash reads the ids of a column of type ``t`` (a list's elements, a
    dictionary's values): "integer" (any width: the 64-bit pattern), "string" (strings
    and binary alike: their bytes), or None for a type that holds no ids."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "string"
    return None


def _element_type(t: pa.DataType) -> pa.DataType:
    """A list's element type, a dictionary's value type: the ids' own type."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    return t.value_type if pa.types.is_dictionary(t) else t


def history_type_error(history: pa.DataType, item: pa.DataType, history_column: str, item_column: str) -> str | None:
    """Why a column of type ``history`` cannot be ``item_column``'s history (a column of
    type ``item``): not a list, or its elements another kind of id than the item's
    (`id_kind`: the same id would hash to another row); None when it can."""
    if not (pa.types.is_list(history) or pa.types.is_large_list(history)):
        return (
            f"column {history_column} is {history}, but a history column is a list of "
            f"{item_column}'s ids (list<{_element_type(item)}>)"
        )
    element = id_kind(history)
    if element is None or element != id_kind(item):
        return (
            f"column {history_column} holds {history.value_type}, but {item_column}, whose embedding table it "
            f"shares, is {item}: the same id would hash to another row"
        )
    return None


def _keys(values: pa.Array) -> np.ndarray:
    """The 64-bit keys (data.parquet.id_hashing) of a flat array of ids without nulls."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_dictionary(values.type):
        return _keys(values.dictionary)[values.indices.to_numpy(zero_copy_only=False)]
    if pa.types.is_integer(values.type):
        return integer_keys(values.to_numpy(zero_copy_only=False))
    if pa.types.is_string(values.type) or pa.types.is_binary(values.type) or pa.types.is_large_string(values.type):
        values = values.cast(pa.large_binary())
    _, offsets, data = values.buffers()
    offset_array = np.frombuffer(offsets, dtype=np.int64)[values.offset : values.offset + len(values) + 1]
    data_array = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    return string_keys(data_array, offset_array)


@dataclass(frozen=True)
class ParquetColumns:
    """Which columns mean what and how rows become model inputs (the flags
    ``--label_column``, ``--dense_columns``, ``--sparse_columns``, ``--weight_column``,
    ``--dense_transform``, ``--id_hashing``, the table sizes), with patterns resolved.

    Args:
        label: the 0/1 label column.
        dense: the numerical columns, in model order.
        sparse: the categorical columns, in model order.
        table_sizes: embedding rows of each sparse feature (the hash modulo).
        weight: the per-row sample weight column, or None.
        dense_transform: "log1p" (negative values clamped to 0 first, as Criteo's
            preprocessing does) or "none".
        id_hashing: "hash" (data.parquet.id_hashing), "modulo" (integer ids, not negative,
            taken modulo the table size: ids a pipeline has already mapped), "zch" (the
            hash's 63 top bits, `zch_ids`, not reduced: models/zch.py maps them to rows) or
            "vocabulary" (through ``vocabulary``).
        hash_seed: the seed of the hash.
        sequences: the history features (``--sequence_columns``): (history column, its
            item column, one of ``sparse``) pairs; a history's ids are its item's, looked
            up in the item's table (`convert` puts them after the sparse features).
        max_history: the newest ids a history keeps (``--max_history``).
        vocabulary: with id_hashing "vocabulary", the ids that have rows
            (data.parquet.id_vocabulary.IdVocabulary): a kept id reads its row, any
            other id row 0; a history's ids go through its item's. With id_hashing
            "zch" at serving, the exported id map (data.parquet.zch_map.ZchIdMap): an
            admitted id reads its row, any other its shard's default row.
    """

    label: str
    dense: tuple[str, ...]
    sparse: tuple[str, ...]
    table_sizes: tuple[int, ...]
    weight: str | None = None
    dense_transform: str = "log1p"
    id_hashing: str = "hash"
    hash_seed: int = 0
    sequences: tuple[tuple[str, str], ...] = ()
    max_history: int = 0
    vocabulary: Any = None

    def __post_init__(self) -> None:
        if len(self.table_sizes) != len(self.sparse):
            raise ValueError(f"{len(self.sparse)} sparse columns but {len(self.table_sizes)} table sizes")
        for history, item in self.sequences:
            if item not in self.sparse:
                raise ValueError(f"history {history}'s item {item} is not a sparse column")
        if self.sequences and self.max_history < 1:
            raise ValueError(f"histories need a max_history of at least 1, got {self.max_history}")
        if self.vocabulary is not None and list(self.vocabulary.names) != list(self.sparse):
            raise ValueError(f"a vocabulary of {self.vocabulary.names}, but the sparse columns are {self.sparse}")

    @classmethod
    def from_flags(
        cls, config: "DataConfig", description: "FeatureDescription", table_sizes: Sequence[int]
    ) -> "ParquetColumns":
        """The columns the data flags name, with the features of ``description``
        (`data.sources.ParquetSource.describe`: patterns resolved) and the model's
        table sizes."""
        return cls(
            label=config.label_column,
            dense=tuple(description.dense_feature_names),
            sparse=tuple(description.sparse_feature_names),
            table_sizes=tuple(int(s) for s in table_sizes),
            weight=config.weight_column,
            dense_transform=config.dense_transform,
            id_hashing=config.id_hashing,
            hash_seed=config.hash_seed,
            sequences=tuple(description.sequences),
            max_history=description.max_history or 0,
        )

    @property
    def names(self) -> tuple[str, ...]:
        """Every column read, label first."""
        return (
            (self.label,)
            + self.dense
            + self.sparse
            + tuple(history for history, _ in self.sequences)
            + ((self.weight,) if self.weight else ())
        )

    @property
    def histories(self) -> tuple[str, ...]:
        """The history columns, in ``sequences``' order."""
        return tuple(history for history, _ in self.sequences)

    @property
    def kjt_keys(self) -> list[str]:
        """The batches' KeyedJaggedTensor keys: the sparse features, then the histories
        (`data.sources.types.FeatureDescription.kjt_keys`)."""
        return [*self.sparse, *self.histories]

    def _item_index(self) -> list[int]:
        """Per history, the index of its item among the sparse features."""
        return [self.sparse.index(item) for _, item in self.sequences]

    def table_keys(self, keys: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Per sparse feature, the keys looked up in its table (``ConvertedRows.keys``):
        its own, then its histories' (they share the table)."""
        per_table = [[k] for k in keys[: len(self.sparse)]]
        for history_keys, item in zip(keys[len(self.sparse) :], self._item_index()):
            per_table[item].append(history_keys)
        return [parts[0] if len(parts) == 1 else np.concatenate(parts) for parts in per_table]

    def check_schema(self, schema: pa.Schema, where: str, labelled: bool = True) -> None:
        """Refuses a file whose schema lacks a column or gives one a type it cannot
        have (``where``: the file, for the message; without ``labelled`` the label
        column is not needed).

        Raises:
            BadInput: ``"<where>: column C: ..."``.
        """
        kinds = [(self.label, "label", _is_number, "an integer, boolean or floating 0/1 label")] if labelled else []
        kinds += [(c, "dense", _is_number, "integers or floats") for c in self.dense]
        kinds += [
            (c, "sparse", lambda t: _is_id(t) or _is_id_list(t), "integer or string ids, or lists of them")
            for c in self.sparse
        ]
        if self.weight:
            kinds.append((self.weight, "weight", _is_number, "integer or floating weights"))
        for column, role, accepts, expected in kinds:
            index = schema.get_field_index(column)
            if index < 0:
                raise BadInput(
                    f"{where}: no column {column} (the {role} column; the file has {', '.join(schema.names)})"
                )
            kind = schema.field(index).type
            if role == "label" and pa.types.is_boolean(kind):
                continue
            if role == "sparse" and self.id_hashing == "modulo" and not _is_integer_id(kind):
                raise BadInput(
                    f"{where}: column {column} is {kind}, but --id_hashing modulo takes integer ids "
                    "(use --id_hashing hash for raw values)"
                )
            if not accepts(kind):
                raise BadInput(f"{where}: column {column} is {kind}, but a {role} column holds {expected}")
        for history, item in self.sequences:
            index = schema.get_field_index(history)
            if index < 0:
                raise BadInput(
                    f"{where}: no column {history} (the history column of --sequence_columns {history}:{item}; "
                    f"the file has {', '.join(schema.names)})"
                )
            error = history_type_error(schema.field(index).type, schema.field(item).type, history, item)
            if error is not None:
                raise BadInput(f"{where}: {error}")

    def convert(self, rows: pa.Table, labelled: bool = True) -> ConvertedRows:
        """The model inputs of a block of rows (a Table or RecordBatch with the columns;
        without ``labelled``, the label column is neither needed nor read).

        Raises:
            ColumnValueError: a label not 0/1, a NaN or infinite dense value, a
                negative or non-finite weight, naming the row within ``rows``.
        """
        lib = kernel.library()
        labels = self._labels(rows.column(self.label)) if labelled else None
        dense, nulls = self._dense_matrix(lib, rows)
        lengths, ids, keys, flat_ids, distinct = self._sparse_bags(lib, rows)
        weights = self._weights(rows.column(self.weight)) if self.weight else None
        return ConvertedRows(
            labels, dense, ids, lengths, weights, np.array(nulls, dtype=np.int64), keys, flat_ids, distinct
        )

    def check_values(self, rows: pa.Table) -> None:
        """The checks of `convert` without the conversion's output: labels, dense values,
        weights, and (``--id_hashing modulo``) ids not negative.

        Raises:
            ColumnValueError: as `convert`.
        """
        lib = kernel.library()
        self._labels(rows.column(self.label))
        self._dense_matrix(lib, rows)
        if self.id_hashing == "modulo":
            self._sparse_bags(lib, rows)
        if self.weight:
            self._weights(rows.column(self.weight))

    def _dense_matrix(self, lib: ctypes.CDLL | None, rows: pa.Table) -> tuple[np.ndarray, list[int]]:
        """(float32 (N, D) values transformed, each column's nulls, read as 0)."""
        columns = [rows.column(name) for name in self.dense]
        nulls = [column.null_count for column in columns]
        if lib is None:
            matrix = [self._dense(name, column)[0] for name, column in zip(self.dense, columns)]
            return (np.stack(matrix, axis=1) if matrix else np.zeros((rows.num_rows, 0), dtype=np.float32)), nulls
        # log1p: the kernels write max(x, 0) as float64 and numpy's log1p, the reference's
        # own function (and SIMD, several times libm's speed), transforms the whole matrix.
        log1p = self.dense_transform == "log1p"
        out = np.empty((rows.num_rows, len(self.dense)), dtype=np.float64 if log1p else np.float32)
        left, bad = kernel.dense(lib, columns, log1p, out)
        for j in left:  # types the kernels leave to the reference; the first bad value is refused first
            if bad is not None and j > bad[0]:
                break
            values, _ = self._finite_dense(self.dense[j], columns[j])
            out[:, j] = np.maximum(values, 0.0) if log1p else values
        if bad is not None:  # the reference's message: the value as float64 prints
            j, row = bad
            raise ColumnValueError(self.dense[j], row, f"dense value {float(columns[j][row].as_py())} is not finite")
        if log1p:
            np.log1p(out, out=out)
            return out.astype(np.float32), nulls
        return out, nulls

    def _sparse_bags(
        self, lib: ctypes.CDLL | None, rows: pa.Table
    ) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray], np.ndarray | None, list[np.ndarray] | None]:
        """(bag lengths (F + S, N) int32, embedding rows per feature, keys per feature,
        the embedding rows concatenated where the kernels wrote them so, else None, the
        keys each at least once per feature (`ConvertedRows.distinct_keys`) or None): the
        sparse features, then the histories, whose ids are converted as their item's
        (its table size) and cut to their newest ``max_history`` (`_newest`)."""
        names = self.kjt_keys
        columns = [rows.column(name) for name in names]
        sizes = [*self.table_sizes, *(self.table_sizes[i] for i in self._item_index())]
        modulo = self.id_hashing == "modulo"
        if lib is None or self.id_hashing == "zch":  # the kernels reduce ids to rows; zch keeps them
            lengths = np.empty((len(columns), rows.num_rows), dtype=np.int32)
            found: list[kernel.FeatureIds | None] = [None] * len(columns)
            flat_ids = None
        else:
            lengths, found, flat_ids = kernel.sparse_bags(lib, columns, sizes, modulo, self.hash_seed)
            lengths = lengths.reshape(len(columns), rows.num_rows)  # (0, N) too, without sparse columns
            if any(f is None for f in found) or self.id_hashing == "vocabulary":
                flat_ids = None  # the vocabulary's rows replace the kernels' hashed ones below
        ids, keys, distinct = [], [], []
        for f, (name, size) in enumerate(zip(names, sizes)):
            if found[f] is None:  # the reference
                feature_keys, lengths[f] = self._bags(columns[f])
                feature_ids = self._rows(name, feature_keys, lengths[f], size)
                listed = feature_keys
            else:
                feature_keys, feature_ids, negative, listed = found[f]  # type: ignore[misc]
                if negative >= 0:
                    _negative_id(name, feature_keys, lengths[f], negative)
            if self.id_hashing == "vocabulary" or (self.id_hashing == "zch" and self.vocabulary is not None):
                # a history's ids are its item's; zch at serving: the exported id map's rows
                feature_ids = self._vocabulary_rows(f, feature_keys)
            if f >= len(self.sparse) and len(lengths[f]) and int(lengths[f].max()) > self.max_history:
                feature_keys, feature_ids = _newest(feature_keys, feature_ids, lengths[f], self.max_history)
                lengths[f] = np.minimum(lengths[f], self.max_history)
                flat_ids = None  # no longer the kernels' array
                listed = feature_keys  # the ids cut off are not read
            keys.append(feature_keys)
            ids.append(feature_ids)
            distinct.append(listed)
        return lengths, ids, keys, flat_ids, distinct

    def _vocabulary_rows(self, f: int, keys: np.ndarray) -> np.ndarray:
        """The rows of feature ``f``'s keys (``kjt_keys`` order: a history's are its item's)."""
        if self.vocabulary is None:
            raise ValueError("--id_hashing vocabulary converts rows through a vocabulary: none was given")
        item = f if f < len(self.sparse) else self._item_index()[f - len(self.sparse)]
        return self.vocabulary.rows(item, keys)

    def _rows(self, name: str, keys: np.ndarray, lengths: np.ndarray, table_size: int) -> np.ndarray:
        if self.id_hashing == "vocabulary":  # `_vocabulary_rows` maps them, after the bags are read
            return np.zeros(len(keys), np.int64)
        if self.id_hashing == "hash":
            return embedding_rows(keys, self.hash_seed, table_size)
        if self.id_hashing == "zch":  # the managed-collision modules give the rows (models/zch.py)
            return zch_ids(keys, self.hash_seed)
        self._check_not_negative(name, keys, lengths)
        return keys.view(np.int64) % table_size

    @staticmethod
    def _check_not_negative(name: str, keys: np.ndarray, lengths: np.ndarray) -> None:
        """--id_hashing modulo: the ids (``keys`` as int64) of the bags are not negative."""
        ids = keys.view(np.int64)
        if len(ids) and ids.min() < 0:
            _negative_id(name, keys, lengths, int(np.argmax(ids < 0)))

    def _labels(self, column: pa.ChunkedArray) -> np.ndarray:
        if column.null_count:
            raise ColumnValueError(self.label, _first_null(column), "label is null (labels are 0 or 1)")
        values = column.to_numpy().astype(np.float64)
        bad = ~((values == 0) | (values == 1))
        if bad.any():
            row = int(np.argmax(bad))
            raise ColumnValueError(self.label, row, f"label {values[row]:g} is not 0 or 1")
        return values.astype(np.float32)

    def _dense(self, name: str, column: pa.ChunkedArray) -> tuple[np.ndarray, int]:
        """(float32 values transformed, nulls read as 0)."""
        values, null_count = self._finite_dense(name, column)
        if self.dense_transform == "log1p":
            values = np.log1p(np.maximum(values, 0.0))
        return values.astype(np.float32), null_count

    @staticmethod
    def _finite_dense(name: str, column: pa.ChunkedArray) -> tuple[np.ndarray, int]:
        """(float64 values with nulls as 0, null count); refuses NaN and infinity."""
        null_count = column.null_count
        values = (
            pc.fill_null(column, 0).to_numpy().astype(np.float64)
            if null_count
            else column.to_numpy().astype(np.float64)
        )
        finite = np.isfinite(values)
        if not finite.all():
            row = int(np.argmin(finite))
            raise ColumnValueError(name, row, f"dense value {values[row]} is not finite")
        return values, null_count

    def _weights(self, column: pa.ChunkedArray) -> np.ndarray:
        assert self.weight is not None
        if column.null_count:
            raise ColumnValueError(self.weight, _first_null(column), "weight is null")
        values = column.to_numpy().astype(np.float64)
        good = np.isfinite(values) & (values >= 0)
        if not good.all():
            row = int(np.argmin(good))
            raise ColumnValueError(self.weight, row, f"weight {values[row]} is not finite and >= 0")
        return values.astype(np.float32)

    @staticmethod
    def _bags(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
        """(keys of every id, bag length per row): a null is an empty bag; a list's
        null elements are left out."""
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
            lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
            flat = pc.list_flatten(array)  # skips null lists; keeps null elements
            if flat.null_count:
                valid = pc.is_valid(flat).to_numpy(zero_copy_only=False)
                row_of = np.repeat(np.arange(len(lengths)), lengths)
                lengths = lengths - np.bincount(row_of[~valid], minlength=len(lengths))
                flat = flat.filter(pa.array(valid))
            return _keys(flat), lengths.astype(np.int32)
        if not array.null_count:
            return _keys(array), np.ones(len(array), dtype=np.int32)
        valid = pc.is_valid(array).to_numpy(zero_copy_only=False)
        return _keys(array.filter(pa.array(valid))), valid.astype(np.int32)


def _newest(keys: np.ndarray, ids: np.ndarray, lengths: np.ndarray, keep: int) -> tuple[np.ndarray, np.ndarray]:
    """(keys, ids) of bags (``lengths``, oldest id first) cut to each bag's last ``keep``."""
    starts = np.cumsum(lengths) - lengths
    place = np.arange(len(ids)) - np.repeat(starts, lengths)
    kept = place >= np.repeat(lengths.astype(np.int64) - keep, lengths)
    return keys[kept], ids[kept]


def _negative_id(name: str, keys: np.ndarray, lengths: np.ndarray, first: int) -> NoReturn:
    """Refuses the negative id ``first`` (an index into the keys of the bags of ``lengths``)."""
    row = int(np.searchsorted(np.cumsum(lengths), first, side="right"))
    raise ColumnValueError(name, row, f"id {int(keys.view(np.int64)[first])} is negative (--id_hashing modulo)")


def _first_null(column: pa.ChunkedArray) -> int:
    return int(np.argmax(pc.is_null(column).to_numpy(zero_copy_only=False)))
