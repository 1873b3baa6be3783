"""An export's ``inputs.json``: what a predictor needs to turn input lines into the model's inputs.

Written by `ModelInputs.to_json` (inside the export's temporary directory, which is
renamed whole when complete) and read only by `ModelInputs.from_json` (through
`read_inputs`, which checks the file against the directory's manifest); everything
else uses its attributes. The layout says what the predictor reads: raw Criteo lines
(`CriteoPreprocessing`: the preprocessing's frequency threshold, table-size modulo
and vocabulary file) or, for a model trained with --dataset_path, BYO CSV rows
(`FeatureSpecColumns`: the label's name and the ids' cardinalities).

Version 2 stores each fact once; version-1 files (which also held descriptions of
the tensors, the model's table names, embedding size and interaction, and the CSV
column list, all derivable or unused) still load.

Example::

    inputs = read_inputs("model_dir", read_manifest("model_dir"))
    inputs.layout, inputs.num_dense_features, inputs.variants["int8"].file
"""

import os
from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Optional, Union

from common.json_fields import (INTEGER, REQUIRED, TEXT, FileFieldError, JsonObject, int_list, one_of, optional,
                                text_list, versioned_json)
from common.manifest import ManifestEntry
from data.criteo_layout import DENSE_FEATURE_NAMES
from serving.model_files import FORMATS, read_file

INPUTS_FILE = "inputs.json"
INPUTS_VERSION = 2
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
    modulo_num_embeddings_per_feature: Optional[List[int]] = None
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
    cardinalities: List[int]


CRITEO_LAYOUT = CriteoPreprocessing.LAYOUT
FEATURE_SPEC_LAYOUT = FeatureSpecColumns.LAYOUT
Preprocessing = Union[CriteoPreprocessing, FeatureSpecColumns]


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
        variants: the model files by variant name (fp32, fp16, int8).
        version: the file format.
    """

    dense_feature_names: List[str]
    sparse_feature_names: List[str]
    sparse_hotness: List[int]
    num_embeddings_per_feature: List[int]
    preprocessing: Preprocessing
    data_path: Optional[str]
    checkpoint: str
    step: int
    variants: Dict[str, Variant] = field(default_factory=dict)
    version: int = INPUTS_VERSION

    @property
    def layout(self) -> str:
        return self.preprocessing.LAYOUT

    @property
    def num_dense_features(self) -> int:
        return len(self.dense_feature_names)

    @property
    def csv_columns(self) -> List[str]:
        """A feature-spec model's CSV columns: the label (optional in rows), the
        numerical values, then each feature's ids (``name[i]`` for a multi-hot one)."""
        assert isinstance(self.preprocessing, FeatureSpecColumns)
        ids = [name if h == 1 else f"{name}[{i}]"
               for name, h in zip(self.sparse_feature_names, self.sparse_hotness) for i in range(h)]
        return [self.preprocessing.label_name, *self.dense_feature_names, *ids]

    def to_json(self) -> bytes:
        """The file's bytes (version and layout first)."""
        return versioned_json(self, layout=self.layout)

    @classmethod
    def from_json(cls, data: bytes, path: str) -> "ModelInputs":
        """Reads the bytes of ``path`` (version 1 or 2); FileFieldError naming the file
        and the field that is missing, malformed or newer."""
        document, version = JsonObject.versioned(data, path, _WHAT, INPUTS_VERSION)
        legacy = version == 1  # defaults of files from before the BYO layout existed: Criteo, one id a feature
        names = document.get("sparse_feature_names", text_list())
        count = len(names)
        layout = document.get("layout", one_of(CRITEO_LAYOUT, FEATURE_SPEC_LAYOUT),
                              CRITEO_LAYOUT if legacy else REQUIRED)
        dense_names = document.get("dense_feature_names", text_list(allow_empty=True),  # empty: ids only
                                   list(DENSE_FEATURE_NAMES) if legacy else REQUIRED)
        if legacy and document.get("num_dense_features", INTEGER) != len(dense_names):
            raise FileFieldError(f"{path}: num_dense_features is {document.value['num_dense_features']}, "
                                 f"but dense_feature_names has {len(dense_names)} names")
        hotness = document.get("sparse_hotness", int_list(count, minimum=1), [1] * count if legacy else REQUIRED)
        preprocessing = _read_preprocessing(document, layout, legacy, count)
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
        )


def _read_preprocessing(document: JsonObject, layout: str, legacy: bool, count: int) -> Preprocessing:
    """The layout's preprocessing; ``legacy``: of a version-1 file, which kept the
    feature-spec fields at the top level and left out Criteo's when they were unused."""
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


def _read_variants(document: JsonObject) -> Dict[str, Variant]:
    variants = document.objects("variants")
    if not variants:
        raise FileFieldError(f"{document.path}: variants must name at least one model file, got {{}}")
    return {name: Variant(file=v.get("file", TEXT), format=v.get("format", one_of(*FORMATS)),
                          bytes=v.get("bytes", INTEGER))
            for name, v in variants.items()}


def read_inputs(model_dir: str, manifest: Optional[Dict[str, ManifestEntry]] = None) -> ModelInputs:
    """An exported model directory's inputs.json, checked against ``manifest`` (when
    given); FileFieldError naming the file and the field when it is malformed."""
    return ModelInputs.from_json(read_file(model_dir, INPUTS_FILE, manifest), os.path.join(model_dir, INPUTS_FILE))

