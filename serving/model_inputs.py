"""An export's ``inputs.json``: what a predictor needs to turn input lines into the model's inputs.

Written by `ModelInputs.to_json` (inside the export's temporary directory, which is
renamed whole when complete) and read only by `ModelInputs.from_json` (through
`read_inputs`, which checks the file against the directory's manifest); everything
else uses its attributes. The layout says what the predictor reads, and its record
(``preprocessing``) how: each layout's module in serving/layouts/ defines and reads
it (raw Criteo lines: `CriteoPreprocessing`; BYO CSV rows of a model trained with
--dataset_path: `FeatureSpecColumns`; Parquet rows and JSON objects of one trained
with --parquet_path: `ParquetPreprocessing`).

Version 4 adds ``histories``: the model's history features (``--sequence_columns``),
each a list of ids of its item feature's table, taken by the programs as the jagged
inputs ``history_values`` and ``history_lengths`` (`HISTORY_INPUTS`); [] for a model
without. Version 3 adds ``calibration``: the ``--calibrate`` fit the exported model applies
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

from common.calibration import Calibration
from common.json_fields import (
    INTEGER,
    OBJECT,
    REQUIRED,
    TEXT,
    FileFieldError,
    JsonObject,
    Kind,
    int_list,
    integer,
    one_of,
    optional,
    text_list,
    versioned_json,
)
from common.manifest import ManifestEntry
from data.binary.criteo_layout import DENSE_FEATURE_NAMES
from data.parquet.columns import ParquetColumns
from serving.layouts import LAYOUTS
from serving.layouts.base import PADDING_ID, LayoutRecord  # noqa: F401  (PADDING_ID: its readers import it from here)
from serving.layouts.criteo_lines import CriteoPreprocessing
from serving.layouts.csv_rows import FeatureSpecColumns, csv_columns
from serving.layouts.parquet_rows import ParquetPreprocessing, parquet_columns
from serving.model_files import AOTI_FORMAT, FORMATS, read_file

INPUTS_FILE = "inputs.json"
INPUTS_VERSION = 4
# The programs' inputs besides dense and sparse, of a model with history features: every
# history id of the batch (N,) int64, row by row and within a row history by history, and
# how many each history of each row holds (B, S) int64 (serving/inference_model.py
# `SequenceTables`).
HISTORY_INPUTS = ("history_values", "history_lengths")
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
class HistoryInput:
    """One history feature of the model (``--sequence_columns NAME:ITEM``).

    Args:
        name: the history feature (a Parquet model's list column, a JSON row's key).
        item: the categorical feature whose table its ids are looked up in (and hashed
            like: the same table size and hashing).
        max_history: the items the model reads: a longer history keeps its newest
            ``max_history`` (the last of the list), as training's data did.
    """

    name: str
    item: str
    max_history: int


# The records of the three layouts the project ships, by their old names here (serving/layouts/ has them).
CRITEO_LAYOUT = CriteoPreprocessing.LAYOUT
FEATURE_SPEC_LAYOUT = FeatureSpecColumns.LAYOUT
PARQUET_LAYOUT = ParquetPreprocessing.LAYOUT
Preprocessing = LayoutRecord


@dataclass
class ModelInputs:
    """The contents of inputs.json.

    Args:
        dense_feature_names: the dense inputs, in column order (none for a model of
            categorical features only).
        sparse_feature_names: the categorical features (the KJT keys), in column order.
        sparse_hotness: ids per row of each categorical feature.
        num_embeddings_per_feature: the table sizes (ids are taken modulo them).
        preprocessing: the input layout and its transforms (the layout's record, serving/layouts/).
        data_path: the training data (a Criteo directory or a feature spec), if any.
        checkpoint: the checkpoint exported.
        step: its step.
        variants: the model files by variant name (fp32, fp16, int8; with
            ``--format aoti`` also fp32_aoti, fp16_aoti, int8_aoti).
        calibration: the calibration the model files apply (``--calibrate``), or None.
        histories: the history features, in the programs' order (none: [];
            `HistoryInput`).
        version: the file format.
    """

    dense_feature_names: list[str]
    sparse_feature_names: list[str]
    sparse_hotness: list[int]
    num_embeddings_per_feature: list[int]
    preprocessing: Preprocessing
    data_path: str | None
    checkpoint: str
    step: int
    variants: dict[str, Variant] = field(default_factory=dict)
    calibration: Calibration | None = None
    histories: list[HistoryInput] = field(default_factory=list)
    version: int = INPUTS_VERSION

    @property
    def layout(self) -> str:
        return self.preprocessing.LAYOUT

    @property
    def num_dense_features(self) -> int:
        return len(self.dense_feature_names)

    @property
    def csv_columns(self) -> list[str]:
        """A feature-spec model's CSV columns (serving/layouts/csv_rows.py `csv_columns`)."""
        return csv_columns(self)

    @property
    def padded(self) -> bool:
        """Whether the model's sparse input may hold `PADDING_ID` (bags of any length)."""
        return self.preprocessing.PADDED

    @property
    def counted_feature_names(self) -> list[str]:
        """The features whose ids serving counts (read, unseen): the categorical ones,
        then the histories."""
        return [*self.sparse_feature_names, *(h.name for h in self.histories)]

    def input_columns(self) -> dict[str, int]:
        """The programs' inputs and their columns (a 1-D input: 1), as the model files'
        signatures give them (serving/model_files.py)."""
        columns = {"dense": self.num_dense_features, "sparse": int(sum(self.sparse_hotness))}
        if self.histories:
            columns.update(dict(zip(HISTORY_INPUTS, (1, len(self.histories)))))
        return columns

    def parquet_columns(self) -> ParquetColumns:
        """A Parquet model's columns (serving/layouts/parquet_rows.py `parquet_columns`)."""
        return parquet_columns(self)

    def to_json(self) -> bytes:
        """The file's bytes (version and layout first)."""
        return versioned_json(self, layout=self.layout)

    @classmethod
    def from_json(cls, data: bytes, path: str) -> "ModelInputs":
        """Reads the bytes of ``path`` (version 1 to 4); FileFieldError naming the file
        and the field that is missing, malformed or newer."""
        document, version = JsonObject.versioned(data, path, _WHAT, INPUTS_VERSION)
        legacy = version == 1  # defaults of files from before the BYO layout existed: Criteo, one id a feature
        names = document.get("sparse_feature_names", text_list())
        count = len(names)
        layout = document.get("layout", one_of(*LAYOUTS), CRITEO_LAYOUT if legacy else REQUIRED)
        dense_names = document.get(
            "dense_feature_names",
            text_list(allow_empty=True),  # empty: ids only
            list(DENSE_FEATURE_NAMES) if legacy else REQUIRED,
        )
        if legacy and document.get("num_dense_features", INTEGER) != len(dense_names):
            raise FileFieldError(
                f"{path}: num_dense_features is {document.value['num_dense_features']}, "
                f"but dense_feature_names has {len(dense_names)} names"
            )
        hotness = document.get("sparse_hotness", int_list(count, minimum=1), [1] * count if legacy else REQUIRED)
        preprocessing = LAYOUTS[layout].record.read(document, legacy, count)
        preprocessing.check(dense_names, names, hotness, path)
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
            calibration=(
                Calibration.read(document.object("calibration"))
                if document.get("calibration", optional(OBJECT), None) is not None
                else None
            ),
            histories=_read_histories(document, names),
        )


