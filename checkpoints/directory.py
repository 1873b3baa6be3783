"""A directory of checkpoints: its layout, the names of its files, and which of its
checkpoints counts (complete), is the newest, is marked best, or is the one to load.

Layout of ``--checkpoint_dir``::

    step_000000120/
        __0_0.distcp, __0_1.distcp, __1_0.distcp, ...
        .metadata                               DCP: model shards, optimizer state (two files a rank)
        rank_0.pt, rank_1.pt                    each rank's RNG states (tensors only)
        meta.json                               step, data position, config, plan
                                                (checkpoints/meta.py)
        COMPLETE                                written last, once every rank is done: the
                                                manifest (every file's size and SHA-256; a
                                                data file's per chunk)
    best.json                                   which checkpoint is the best (early stopping)
    .lock                                       held by the training run saving here (its host,
                                                pid and start time; `checkpoints.save.lock_checkpoint_dir`)

A checkpoint counts only once COMPLETE exists, so a run killed mid-save leaves the
previous complete checkpoint as the newest one. Saving is checkpoints/save.py, the
verified open of one checkpoint checkpoints/opened.py, loading checkpoints/load.py.
"""

import json
import os
import re

from iopath.common.file_io import g_pathmgr

from checkpoints.errors import CheckpointError
from checkpoints.storage import join

COMPLETE_MARKER = "COMPLETE"
META_FILE = "meta.json"
DCP_METADATA_FILE = ".metadata"
# 2: a data file's entry gives a digest per chunk (each item DCP writes), checked as
# it is read; 1: one SHA-256 per file, checked in a pass before the file is read.
MANIFEST_VERSION = 2
BEST_FILE = "best.json"
LOCK_FILE = ".lock"
_STEP_DIR = re.compile(r"step_(\d+)$")


def step_dir_name(step: int) -> str:
    """The name of the checkpoint of ``step`` in its directory."""
    return f"step_{step:09d}"


def is_step_dir(name: str) -> bool:
    """Whether ``name`` (a base name) is named as a checkpoint of a directory."""
    return _STEP_DIR.match(name) is not None


def is_complete(path: str) -> bool:
    return g_pathmgr.exists(join(path, COMPLETE_MARKER))


def complete_checkpoints(directory: str) -> list[str]:
    """Complete checkpoints in ``directory``, oldest first."""
    if not g_pathmgr.exists(directory):
        return []
    found = []
    for name in g_pathmgr.ls(directory):
        match = _STEP_DIR.match(name)
        path = join(directory, name)
        if match and is_complete(path):
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def newest_checkpoint(directory: str) -> str | None:
    complete = complete_checkpoints(directory)
    return complete[-1] if complete else None


def best_checkpoint(directory: str) -> str | None:
    """The checkpoint best.json marks in ``directory``; None when none is marked."""
    pointer = join(directory, BEST_FILE)
    if not g_pathmgr.exists(pointer):
        return None
    try:
        with g_pathmgr.open(pointer, "r") as f:
            name = json.load(f)["checkpoint"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{pointer} is unreadable ({e})") from e
    path = join(directory, str(name))
    if not _STEP_DIR.match(str(name)) or not is_complete(path):
        raise CheckpointError(f"{pointer} marks {name!r} as best, which is not a complete checkpoint of {directory}")
    return path


def checkpoint_to_load(path: str, flag: str, prefer_best: bool = True) -> str:
    """``path`` when it is a checkpoint; for a directory of checkpoints, the one marked
    best (unless ``prefer_best`` is False), else the newest complete one. ``flag`` names
    the path in the error when there is none."""
    if g_pathmgr.exists(join(path, META_FILE)) or _STEP_DIR.match(os.path.basename(path.rstrip("/"))):
        return path
    chosen = (best_checkpoint(path) if prefer_best and g_pathmgr.exists(path) else None) or newest_checkpoint(path)
    if chosen is None:
        raise CheckpointError(f"{flag} {path}: neither a checkpoint nor a directory holding a complete one")
    return chosen


def export_role(path: str) -> tuple[str, bool]:
    """What the checkpoint ``path`` is to its directory, for the lines that say which
    model a figure is of: ("best", ...) when best.json marks it, ("newest", ...) when
    none is marked and it is the newest complete one, ("", ...) otherwise; and whether
    ``serving.export --checkpoint DIR`` takes it (`checkpoint_to_load`, the export's own
    choice, so the two cannot disagree)."""
    path = path.rstrip("/")
    directory = os.path.dirname(path)
    try:
        exported = checkpoint_to_load(directory, "--checkpoint").rstrip("/") == path
        best = best_checkpoint(directory)
    except (CheckpointError, OSError):  # not in a directory of checkpoints: export takes only what it is given
        return "", False
    if best is not None and best.rstrip("/") == path:
        return "best", exported
    return ("newest" if exported else ""), exported
