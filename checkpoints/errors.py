"""What goes wrong with a checkpoint: bad input (exit 2) when reading, a rank failure when writing."""

from common.errors import BadInput, RankError


class CheckpointError(BadInput):
    """A checkpoint cannot be used: missing, incomplete, corrupted or for another model."""


class CheckpointSaveError(RankError):
    """A checkpoint could not be written (a full disk, a lost mount); nothing complete was
    replaced or removed."""
