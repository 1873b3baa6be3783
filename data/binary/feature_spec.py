"""The feature specification YAML of NVIDIA's DLRM recipes: parsing and validation.

A spec has four keys:

- ``feature_spec``: ``{name: {dtype: numpy dtype, cardinality: int | auto, hotness: int}}``
- ``channel_spec``: ``{categorical: [names], numerical: [names], label: [one name]}``,
  optionally ``weight: [one name]``: each row's sample weight (``--weight_column``).
- ``source_spec``: ``{train: [chunk, ...], test: [chunk, ...]}``, a chunk being
  ``{type: csv | split_binary, features: [names in file order], files: [paths]}``
  with paths relative to the YAML's directory.
- ``metadata``: free-form.

In split_binary files (headerless, row-major) a chunk of numerical features is one
float16 file of shape (N, features), the label one bool file of shape (N,), the weight
(when there is one) one float32 file of shape (N,), and each
categorical feature its own file of shape (N, hotness) in the smallest of
int8/int16/int32 that holds its ids. The numerical channel may be empty (data of
categorical features only: no numerical chunk); the categorical one may not.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from common.atomic import write_text
from common.errors import BadInput
from common.yaml_file import load_yaml

CHANNELS = ("categorical", "numerical", "label", "weight")
# The binary dtype of the channels whose split_binary dtype is fixed; float32 weights:
# float16 would round them to 3 significant digits.
FIXED_BINARY_DTYPES = {"numerical": "float16", "label": "bool", "weight": "float32"}
MAPPINGS = ("train", "test")
CHUNK_TYPES = ("csv", "split_binary")
ID_DTYPES = ("int8", "int16", "int32")
AUTO = "auto"
DEFAULT_SPEC_NAME = "feature_spec.yaml"


class FeatureSpecError(BadInput):
    """One problem of a spec, named with the spec's path."""


def smallest_id_dtype(cardinality: int) -> str:
    """The smallest of int8/int16/int32 that holds ids 0 .. cardinality - 1.

    Example::

        smallest_id_dtype(128)  # "int8"; 129 needs "int16"
    """
    for name in ID_DTYPES:
        if cardinality - 1 <= np.iinfo(name).max:
            return name
    raise BadInput(f"cardinality {cardinality} does not fit int32 ids")


@dataclass
class Chunk:
    """One source of some features' columns: a CSV file set or one split_binary file."""

    type: str
    features: list[str]
    files: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "features": list(self.features), "files": list(self.files)}


