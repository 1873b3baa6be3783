"""The ``criteo_raw`` layout: raw Criteo lines, as the public data set's day files hold them.

Tab-separated: label, 13 integer features, 26 hexadecimal hashes (40 fields), or the
same without the label (39 fields); any feature may be empty. Transforms:
preprocessing's (data/preprocess/criteo_transforms.py): its frequency threshold (through the
vocabulary the export copies beside the model) and its table-size modulo. The layout of
models trained on random data and Criteo binaries (one-hot or multi-hot).
"""

import io
import os
import re
import zipfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from common.errors import BadInput
from common.json_fields import INTEGER, REQUIRED, TEXT, JsonObject, int_list, optional
from common.manifest import ManifestEntry
from data.binary.criteo import CriteoBinaryDataset
from data.binary.criteo_layout import NUM_DENSE_FEATURES, NUM_SPARSE_FEATURES, read_metadata
from data.preprocess.criteo_transforms import read_vocabulary, transform_dense, transform_sparse
from data.sources import CriteoDays
from data.text.criteo_tsv import NUM_FIELDS, parse_criteo_lines
from serving.layouts.base import (
    Checkpoint,
    Description,
    Features,
    InputLayout,
    LayoutRecord,
    MalformedLineError,
    ParsedLines,
)
from serving.model_files import read_file

if TYPE_CHECKING:
    from serving.model_inputs import ModelInputs


@dataclass
class CriteoPreprocessing(LayoutRecord):
    """Raw Criteo lines, transformed as ``python -m data.preprocess_criteo`` did.

    Args:
        frequency_threshold: the preprocessing's (0: none).
        modulo_num_embeddings_per_feature: table sizes it took ids modulo, if any.
        vocabulary: the vocabulary file in the model directory (made with a threshold).
    """

    LAYOUT: ClassVar[str] = "criteo_raw"
    frequency_threshold: int = 0
    modulo_num_embeddings_per_feature: list[int] | None = None
    vocabulary: str | None = None

    @classmethod
    def read(cls, document: JsonObject, legacy: bool, count: int) -> "CriteoPreprocessing":
        """``legacy``: a version-1 file, which left the fields out when they were unused."""
        source = document.object("preprocessing", {}) if legacy else document.object("preprocessing")
        return cls(
            frequency_threshold=source.get("frequency_threshold", INTEGER, 0 if legacy else REQUIRED),
            modulo_num_embeddings_per_feature=source.get(
                "modulo_num_embeddings_per_feature", optional(int_list(count, minimum=1)), None if legacy else REQUIRED
            ),
            vocabulary=source.get("vocabulary", optional(TEXT), None if legacy else REQUIRED) or None,
        )


class CriteoLines(InputLayout):
    """Raw Criteo lines (see the module docstring).

    Args:
        inputs: the export's inputs.json (its preprocessing a `CriteoPreprocessing`).
        vocabulary: each feature's kept hashes, for data made with a frequency threshold.
    """

    record = CriteoPreprocessing

    def __init__(self, inputs: "ModelInputs", vocabulary: list[np.ndarray] | None = None) -> None:
        super().__init__(inputs)
        preprocessing = inputs.preprocessing
        assert isinstance(preprocessing, CriteoPreprocessing)
        modulo = preprocessing.modulo_num_embeddings_per_feature
        self._modulo = None if modulo is None else np.asarray(modulo, dtype=np.int64)
        self._vocabulary = vocabulary
        self._num_features = len(inputs.sparse_feature_names)

    @staticmethod
    def describe(checkpoint: Checkpoint) -> Description:
        """Raw Criteo lines (one hash per feature), transformed as the training data's
        preprocessing did: its frequency threshold and modulo, which meta.json records
        (of an older checkpoint, the day files' metadata.json read again)."""
        meta, model = checkpoint.meta, checkpoint.model
        count = len(model.sparse_feature_names)
        # Only the one-hot day files: the quality gate reads data_path as them.
        data_path = (
            checkpoint.data_config().in_memory_binary_criteo_path if meta.source_name == CriteoDays.name else None
        )
        facts = checkpoint.facts()
        if facts is not None:
            threshold = facts.get("frequency_threshold", INTEGER, 0)
            modulo = facts.get("modulo_num_embeddings_per_feature", optional(int_list(count, minimum=1)), None)
        else:
            metadata = read_metadata(data_path) if data_path else None  # None where there is none
            threshold = metadata.frequency_threshold if metadata else 0
            modulo = metadata.modulo_num_embeddings_per_feature if metadata else None
        return Description(
            dense_feature_names=list(meta.features.dense_feature_names),
            sparse_feature_names=list(model.sparse_feature_names),
            sparse_hotness=[1] * count,
            num_embeddings_per_feature=list(model.num_embeddings_per_feature),
            preprocessing=CriteoPreprocessing(frequency_threshold=threshold, modulo_num_embeddings_per_feature=modulo),
            data_path=data_path,
        )

    @classmethod
    def load(cls, inputs: "ModelInputs", model_dir: str, manifest: dict[str, ManifestEntry] | None) -> "CriteoLines":
        name = inputs.preprocessing.vocabulary  # type: ignore[attr-defined]
        if not name:
            return cls(inputs)
        data = read_file(model_dir, name, manifest)
        try:  # np.load refuses pickled arrays by default
            return cls(inputs, read_vocabulary(io.BytesIO(data), len(inputs.sparse_feature_names)))
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
            raise BadInput(
                f"{os.path.join(model_dir, name)}: not the model's vocabulary ({type(e).__name__}: {e})"
            ) from e

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
            return (
                f"expected {NUM_FIELDS} tab-separated fields (label, {NUM_DENSE_FEATURES} integer, "
                f"{NUM_SPARSE_FEATURES} categorical) "
                f"or {NUM_FIELDS - 1} without the label, found {found}"
            )
        return reason

    def count_unseen(self, sparse: np.ndarray) -> np.ndarray:
        """Hashes missing from the vocabulary (preprocessing maps them to its
        out-of-vocabulary id 0, and so does the predictor); an empty field (hash 0) is
        not counted. Without a vocabulary every hash has its id (its low 31 bits, modulo
        the table size, as in training): none is unseen."""
        if self._vocabulary is None:
            return np.zeros(self._num_features, np.int64)
        return np.array(
            [
                np.count_nonzero((sparse[:, f] != 0) & ~np.isin(sparse[:, f], vocab))
                for f, vocab in enumerate(self._vocabulary)
            ],
            np.int64,
        )

    def column_names(self) -> list[str]:
        return ["label"]  # the raw features are hashes: the label is what a scorer keeps

    def _all_columns(self, label: np.ndarray, lines: ParsedLines) -> np.ndarray:
        return label

    def transform(self, dense: np.ndarray, sparse: np.ndarray) -> Features:
        ids = transform_sparse(sparse.astype(np.uint32), self._vocabulary, self._modulo).astype(np.int64)
        return transform_dense(dense.astype(np.int64)), ids
