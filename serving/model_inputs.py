"""An export's ``inputs.json``: what a predictor needs to turn input lines into the model's inputs.

Written by `ModelInputs.to_json` (inside the export's temporary directory, which is
renamed whole when complete) and read only by `ModelInputs.from_json` (through
`read_inputs`, which checks the file against the directory's manifest); everything
else uses its attributes. The layout says what the predictor reads: raw Criteo lines
(`CriteoPreprocessing`: the preprocessing's frequency threshold, table-size modulo
and vocabulary file), for a model trained with --dataset_path, BYO CSV rows
(`FeatureSpecColumns`: the label's name and the ids' cardinalities) or, for a model
trained with --parquet_path, Parquet rows and JSON objects keyed by column name
(`ParquetPreprocessing`: the label and weight columns, the dense transform, the id
hashing and each sparse column's value type; with the feature names and table sizes
they make the training's `data.parquet_columns.ParquetColumns`).

Version 3 adds ``calibration``: the ``--calibrate`` fit the exported model applies
after its logit (common/calibration.py), null for the model's own probabilities.
Version 2 stores each fact once; version-1 files (which also held descriptions of
the tensors, the model's table names, embedding size and interaction, and the CSV
column list, all derivable or unused) still load.

Example::

    inputs = read_inputs("model_dir", read_manifest("model_dir"))
    inputs.layout, inputs.num_dense_features, inputs.variants["int8"].file
"""

import os
from dataclasses import dataclass, field
from typing import ClassVar, Optional, Union

from common.calibration import Calibration
from common.json_fields import (INTEGER, OBJECT, REQUIRED, TEXT, FileFieldError, JsonObject, Kind, int_list, one_of,
                                optional, text_list, versioned_json)
from common.manifest import ManifestEntry
from data.config import DENSE_TRANSFORMS, ID_HASHING
from data.criteo_layout import DENSE_FEATURE_NAMES
from data.parquet_columns import SPARSE_VALUE_TYPES, ParquetColumns
from serving.model_files import AOTI_FORMAT, FORMATS, read_file

INPUTS_FILE = "inputs.json"
INPUTS_VERSION = 3
# In the sparse input of a padded model (Parquet data): a place its bag leaves empty.
PADDING_ID = -1
# The table precisions a model is exported in (fp32 always; fp16 and int8 with --quantize).
PRECISIONS = ("fp32", "fp16", "int8")


def program_file(precision: str) -> str:
    """The file of a precision's torch.export program (``int8.pt2``), loaded code-free."""
    return f"{precision}.pt2"


def aoti_variant(precision: str) -> str:
    """The variant name of a precision's AOTInductor package (``fp32_aoti``)."""
    return f"{precision}_{AOTI_FORMAT}"


def aoti_file(precision: str) -> str:
    """The file of a precision's AOTInductor package: ``fp32.aoti.pt2`` (the name the
    C++ program of serving/cpp loads)."""
    return f"{precision}.{AOTI_FORMAT}.pt2"


# Every variant a model directory may hold: the code-free ones, then the AOTInductor packages.
VARIANTS = (*PRECISIONS, *(aoti_variant(p) for p in PRECISIONS))
_WHAT = "an exported model's inputs description"


@dataclass
class Variant:
    """One exported model file: its name in the directory, format and size."""

    file: str
    format: str
    bytes: int


@dataclass
class CriteoPreprocessing:
    """Raw Criteo lines, transformed as ``python -m data.preprocess_criteo`` did.

    Args:
        frequency_threshold: the preprocessing's (0: none).
        modulo_num_embeddings_per_feature: table sizes it took ids modulo, if any.
        vocabulary: the vocabulary file in the model directory (made with a threshold).
    """

    LAYOUT: ClassVar[str] = "criteo_raw"
    frequency_threshold: int = 0
    modulo_num_embeddings_per_feature: Optional[list[int]] = None
    vocabulary: Optional[str] = None


@dataclass
class FeatureSpecColumns:
    """BYO CSV rows of a feature-spec data set: label (optional), numerical values, ids.

    Args:
        label_name: the label column's name.
        cardinalities: each categorical feature's declared cardinality (ids below it).
    """

    LAYOUT: ClassVar[str] = "feature_spec_csv"
    label_name: str
    cardinalities: list[int]