@dataclass
class FeatureSpec:
    """A parsed spec; ``base_dir`` is where its relative file paths start.

    Args:
        feature_spec: per-feature dtype, cardinality and hotness.
        channel_spec: feature names per channel.
        source_spec: chunks per mapping ("train", "test").
        metadata: free-form.
        base_dir: directory the file paths are relative to.
        path: the YAML it came from (for messages).

    Example::

        spec = FeatureSpec.load("data/feature_spec.yaml")
        spec.check_split_binary_files()
        spec.cardinalities  # table sizes, in channel order
    """

    feature_spec: dict[str, dict[str, Any]]
    channel_spec: dict[str, list[str]]
    source_spec: dict[str, list[Chunk]]
    metadata: dict[str, Any] = field(default_factory=dict)
    base_dir: str = "."
    path: str = DEFAULT_SPEC_NAME

    def __post_init__(self) -> None:
        for channel in CHANNELS:  # an optional channel (weight) left out is empty
            self.channel_spec.setdefault(channel, [])

    @classmethod
    def load(cls, path: str, allow_auto: bool = False, weight: str | None = None) -> "FeatureSpec":
        """Reads and validates a YAML spec; raises FeatureSpecError.

        Args:
            path: the YAML.
            allow_auto: accept ``cardinality: auto`` (transcoder input).
            weight: a chunk's column to take as the weight channel, when channel_spec
                does not name it (the transcoder's ``--weight_column``).
        """
        raw = load_yaml(path, FeatureSpecError)
        return cls.from_dict(raw, os.path.dirname(os.path.abspath(path)), path, allow_auto, weight)

    @classmethod
    def from_dict(
        cls, raw: Any, base_dir: str, path: str, allow_auto: bool = False, weight: str | None = None
    ) -> "FeatureSpec":
        def fail(message: str) -> FeatureSpecError:
            return FeatureSpecError(f"{path}: {message}")

        if not isinstance(raw, dict):
            raise fail("must be a mapping with keys feature_spec, channel_spec, source_spec")
        for key in ("feature_spec", "channel_spec", "source_spec"):
            if not isinstance(raw.get(key), dict):
                raise fail(f"missing or malformed {key}")
        features = {str(k): dict(v or {}) for k, v in raw["feature_spec"].items()}
        channels = {c: [str(n) for n in (raw["channel_spec"].get(c) or [])] for c in CHANNELS}
        if weight is not None:
            if channels["weight"] not in ([], [weight]):
                raise fail(f"weight column {weight!r}: channel_spec weight is {channels['weight']}")
            channels["weight"] = [weight]
            features.setdefault(weight, {})  # a weight needs no dtype or cardinality
        sources: dict[str, list[Chunk]] = {}
        for mapping in MAPPINGS:
            chunks = raw["source_spec"].get(mapping)
            if not isinstance(chunks, list) or not chunks:
                raise fail(f"source_spec has no {mapping} mapping")
            sources[mapping] = []
            for i, c in enumerate(chunks):
                if not isinstance(c, dict) or c.get("type") not in CHUNK_TYPES:
                    raise fail(f"source_spec {mapping} chunk {i}: type must be one of {', '.join(CHUNK_TYPES)}")
                sources[mapping].append(
                    Chunk(c["type"], [str(n) for n in c.get("features") or []], [str(p) for p in c.get("files") or []])
                )
        spec = cls(features, channels, sources, dict(raw.get("metadata") or {}), base_dir, path)
        spec.validate(allow_auto)
        return spec

    # --- names and sizes -------------------------------------------------------------

    @property
    def categorical(self) -> list[str]:
        return self.channel_spec["categorical"]

    @property
    def numerical(self) -> list[str]:
        return self.channel_spec["numerical"]

    @property
    def label(self) -> str:
        return self.channel_spec["label"][0]

    @property
    def weight(self) -> str | None:
        """The sample-weight feature, or None when the spec declares none."""
        return self.channel_spec["weight"][0] if self.channel_spec["weight"] else None

    def hotness(self, name: str) -> int:
        return int(self.feature_spec[name].get("hotness", 1))

    @property
    def cardinalities(self) -> list[int]:
        """Table sizes of the categorical features, in channel order (all must be known)."""
        return [int(self.feature_spec[n]["cardinality"]) for n in self.categorical]

    def file_path(self, relative: str) -> str:
        return os.path.join(self.base_dir, relative)

    # --- validation ------------------------------------------------------------------

    def validate(self, allow_auto: bool = False) -> None:
        """Checks names, channels and cardinalities; one FeatureSpecError per problem.

        Args:
            allow_auto: accept ``cardinality: auto`` (transcoder input).
        """

        def fail(message: str) -> FeatureSpecError:
            return FeatureSpecError(f"{self.path}: {message}")

        if len(self.channel_spec["label"]) != 1:
            raise fail(f"channel_spec label must list exactly one feature, got {len(self.channel_spec['label'])}")
        if len(self.channel_spec["weight"]) > 1:
            raise fail(f"channel_spec weight lists at most one feature, got {len(self.channel_spec['weight'])}")
        # The numerical channel may be empty (click logs of ids only); the model needs embeddings.
        if not self.categorical:
            raise fail("channel_spec categorical lists no feature (the model needs at least one)")
        seen: dict[str, str] = {}
        for channel in CHANNELS:
            for name in self.channel_spec[channel]:
                if name not in self.feature_spec:
                    raise fail(f"channel_spec {channel} names {name!r}, which feature_spec does not define")
                if name in seen:
                    raise fail(f"feature {name!r} is in channel_spec {seen[name]} and {channel}")
                seen[name] = channel
        for name in self.categorical:
            self._check_categorical(name, allow_auto, fail)
        for mapping, chunks in self.source_spec.items():
            placed: dict[str, int] = {}
            for i, chunk in enumerate(chunks):
                where = f"source_spec {mapping} chunk {i}"
                if not chunk.files:
                    raise fail(f"{where} lists no files")
                if not chunk.features:
                    raise fail(f"{where} lists no features")
                for name in chunk.features:
                    if name not in seen:
                        raise fail(f"{where} lists unknown feature {name!r} (not in channel_spec)")
                    if name in placed:
                        raise fail(f"{where} repeats feature {name!r} (already in chunk {placed[name]})")
                    placed[name] = i
                if chunk.type == "split_binary":
                    self._check_binary_chunk(chunk, where, fail)
            missing = [n for n in seen if n not in placed]
            if missing:
                raise fail(f"feature {missing[0]!r} is in no chunk of source_spec {mapping}")

    def _check_categorical(self, name: str, allow_auto: bool, fail: Callable[[str], FeatureSpecError]) -> None:
        entry = self.feature_spec[name]
        cardinality = entry.get("cardinality")
        if cardinality is None or (cardinality == AUTO and not allow_auto):
            raise fail(
                f"categorical feature {name!r} has no cardinality"
                + (" (auto is only for transcoder input)" if cardinality == AUTO else "")
            )
        if cardinality != AUTO:
            if not isinstance(cardinality, int) or cardinality <= 0:
                raise fail(
                    f"categorical feature {name!r}: cardinality must be a positive integer or auto, got {cardinality!r}"
                )
            dtype = entry.get("dtype")
            if dtype is not None:
                try:
                    np_dtype = np.dtype(dtype)
                except TypeError as e:
                    raise fail(f"categorical feature {name!r}: unknown dtype {dtype!r}") from e
                if np_dtype.kind not in "iu" or cardinality - 1 > np.iinfo(np_dtype).max:
                    raise fail(
                        f"categorical feature {name!r}: dtype {dtype} is too small for cardinality "
                        f"{cardinality} (needs {smallest_id_dtype(cardinality)})"
                    )
        hotness = entry.get("hotness", 1)
        if not isinstance(hotness, int) or hotness <= 0:
            raise fail(f"categorical feature {name!r}: hotness must be a positive integer, got {hotness!r}")

    def _check_binary_chunk(self, chunk: Chunk, where: str, fail: Callable[[str], FeatureSpecError]) -> None:
        if len(chunk.files) != 1:
            raise fail(f"{where}: a split_binary chunk has exactly one file, got {len(chunk.files)}")
        kinds = {self.channel_of(n) for n in chunk.features}
        if len(kinds) != 1 or (kinds != {"numerical"} and len(chunk.features) != 1):
            raise fail(
                f"{where}: a split_binary file holds numerical features, or one categorical "
                f"feature, or the label, or the weight, got {chunk.features}"
            )
        for name in chunk.features:
            fixed = FIXED_BINARY_DTYPES.get(self.channel_of(name))
            declared = self.feature_spec[name].get("dtype")
            if fixed and declared is not None and str(declared) != fixed:
                raise fail(
                    f"{where}: split_binary stores {self.channel_of(name)} feature {name!r} as {fixed}, "
                    f"but feature_spec gives dtype {declared}"
                )

    def channel_of(self, name: str) -> str:
        return next(c for c in CHANNELS if name in self.channel_spec[c])

    # --- split_binary files ----------------------------------------------------------

    def binary_layout(self, chunk: Chunk) -> tuple[np.dtype, int]:
        """(dtype, values per row) of a split_binary chunk's file."""
        channel = self.channel_of(chunk.features[0])
        if channel in FIXED_BINARY_DTYPES:
            return np.dtype(FIXED_BINARY_DTYPES[channel]), len(chunk.features)
        name = chunk.features[0]
        dtype = self.feature_spec[name].get("dtype") or smallest_id_dtype(int(self.feature_spec[name]["cardinality"]))
        return np.dtype(dtype), self.hotness(name)

    def check_split_binary_files(self) -> dict[str, int]:
        """Checks every split_binary file exists and that all files of a mapping hold
        the same number of rows; returns {mapping: rows}."""
        rows: dict[str, int] = {}
        for mapping, chunks in self.source_spec.items():
            first: str | None = None
            for chunk in chunks:
                if chunk.type != "split_binary":
                    raise FeatureSpecError(
                        f"{self.path}: source_spec {mapping} has a {chunk.type} chunk; "
                        "training reads split_binary (run python -m data.transcode first)"
                    )
                path = self.file_path(chunk.files[0])
                if not os.path.isfile(path):
                    raise FeatureSpecError(
                        f"{self.path}: file {chunk.files[0]} of source_spec {mapping} is missing ({path})"
                    )
                dtype, width = self.binary_layout(chunk)
                row_bytes = dtype.itemsize * width
                size = os.path.getsize(path)
                if size % row_bytes:
                    raise FeatureSpecError(
                        f"{self.path}: file {chunk.files[0]} has {size} bytes, not a multiple "
                        f"of its row size {row_bytes} ({width} x {dtype.name})"
                    )
                n = size // row_bytes
                if mapping in rows and n != rows[mapping]:
                    raise FeatureSpecError(
                        f"{self.path}: file {chunk.files[0]} holds {n} rows but {first} "
                        f"holds {rows[mapping]} (source_spec {mapping})"
                    )
                rows.setdefault(mapping, n)
                first = first or chunk.files[0]
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "feature_spec": {k: dict(v) for k, v in self.feature_spec.items()},
            # No empty weight channel: specs without weights read as they always did.
            "channel_spec": {c: list(self.channel_spec[c]) for c in CHANNELS if c != "weight" or self.weight},
            "source_spec": {m: [c.to_dict() for c in chunks] for m, chunks in self.source_spec.items()},
            "metadata": dict(self.metadata),
        }

    def write(self, path: str) -> None:
        """Writes the YAML under a temporary name and renames it."""
        write_text(path, yaml.safe_dump(self.to_dict(), sort_keys=False))
