"""What the ranks of a save or load share: every rank's value, a barrier, the lowest
rank's failure raised on all of them, and one line for a failure of DCP's collective
steps. With one process the collectives return at once, without a process group."""

from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException


def all_gather(value: Any, group: dist.ProcessGroup | None = None) -> list[Any]:
    """Every rank's ``value``, by rank (collective when several ranks run)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value, group=group)
    return gathered


def first_error(write: Callable[[], None]) -> OSError | None:
    """Runs ``write``; returns its OSError (a full disk) instead of raising it, for the
    ranks to share before any raises (a rank raising alone leaves the others waiting)."""
    try:
        write()
    except OSError as e:
        return e
    return None


def raise_first_error(errors: list[OSError | None]) -> None:
    """Raises the lowest rank's error, as DCP reports its own (CheckpointException)."""
    failures = {rank: (error, None) for rank, error in enumerate(errors) if error is not None}
    if failures:
        raise CheckpointException("save", failures)  # type: ignore[arg-type]


def barrier(group: dist.ProcessGroup | None = None) -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier(group=group)


def failure_line(error: BaseException) -> str:
    """One line for a failure; a DCP CheckpointException gives its lowest failing rank's."""
    where = ""
    if isinstance(error, CheckpointException) and error.failures:
        rank = min(error.failures)
        where, error = f" (on rank {rank})", error.failures[rank][0]
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return (lines[0] if lines else type(error).__name__)[:300] + where
