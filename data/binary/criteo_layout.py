"""Names and shapes of the Criteo in-memory binary layout (the public TorchRec example's).

A directory holds, per day i, ``day_{i}_dense.npy`` float32 (N, 13) with the dense
values already transformed by log(x + 3), ``day_{i}_sparse.npy`` int32 (N, 26) with
categorical ids, and ``day_{i}_labels.npy`` int32 (N, 1); the MLPerf multi-hot
layout has ``day_{i}_sparse_multi_hot.npz`` instead of the sparse .npy. An optional
``metadata.json`` (`CriteoMetadata`) records the per-feature cardinalities, and, written
last by this project's writers, the number of days and their rows: the data set is then
what it lists, and day files beyond it are refused. Preprocessing marks each finished
day with ``day_{i}.done.json``.
"""

import os
import re
from dataclasses import dataclass
from typing import Any

from common.atomic import write_bytes
from common.json_fields import (
    COUNTS,
    INTEGER,
    NUMBER,
    OBJECT,
    TEXT,
    FileFieldError,
    JsonObject,
    Kind,
    int_list,
    integer,
    one_of,
    optional,
    versioned_json,
)

NUM_DENSE_FEATURES = 13
NUM_SPARSE_FEATURES = 26
DENSE_FEATURE_NAMES: list[str] = [f"int_{i}" for i in range(NUM_DENSE_FEATURES)]
SPARSE_FEATURE_NAMES: list[str] = [f"cat_{i}" for i in range(NUM_SPARSE_FEATURES)]
METADATA_FILE = "metadata.json"
DAY_KINDS = ("dense", "sparse", "labels")
# Every per-day file name of the layouts above, with its day number.
_DAY_FILE = re.compile(r"day_(\d+)(?:_(?:dense|sparse|labels)\.npy|_sparse_multi_hot\.npz|\.done\.json)")


def day_file(directory: str, day: int, kind: str) -> str:
    """Path of one day's array; kind is "dense", "sparse" or "labels"."""
    return os.path.join(directory, f"day_{day}_{kind}.npy")


def multi_hot_file(directory: str, day: int) -> str:
    """Path of one day's multi-hot ids (the MLPerf layout)."""
    return os.path.join(directory, f"day_{day}_sparse_multi_hot.npz")


def done_marker(directory: str, day: int) -> str:
    """Path of the marker preprocessing writes when a day's files are complete."""
    return os.path.join(directory, f"day_{day}.done.json")


def day_files_from(directory: str, first_day: int) -> list[str]:
    """Paths of the directory's per-day files (any layout, markers too) of days
    ``first_day`` and later, in name order.

    Example::

        day_files_from("data_cache/synthetic_criteo", 3)  # ["data_cache/.../day_3_dense.npy", ...]
    """
    found = []
    for name in sorted(os.listdir(directory)):
        match = _DAY_FILE.fullmatch(name)
        if match and int(match.group(1)) >= first_day:
            found.append(os.path.join(directory, name))
    return found


def remove_day_files_from(directory: str, first_day: int) -> None:
    """Removes the per-day files of days ``first_day`` and later: a writer's leftovers
    of an earlier, longer data set in the same directory."""
    for path in day_files_from(directory, first_day):
        os.remove(path)


# metadata.json's format: 1 had "format_version" (same fields); a file without a
# version (hand-written, or older than the format) is version 0: every field optional.
METADATA_VERSION = 2
METADATA_FORMAT = "criteo_binary"
_WHAT = "a Criteo binary directory's metadata.json"


