"""Reads the tables to plan from a feature spec file (JSON or YAML).

Two forms are accepted:

- ``{"num_embeddings_per_feature": [40000000, 39060, ...]}``, optionally with
  ``"sparse_feature_names": ["cat_0", ...]``; a Criteo directory's ``metadata.json``
  (written by the preprocessing and the synthetic generator, ``"format":
  "criteo_binary"``) is read by its own reader (`data.binary.criteo_layout.CriteoMetadata`);
- ``{"features": {"user_id": 1000000, "item_id": 250000}}``: rows per named feature.
"""

from typing import Any

import yaml

from common.errors import BadInput
from data.binary.criteo_layout import METADATA_FORMAT, SPARSE_FEATURE_NAMES, CriteoMetadata


class FeatureSpecError(BadInput):
    """The feature spec is unreadable or malformed; the message names the file."""


def _positive_ints(values: Any, path: str, key: str) -> list[int]:
    if not isinstance(values, list) or not values:
        raise FeatureSpecError(f"{path}: {key!r} must be a non-empty list of positive integers")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise FeatureSpecError(f"{path}: {key}[{i}] must be a positive integer, got {v!r}")
    return list(values)


def read_feature_spec(path: str) -> tuple[list[str], list[int]]:
    """(feature names, rows per feature) from ``path``.

    Example::

        names, rows = read_feature_spec("data_cache/synthetic_criteo/metadata.json")
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
        document = yaml.safe_load(data)  # YAML reads JSON too
    except OSError as e:
        raise FeatureSpecError(f"{path}: cannot read the feature spec: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise FeatureSpecError(f"{path}{where}: not valid JSON or YAML") from None
    if not isinstance(document, dict):
        raise FeatureSpecError(f'{path}: expected an object with "num_embeddings_per_feature" or "features"')
    if "format" in document and document["format"] == METADATA_FORMAT:
        sizes = CriteoMetadata.from_json(data, path).num_embeddings_per_feature
        if sizes is None:
            raise FeatureSpecError(f"{path}: records no num_embeddings_per_feature (the data's table sizes)")
        return list(SPARSE_FEATURE_NAMES), sizes
    if "features" in document:
        features = document["features"]
        if not isinstance(features, dict) or not features:
            raise FeatureSpecError(f'{path}: "features" must map feature names to row counts')
        names = [str(name) for name in features]
        return names, _positive_ints(list(features.values()), path, "features")
    if "num_embeddings_per_feature" in document:
        rows = _positive_ints(document["num_embeddings_per_feature"], path, "num_embeddings_per_feature")
        # Criteo's names by default: cat_0, cat_1, ...
        names = document.get("sparse_feature_names", [f"cat_{i}" for i in range(len(rows))])
        if not isinstance(names, list) or len(names) != len(rows) or len(set(map(str, names))) != len(names):
            raise FeatureSpecError(
                f'{path}: "sparse_feature_names" must list {len(rows)} distinct names, one per table'
            )
        return [str(n) for n in names], rows
    raise FeatureSpecError(f'{path}: expected an object with "num_embeddings_per_feature" or "features"')
