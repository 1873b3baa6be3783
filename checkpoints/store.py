"""Deprecated alias (for one release) of the modules checkpoints/store.py was split
into: `checkpoints.directory` (layout, listing, which checkpoint is newest, best, or the
one to load), `checkpoints.save` (the lock, `CheckpointManager`), `checkpoints.opened`
(one verified open: `open_checkpoint`, `read_meta`, `read_manifest`),
`checkpoints.load` (`load_checkpoint`, `check_stored_shapes`) and `checkpoints.state`
(the flattened state, the random generators). Import from those instead."""

from checkpoints.directory import (
    BEST_FILE,
    COMPLETE_MARKER,
    DCP_METADATA_FILE,
    LOCK_FILE,
    MANIFEST_VERSION,
    META_FILE,
    best_checkpoint,
    checkpoint_to_load,
    complete_checkpoints,
    export_role,
    is_complete,
    newest_checkpoint,
)
from checkpoints.load import check_stored_shapes, load_checkpoint
from checkpoints.opened import OpenedCheckpoint, open_checkpoint, read_manifest, read_meta
from checkpoints.save import CheckpointManager, check_writable, lock_checkpoint_dir
from checkpoints.state import flat_state
from checkpoints.state import rng_state as _rng_state  # noqa: F401  (its old private name, for one release)
from checkpoints.state import set_rng_state as _set_rng_state  # noqa: F401

__all__ = [
    "BEST_FILE",
    "COMPLETE_MARKER",
    "DCP_METADATA_FILE",
    "LOCK_FILE",
    "MANIFEST_VERSION",
    "META_FILE",
    "CheckpointManager",
    "OpenedCheckpoint",
    "best_checkpoint",
    "check_stored_shapes",
    "check_writable",
    "checkpoint_to_load",
    "complete_checkpoints",
    "export_role",
    "flat_state",
    "is_complete",
    "load_checkpoint",
    "lock_checkpoint_dir",
    "newest_checkpoint",
    "open_checkpoint",
    "read_manifest",
    "read_meta",
]