@dataclass
class CriteoMetadata:
    """The contents of a Criteo binary directory's metadata.json (`read_metadata`,
    `write_metadata`), written by data/synthetic_criteo.py and data/preprocess_criteo.py.

    Args:
        num_days: day files of the data set (None: as many as there are).
        rows_per_day: rows of each day (None: unchecked).
        num_embeddings_per_feature: each categorical feature's cardinality (ids
            below it); None: the table-size flags decide.
        num_dense_features, num_sparse_features: the layout's (13 and 26).
        dataset_name: criteo_1t or criteo_kaggle (preprocessing).
        dense_transform: the formula preprocessing applied to the dense values.
        frequency_threshold: preprocessing's vocabulary threshold (0: none).
        modulo_num_embeddings_per_feature: table sizes preprocessing took ids modulo.
        bad_lines: lines preprocessing skipped, per input file.
        split: which rows are train, validation and test, in words.
        vocabulary_from: the training data directory whose vocabulary was applied.
        positive_rate: fraction of label 1 (the synthetic generator).
        multi_hot_sizes, multi_hot_distribution_type: the multi-hot layout's bags.
        generator: the synthetic generator's settings (it skips an identical data set).
        version: the file format.

    Example::

        metadata = read_metadata("data_cache/synthetic_criteo")
        sizes = metadata.num_embeddings_per_feature if metadata else None
    """

    num_days: int | None = None
    rows_per_day: list[int] | None = None
    num_embeddings_per_feature: list[int] | None = None
    num_dense_features: int = NUM_DENSE_FEATURES
    num_sparse_features: int = NUM_SPARSE_FEATURES
    dataset_name: str | None = None
    dense_transform: str | None = None
    frequency_threshold: int = 0
    modulo_num_embeddings_per_feature: list[int] | None = None
    bad_lines: dict[str, int] | None = None
    split: str | None = None
    vocabulary_from: str | None = None
    positive_rate: float | None = None
    multi_hot_sizes: list[int] | None = None
    multi_hot_distribution_type: str | None = None
    generator: dict[str, Any] | None = None
    version: int = METADATA_VERSION

    def to_json(self) -> bytes:
        """The file's bytes (version and format first)."""
        return versioned_json(self, format=METADATA_FORMAT)

    @classmethod
    def from_json(cls, data: bytes, path: str) -> "CriteoMetadata":
        """Reads the bytes of ``path`` (any version up to `METADATA_VERSION`).

        Raises:
            FileFieldError: one line naming ``path`` and the field that is missing,
                malformed, contradicts another, or of a newer version.
        """
        document = JsonObject.parse(data, path, _WHAT)
        versioned = document.has("version") or document.has("format_version")
        version = document.version(METADATA_VERSION, legacy_key="format_version") if versioned else 0
        document.get("format", one_of(METADATA_FORMAT), None)

        def written(name: str, kind: Kind) -> Any:
            """A field this project's writers always wrote (required from version 1 on)."""
            return document.get(name, kind) if version >= 1 else document.get(name, optional(kind), None)

        for name, count in (("num_dense_features", NUM_DENSE_FEATURES), ("num_sparse_features", NUM_SPARSE_FEATURES)):
            document.get(
                name,
                Kind(lambda v, count=count: v == count and not isinstance(v, bool), f"{count} (the Criteo layout's)"),
                None,
            )
        sizes = int_list(NUM_SPARSE_FEATURES, minimum=1)
        num_days = written("num_days", integer(1))
        rows_per_day = written("rows_per_day", int_list())
        if num_days is not None and rows_per_day is not None and len(rows_per_day) != num_days:
            raise FileFieldError(f"{path}: rows_per_day lists {len(rows_per_day)} days but num_days is {num_days}")
        return cls(
            num_days=num_days,
            rows_per_day=rows_per_day,
            num_embeddings_per_feature=written("num_embeddings_per_feature", sizes),
            dataset_name=document.get("dataset_name", optional(TEXT), None),
            dense_transform=document.get("dense_transform", optional(TEXT), None),
            frequency_threshold=document.get("frequency_threshold", INTEGER, 0),
            modulo_num_embeddings_per_feature=document.get("modulo_num_embeddings_per_feature", optional(sizes), None),
            bad_lines=document.get("bad_lines", optional(COUNTS), None),
            split=document.get("split", optional(TEXT), None),
            vocabulary_from=document.get("vocabulary_from", optional(TEXT), None),
            positive_rate=document.get("positive_rate", optional(NUMBER), None),
            multi_hot_sizes=document.get("multi_hot_sizes", optional(sizes), None),
            multi_hot_distribution_type=document.get("multi_hot_distribution_type", optional(TEXT), None),
            generator=document.get("generator", optional(OBJECT), None),
        )


def metadata_file(directory: str) -> str:
    """Path of the directory's metadata.json."""
    return os.path.join(directory, METADATA_FILE)


def read_metadata(directory: str) -> CriteoMetadata | None:
    """The directory's metadata.json, or None when it has none.

    Raises:
        FileFieldError: one line naming the file and the field (`CriteoMetadata.from_json`).
    """
    path = metadata_file(directory)
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise FileFieldError(f"{path}: cannot read ({e.strerror})") from e
    return CriteoMetadata.from_json(data, path)


def write_metadata(directory: str, metadata: CriteoMetadata) -> None:
    """Writes the directory's metadata.json atomically (a data set's writer's last step)."""
    write_bytes(metadata_file(directory), metadata.to_json())
