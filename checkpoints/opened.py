"""One checkpoint, opened once and verified, for every reader: the manifest (its
COMPLETE marker) read once, each file read through it and checked against it, its
meta.json parsed once, and DCP's ``.metadata`` unpickled once, without running code,
and checked against each state it is to fill.

Export, `--mode validate|test`, `--restore_checkpoint_path` and `--resume` each open a
checkpoint with `open_checkpoint` and hand the `OpenedCheckpoint` to the shape check and
the load (checkpoints/load.py), so the manifest is read and ``.metadata`` unpickled once
per run however many readers there are. A file checked here is read whole into memory,
then parsed from those bytes: what was checked is what is parsed.

Checkpoints saved before manifests existed (COMPLETE holds "complete") open with
``manifest`` None: their files are read unverified (the load warns), and still go
through the same checks of ``.metadata`` (checkpoints/dcp_metadata.py).

Example::

    checkpoint = open_checkpoint("ckpt/step_000000100")
    print(checkpoint.meta.step)
    load_checkpoint(checkpoint, {"model": model.state_dict()}, rank=0, restore_rng=False)
"""

import functools
import json
import os
from collections.abc import Mapping
from typing import Any

from iopath.common.file_io import g_pathmgr
from torch.distributed.checkpoint.metadata import Metadata

from checkpoints.dcp_metadata import UnsafeMetadataError, check_metadata, load_metadata
from checkpoints.directory import COMPLETE_MARKER, DCP_METADATA_FILE, MANIFEST_VERSION, META_FILE, is_complete
from checkpoints.errors import CheckpointError
from checkpoints.meta import CheckpointMeta
from checkpoints.storage import is_local, join, local_path
from common.errors import BadInput
from common.manifest import ManifestEntry, ManifestError, check_bytes, check_manifest_format

# The section of a checkpoint's state that every rank holds whole (a sharded table as a
# sharded tensor of all its rows); a rank's optimizer state covers only its own tables.
_WHOLE_ON_EVERY_RANK = ("model",)


def _read(file: str, mode: str, failure: str) -> Any:
    """The whole of ``file`` (text or bytes by ``mode``); ``failure`` and the reason, one
    line, when it cannot be read."""
    try:
        with g_pathmgr.open(file, mode) as f:
            return f.read()
    except OSError as e:
        raise CheckpointError(f"{failure} ({e.strerror or e})") from e


def read_manifest(path: str) -> dict[str, ManifestEntry] | None:
    """The manifest of a complete checkpoint (its COMPLETE marker's content): file name ->
    size and SHA-256. None for a checkpoint saved before manifests ("complete")."""
    marker = join(path, COMPLETE_MARKER)
    text = _read(marker, "r", f"checkpoint {path}: its {COMPLETE_MARKER} marker is unreadable")
    if text.strip() == "complete":
        return None
    try:
        manifest = json.loads(text)
        return check_manifest_format(manifest, marker, chunked=manifest.get("manifest_version") == MANIFEST_VERSION)
    except (BadInput, json.JSONDecodeError, AttributeError) as e:  # a ManifestError, not JSON, not an object
        raise CheckpointError(f"{marker}: not a checkpoint manifest (damaged?)") from e


class OpenedCheckpoint:
    """A complete checkpoint whose manifest has been read (`open_checkpoint`).

    ``meta`` (meta.json) and the DCP metadata are read on first use, each once, every
    file checked against the manifest before it is parsed.

    Attributes:
        path: the checkpoint's directory (any iopath path).
        manifest: file name -> size and digests; None for a checkpoint saved before
            manifests (its files are then read unverified).
    """

    def __init__(self, path: str, manifest: dict[str, ManifestEntry] | None) -> None:
        self.path = path
        self.manifest = manifest

    def __repr__(self) -> str:
        return f"OpenedCheckpoint({self.path!r})"

    def read(self, name: str) -> bytes:
        """The bytes of the checkpoint's file ``name``, checked against the manifest."""
        file = join(self.path, name)
        data = _read(file, "rb", f"checkpoint {self.path}: {name} is missing or unreadable")
        if self.manifest is not None:
            try:
                check_bytes(data, file, self.manifest.get(name))
            except ManifestError as e:
                raise CheckpointError(f"checkpoint file {e}") from e
        return data

    def has(self, name: str) -> bool:
        """Whether the checkpoint holds the file ``name`` (by its manifest, when it has one)."""
        return name in self.manifest if self.manifest is not None else g_pathmgr.exists(join(self.path, name))

    @functools.cached_property
    def meta(self) -> CheckpointMeta:
        """meta.json; FileFieldError (naming the field) when malformed or newer than this code."""
        return CheckpointMeta.from_json(self.read(META_FILE), join(self.path, META_FILE))

    @functools.cached_property
    def _unchecked_dcp_metadata(self) -> Metadata:
        source = join(self.path, DCP_METADATA_FILE)
        try:
            return load_metadata(self.read(DCP_METADATA_FILE), source)
        except UnsafeMetadataError as e:
            raise CheckpointError(f"checkpoint file {e}") from e

    def dcp_metadata(self, flat: Mapping[str, Any]) -> Metadata:
        """The checkpoint's .metadata, unpickled without running code (once), and checked
        against the flat state it is to fill (`check_metadata`, at every call: a shape
        check and the load fill different states); CheckpointError naming the file."""
        metadata = self._unchecked_dcp_metadata
        source = join(self.path, DCP_METADATA_FILE)
        try:
            check_metadata(
                metadata, flat, source, set(self.manifest) if self.manifest is not None else None, _WHOLE_ON_EVERY_RANK
            )
        except UnsafeMetadataError as e:
            raise CheckpointError(f"checkpoint file {e}") from e
        return metadata

    def file_size(self, name: str) -> int | None:
        """The size of one file of the checkpoint: on disk for a local one, else its
        manifest's (None: unknown, an old remote checkpoint)."""
        if is_local(self.path):
            try:
                return os.path.getsize(os.path.join(local_path(self.path), os.path.basename(name)))
            except OSError as e:
                raise CheckpointError(
                    f"checkpoint {self.path}: {name} is missing or unreadable ({e.strerror or e})"
                ) from e
        entry = (self.manifest or {}).get(os.path.basename(name))
        return int(entry["bytes"]) if entry else None


def open_checkpoint(path: str) -> OpenedCheckpoint:
    """The checkpoint at ``path``, its manifest read and checked; CheckpointError when it
    is absent, incomplete, or its manifest unreadable."""
    if not g_pathmgr.exists(path):
        raise CheckpointError(f"checkpoint {path}: no such directory")
    if not is_complete(path):
        raise CheckpointError(f"checkpoint {path} is incomplete (no {COMPLETE_MARKER} marker): its save did not finish")
    return OpenedCheckpoint(path, read_manifest(path))


def read_meta(path: str) -> CheckpointMeta:
    """The checkpoint's meta.json; CheckpointError when absent, incomplete or unreadable,
    FileFieldError (naming the field) when malformed or newer than this code."""
    return open_checkpoint(path).meta