@dataclass
class ParquetPreprocessing:
    """Parquet rows (and the HTTP endpoint's JSON objects keyed by column name),
    converted as training did: through `data.parquet_columns.ParquetColumns` (the
    dense and sparse columns are the model's feature names, the table sizes its
    tables'; `ModelInputs.parquet_columns`).

    Args:
        label: the label column.
        weight: the training's sample weight column, if any (serving does not read it).
        dense_transform: log1p or none.
        id_hashing: hash or modulo.
        hash_seed: the seed of the hash.
        sparse_value_types: per sparse column, one of `SPARSE_VALUE_TYPES`; a
            list column's bags are cut into ``sparse_hotness`` places (a longer bag is
            refused), a single value's into one.
    """

    LAYOUT: ClassVar[str] = "parquet_columns"
    label: str
    weight: Optional[str]
    dense_transform: str
    id_hashing: str
    hash_seed: int
    sparse_value_types: list[str]


CRITEO_LAYOUT = CriteoPreprocessing.LAYOUT
FEATURE_SPEC_LAYOUT = FeatureSpecColumns.LAYOUT
PARQUET_LAYOUT = ParquetPreprocessing.LAYOUT
Preprocessing = Union[CriteoPreprocessing, FeatureSpecColumns, ParquetPreprocessing]


@dataclass
class ModelInputs:
    """The contents of inputs.json.

    Args:
        dense_feature_names: the dense inputs, in column order (none for a model of
            categorical features only).
        sparse_feature_names: the categorical features (the KJT keys), in column order.
        sparse_hotness: ids per row of each categorical feature.
        num_embeddings_per_feature: the table sizes (ids are taken modulo them).
        preprocessing: the input layout and its transforms.
        data_path: the training data (a Criteo directory or a feature spec), if any.
        checkpoint: the checkpoint exported.
        step: its step.
        variants: the model files by variant name (fp32, fp16, int8; with
            ``--format aoti`` also fp32_aoti, fp16_aoti, int8_aoti).
        calibration: the calibration the model files apply (``--calibrate``), or None.
        version: the file format.
    """

    dense_feature_names: list[str]
    sparse_feature_names: list[str]
    sparse_hotness: list[int]
    num_embeddings_per_feature: list[int]
    preprocessing: Preprocessing
    data_path: Optional[str]
    checkpoint: str
    step: int
    variants: dict[str, Variant] = field(default_factory=dict)
    calibration: Optional[Calibration] = None
    version: int = INPUTS_VERSION

    @property
    def layout(self) -> str:
        return self.preprocessing.LAYOUT

    @property
    def num_dense_features(self) -> int:
        return len(self.dense_feature_names)

    @property
    def csv_columns(self) -> list[str]:
        """A feature-spec model's CSV columns: the label (optional in rows), the
        numerical values, then each feature's ids (``name[i]`` for a multi-hot one)."""
        assert isinstance(self.preprocessing, FeatureSpecColumns)
        ids = [name if h == 1 else f"{name}[{i}]"
               for name, h in zip(self.sparse_feature_names, self.sparse_hotness) for i in range(h)]
        return [self.preprocessing.label_name, *self.dense_feature_names, *ids]

    @property
    def padded(self) -> bool:
        """Whether the model's sparse input may hold `PADDING_ID` (bags of any length)."""
        return isinstance(self.preprocessing, ParquetPreprocessing)

    def parquet_columns(self) -> ParquetColumns:
        """A Parquet model's columns, as its training converted rows (without the
        weight: serving reads none)."""
        columns = self.preprocessing
        assert isinstance(columns, ParquetPreprocessing)
        return ParquetColumns(label=columns.label, dense=tuple(self.dense_feature_names),
                              sparse=tuple(self.sparse_feature_names),
                              table_sizes=tuple(self.num_embeddings_per_feature),
                              dense_transform=columns.dense_transform, id_hashing=columns.id_hashing,
                              hash_seed=columns.hash_seed)

    def to_json(self) -> bytes:
        """The file's bytes (version and layout first)."""
        return versioned_json(self, layout=self.layout)

    @classmethod
    def from_json(cls, data: bytes, path: str) -> "ModelInputs":
        """Reads the bytes of ``path`` (version 1 to 3); FileFieldError naming the file
        and the field that is missing, malformed or newer."""
        document, version = JsonObject.versioned(data, path, _WHAT, INPUTS_VERSION)
        legacy = version == 1  # defaults of files from before the BYO layout existed: Criteo, one id a feature
        names = document.get("sparse_feature_names", text_list())
        count = len(names)
        layout = document.get("layout", one_of(CRITEO_LAYOUT, FEATURE_SPEC_LAYOUT, PARQUET_LAYOUT),
                              CRITEO_LAYOUT if legacy else REQUIRED)
        dense_names = document.get("dense_feature_names", text_list(allow_empty=True),  # empty: ids only
                                   list(DENSE_FEATURE_NAMES) if legacy else REQUIRED)
        if legacy and document.get("num_dense_features", INTEGER) != len(dense_names):
            raise FileFieldError(f"{path}: num_dense_features is {document.value['num_dense_features']}, "
                                 f"but dense_feature_names has {len(dense_names)} names")
        hotness = document.get("sparse_hotness", int_list(count, minimum=1), [1] * count if legacy else REQUIRED)
        preprocessing = _read_preprocessing(document, layout, legacy, count)
        if isinstance(preprocessing, ParquetPreprocessing):
            _check_parquet_columns(preprocessing, dense_names, names, hotness, path)
        return cls(
            dense_feature_names=dense_names,
            sparse_feature_names=names,
            sparse_hotness=hotness,
            num_embeddings_per_feature=document.get("num_embeddings_per_feature", int_list(count, minimum=1)),
            preprocessing=preprocessing,
            data_path=document.get("data_path", optional(TEXT), None),
            checkpoint=document.get("checkpoint", TEXT),
            step=document.get("step", INTEGER),
            variants=_read_variants(document),
            calibration=(Calibration.read(document.object("calibration"))
                         if document.get("calibration", optional(OBJECT), None) is not None else None),
        )


