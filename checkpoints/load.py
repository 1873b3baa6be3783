"""Loading a checkpoint into live state: every tensor filled in place through DCP, each
rank's random generators restored, and the check that a checkpoint stores what a
model declares before the model is allocated.

Both take an `OpenedCheckpoint` (checkpoints/opened.py), or a path, which they open
themselves. Nothing here runs code from a file: ``.metadata`` goes through a restricted
unpickler and is checked against the state being loaded before any data file is opened
(checkpoints/dcp_metadata.py: tensors only, the live keys, shapes and dtypes, data files
of the directory); each data file's chunks are checked against the manifest as DCP's
reader reads them, before torch.load sees them, and a damaged one is refused by name and
byte range; tensors come back through DCP's ``torch.load(weights_only=True)``, the rest
is JSON. A checkpoint without a manifest goes through the same checks, with a warning.
"""

import io
import pickle
import sys
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from checkpoints.collective import failure_line
from checkpoints.errors import CheckpointError
from checkpoints.opened import OpenedCheckpoint, open_checkpoint
from checkpoints.state import checked_rng_state, flat_state, set_rng_state
from checkpoints.storage import IOPathReader, TensorLoadPlanner, join


def _opened(checkpoint: str | OpenedCheckpoint) -> OpenedCheckpoint:
    return checkpoint if isinstance(checkpoint, OpenedCheckpoint) else open_checkpoint(checkpoint)


def check_stored_shapes(checkpoint: str | OpenedCheckpoint, state: dict[str, Any]) -> None:
    """Raises CheckpointError unless the checkpoint stores every tensor of ``state``
    with its shape, in data files large enough to hold them. Reads .metadata and the
    files' sizes only, so ``state`` may live on the meta device: a meta.json declaring
    tables other than those stored is refused before the model is allocated."""
    opened = _opened(checkpoint)
    flat = {name: value for name, value in flat_state(state).items() if torch.is_tensor(value)}
    metadata = opened.dcp_metadata(flat)
    needed = sum(
        value.numel() * metadata.state_dict_metadata[name].properties.dtype.itemsize for name, value in flat.items()
    )
    sizes = [opened.file_size(str(name)) for name in {info.relative_path for info in metadata.storage_data.values()}]
    held = sum(size for size in sizes if size is not None)
    if None not in sizes and needed > held:
        raise CheckpointError(
            f"checkpoint {opened.path}: its tensors need {needed} bytes, its data files hold "
            f"{held}: meta.json and .metadata describe more than is stored"
        )


def load_checkpoint(checkpoint: str | OpenedCheckpoint, state: dict[str, Any], rank: int, restore_rng: bool) -> None:
    """Fills ``state`` (tensors and sharded tensors, in place) from the checkpoint.

    Raises CheckpointError when the files are missing, corrupted, or not what the
    project writes for ``state`` (on every rank).
    """
    opened = _opened(checkpoint)
    path, manifest = opened.path, opened.manifest
    flat = flat_state(state)
    if manifest is None and rank == 0:
        print(
            f"warning: checkpoint {path} has no manifest (saved before integrity checks): "
            "its files are loaded unverified",
            file=sys.stderr,
            flush=True,
        )
    # Read and checked against the state it fills here, on every rank before any
    # collective and before DCP opens a data file: a missing, damaged or crafted file
    # fails every rank alike with one line. With or without a manifest: whoever crafts
    # the files can rewrite it too.
    metadata = opened.dcp_metadata(flat)
    try:
        dcp.load(flat, storage_reader=IOPathReader(path, metadata, manifest), planner=TensorLoadPlanner())
    except (Exception, CheckpointException) as e:  # DCP gathers every rank's failure; report one line
        raise CheckpointError(f"checkpoint {path} could not be loaded: {failure_line(e)}") from e
    rank_file = f"rank_{rank}.pt"
    if restore_rng and opened.has(rank_file):
        data = opened.read(rank_file)
        try:
            loaded = torch.load(io.BytesIO(data), weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, LookupError, TypeError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint file {join(path, rank_file)}: not the random-generator state "
                "the project saves (tensors and plain values): refused"
            ) from e
        try:
            generators = checked_rng_state(loaded)
        except (TypeError, ValueError) as e:
            first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise CheckpointError(
                f"checkpoint file {join(path, rank_file)}: not the random-generator state "
                f"the project saves ({first_line}): refused"
            ) from e
        set_rng_state(generators)
