"""Names and shapes of the Criteo in-memory binary layout (the public TorchRec example's).

A directory holds, per day i, ``day_{i}_dense.npy`` float32 (N, 13) with the dense
values already transformed by log(x + 3), ``day_{i}_sparse.npy`` int32 (N, 26) with
categorical ids, and ``day_{i}_labels.npy`` int32 (N, 1); the MLPerf multi-hot
layout has ``day_{i}_sparse_multi_hot.npz`` instead of the sparse .npy. An optional
``metadata.json`` records the per-feature cardinalities, and, written last by this
project's writers, the number of days and their rows: the data set is then what it
lists, and day files beyond it are refused. Preprocessing marks each finished day with
``day_{i}.done.json``.
"""

import json
import os
import re
from typing import Any, Dict, List, Optional

from common.errors import BadInput

NUM_DENSE_FEATURES = 13
NUM_SPARSE_FEATURES = 26
DENSE_FEATURE_NAMES: List[str] = [f"int_{i}" for i in range(NUM_DENSE_FEATURES)]
SPARSE_FEATURE_NAMES: List[str] = [f"cat_{i}" for i in range(NUM_SPARSE_FEATURES)]
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


def day_files_from(directory: str, first_day: int) -> List[str]:
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


def read_metadata(directory: str) -> Optional[Dict[str, Any]]:
    """The directory's metadata.json, or None when it has none."""
    path = os.path.join(directory, METADATA_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise BadInput(f"{path}: not a readable metadata JSON ({e})") from e
