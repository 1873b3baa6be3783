"""Names and shapes of the Criteo in-memory binary layout (the public TorchRec example's).

A directory holds, per day i, ``day_{i}_dense.npy`` float32 (N, 13) with the dense
values already transformed by log(x + 3), ``day_{i}_sparse.npy`` int32 (N, 26) with
categorical ids, and ``day_{i}_labels.npy`` int32 (N, 1). An optional
``metadata.json`` records the per-feature cardinalities.
"""

import json
import os
from typing import Any, Dict, List, Optional

NUM_DENSE_FEATURES = 13
NUM_SPARSE_FEATURES = 26
DENSE_FEATURE_NAMES: List[str] = [f"int_{i}" for i in range(NUM_DENSE_FEATURES)]
SPARSE_FEATURE_NAMES: List[str] = [f"cat_{i}" for i in range(NUM_SPARSE_FEATURES)]
METADATA_FILE = "metadata.json"


def day_file(directory: str, day: int, kind: str) -> str:
    """Path of one day's array; kind is "dense", "sparse" or "labels"."""
    return os.path.join(directory, f"day_{day}_{kind}.npy")


def read_metadata(directory: str) -> Optional[Dict[str, Any]]:
    """The directory's metadata.json, or None when it has none."""
    path = os.path.join(directory, METADATA_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable metadata JSON ({e})") from e


def write_json_atomic(path: str, payload: Dict[str, Any]) -> None:
    """Writes JSON under a temporary name and renames it, so readers never see half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