def _read_histories(document: JsonObject, sparse: list[str]) -> list[HistoryInput]:
    """``histories`` (absent before version 4: none), each naming a new feature and an
    item among ``sparse``."""
    listed = document.get("histories", Kind(lambda v: isinstance(v, list), "a list"), [])
    histories: list[HistoryInput] = []
    for index, value in enumerate(listed):
        entry = JsonObject(value, document.path, f"histories[{index}]", _WHAT)
        history = HistoryInput(
            name=entry.get("name", TEXT),
            item=entry.get("item", one_of(*sparse)),
            max_history=entry.get("max_history", integer(1)),
        )
        if history.name in sparse or history.name in (h.name for h in histories):
            raise FileFieldError(f"{document.path}: histories[{index}].name {history.name} is named twice")
        histories.append(history)
    return histories


def _read_variants(document: JsonObject) -> dict[str, Variant]:
    variants = document.objects("variants")
    if not variants:
        raise FileFieldError(f"{document.path}: variants must name at least one model file, got {{}}")
    return {
        name: Variant(file=v.get("file", TEXT), format=v.get("format", one_of(*FORMATS)), bytes=v.get("bytes", INTEGER))
        for name, v in variants.items()
    }


def read_inputs(model_dir: str, manifest: dict[str, ManifestEntry] | None = None) -> ModelInputs:
    """An exported model directory's inputs.json, checked against ``manifest`` (when
    given); FileFieldError naming the file and the field when it is malformed."""
    return ModelInputs.from_json(read_file(model_dir, INPUTS_FILE, manifest), os.path.join(model_dir, INPUTS_FILE))