def _read_preprocessing(document: JsonObject, layout: str, legacy: bool, count: int) -> Preprocessing:
    """The layout's preprocessing; ``legacy``: of a version-1 file, which kept the
    feature-spec fields at the top level and left out Criteo's when they were unused."""
    if layout == PARQUET_LAYOUT:
        source = document.object("preprocessing")
        return ParquetPreprocessing(
            label=source.get("label", _COLUMN_NAME), weight=source.get("weight", optional(_COLUMN_NAME)),
            dense_transform=source.get("dense_transform", one_of(*DENSE_TRANSFORMS)),
            id_hashing=source.get("id_hashing", one_of(*ID_HASHING)),
            hash_seed=source.get("hash_seed", _HASH_SEED),
            sparse_value_types=source.get("sparse_value_types", _value_types(count)))
    if layout == FEATURE_SPEC_LAYOUT:
        source = document if legacy else document.object("preprocessing")
        return FeatureSpecColumns(label_name=source.get("label_name", TEXT),
                                  cardinalities=source.get("cardinalities", int_list(count, minimum=0)))
    source = document.object("preprocessing", {}) if legacy else document.object("preprocessing")
    return CriteoPreprocessing(
        frequency_threshold=source.get("frequency_threshold", INTEGER, 0 if legacy else REQUIRED),
        modulo_num_embeddings_per_feature=source.get(
            "modulo_num_embeddings_per_feature", optional(int_list(count, minimum=1)), None if legacy else REQUIRED),
        vocabulary=source.get("vocabulary", optional(TEXT), None if legacy else REQUIRED) or None,
    )


_COLUMN_NAME = Kind(lambda v: isinstance(v, str) and bool(v), "a column name")
_HASH_SEED = Kind(lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64,
                  "an integer from 0 to 2^64 - 1")


def _value_types(count: int) -> Kind:
    return Kind(lambda v: isinstance(v, list) and len(v) == count and all(t in SPARSE_VALUE_TYPES for t in v),
                f"{count} of {', '.join(SPARSE_VALUE_TYPES)}")


def _check_parquet_columns(columns: ParquetPreprocessing, dense: list[str], sparse: list[str],
                           hotness: list[int], path: str) -> None:
    """Refuses a Parquet description its own fields contradict: a column named twice
    (the label among the features, a feature twice), a single-valued column given
    more than one place."""
    names = [columns.label, *dense, *sparse]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise FileFieldError(f"{path}: column {repeated[0]} is named twice among the label, "
                             "dense_feature_names and sparse_feature_names")
    for name, kind, places in zip(sparse, columns.sparse_value_types, hotness):
        if not kind.endswith("_list") and places != 1:
            raise FileFieldError(f"{path}: sparse_hotness of {name} is {places}, but its values are single "
                                 f"{kind}s (one place)")


def _read_variants(document: JsonObject) -> dict[str, Variant]:
    variants = document.objects("variants")
    if not variants:
        raise FileFieldError(f"{document.path}: variants must name at least one model file, got {{}}")
    return {name: Variant(file=v.get("file", TEXT), format=v.get("format", one_of(*FORMATS)),
                          bytes=v.get("bytes", INTEGER))
            for name, v in variants.items()}


def read_inputs(model_dir: str, manifest: Optional[dict[str, ManifestEntry]] = None) -> ModelInputs:
    """An exported model directory's inputs.json, checked against ``manifest`` (when
    given); FileFieldError naming the file and the field when it is malformed."""
    return ModelInputs.from_json(read_file(model_dir, INPUTS_FILE, manifest), os.path.join(model_dir, INPUTS_FILE))

