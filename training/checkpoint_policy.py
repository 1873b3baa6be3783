"""What a training run decides about checkpoints: which one it starts from (weights
only, or everything to resume), checked against its flags, and when a save is due by
the clock. The checkpoint format itself (saving, finding, verifying, loading) is the
`checkpoints` package (`directory`, `save`, `opened`, `load`).
"""

import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
from iopath.common.file_io import g_pathmgr

from checkpoints.directory import META_FILE, best_checkpoint, checkpoint_to_load, newest_checkpoint
from checkpoints.errors import CheckpointError
from checkpoints.meta import CheckpointMeta, meta_section
from checkpoints.opened import OpenedCheckpoint, open_checkpoint
from checkpoints.storage import join
from training.config import CheckpointConfig, OptimizerConfig, TrainConfig


def iter_differences(saved: Any, current: Any, prefix: str = "") -> Iterator[str]:
    """Describes where two JSON-like values differ (dict keys as dotted paths)."""
    if isinstance(saved, dict) and isinstance(current, dict):
        for key in sorted(set(saved) | set(current)):
            yield from iter_differences(saved.get(key), current.get(key), f"{prefix}{key}.")
    elif saved != current:

        def short(v: Any) -> str:
            text = json.dumps(v)
            return text if len(text) <= 60 else text[:57] + "..."

        yield f"{prefix.rstrip('.')} is {short(saved)} in the checkpoint, {short(current)} now"


@dataclass
class RestorePoint:
    """A checkpoint a run starts from: weights only, or everything (``full``), opened
    once: its meta.json checked here, its tensors loaded from the same opening."""

    checkpoint: OpenedCheckpoint
    full: bool

    @property
    def path(self) -> str:
        return self.checkpoint.path

    @property
    def meta(self) -> CheckpointMeta:
        return self.checkpoint.meta


def checkpoint_to_evaluate(flags: CheckpointConfig) -> str:
    """The checkpoint whose weights a run loads (--restore_checkpoint_path, or --mode
    validate|test with --checkpoint_dir): that path, or the best of a directory when
    one is marked, else its newest."""
    if flags.restore_checkpoint_path:
        path = flags.restore_checkpoint_path
        # A missing path: read_meta says so.
        return checkpoint_to_load(path, "--restore_checkpoint_path") if g_pathmgr.exists(path) else path
    path = best_checkpoint(flags.checkpoint_dir) or newest_checkpoint(flags.checkpoint_dir)  # type: ignore[arg-type]
    if path is None:
        raise CheckpointError(f"--checkpoint_dir {flags.checkpoint_dir}: no complete checkpoint to evaluate")
    return path


def find_restore_point(config: TrainConfig) -> RestorePoint | None:
    """The checkpoint the flags ask for, checked against the config; None to start fresh.

    Reads only meta.json, so every rank can call it before any collective and fail
    with the same one-line CheckpointError.
    """
    flags = config.checkpoint
    full = flags.resume and config.mode == "train"
    if full:
        path = newest_checkpoint(flags.checkpoint_dir)  # type: ignore[arg-type]
        if path is None:
            return None
    elif flags.restore_checkpoint_path or (config.mode != "train" and flags.checkpoint_dir):
        path = checkpoint_to_evaluate(flags)
    else:
        return None  # inference_benchmark without a checkpoint: a freshly built model
    checkpoint = open_checkpoint(path)
    meta = checkpoint.meta
    # Read in every mode: a section this code does not know is refused up front.
    recorded = meta_section(meta.config, "optim", OptimizerConfig, join(path, META_FILE))
    differences = list(iter_differences(asdict(meta.model), asdict(config.model)))
    if full:
        differences += list(iter_differences(optimizers_of(recorded), optimizers_of(config.optim), "optim."))
    if differences:
        more = f" (and {len(differences) - 3} more differences)" if len(differences) > 3 else ""
        raise CheckpointError(f"checkpoint {path} does not match this run: {'; '.join(differences[:3])}{more}")
    return RestorePoint(checkpoint, full)


def optimizers_of(optim: OptimizerConfig) -> dict[str, str]:
    """The optimizers whose state a checkpoint holds (a resume, or a warm start that
    carries it, needs the same ones)."""
    return {"optimizer": optim.optimizer, "dense_optimizer": optim.resolved_dense_optimizer}


class MinuteCadence:
    """``--checkpoint_every_n_minutes``: whether a save is due at this step. Rank 0's
    clock decides and broadcasts it, so that every rank saves at the same step (each
    rank's own clock would now and then disagree by a step, and the save is collective).
    The broadcast goes through a gloo group of its own: on NCCL it would synchronize
    the host with the GPU at every step.

    Args:
        minutes: the interval; it starts at construction and at each `restart` (a save).
            Collective when several ranks run (it creates the broadcast's group).
    """

    def __init__(self, minutes: float) -> None:
        self.seconds = minutes * 60
        self._group = dist.new_group(backend="gloo") if dist.is_initialized() and dist.get_world_size() > 1 else None
        self.restart()

    def restart(self) -> None:
        self._since = time.monotonic()

    def due(self) -> bool:
        """Collective: one byte broadcast from rank 0."""
        decision = torch.tensor([time.monotonic() - self._since >= self.seconds], dtype=torch.uint8)
        if self._group is not None:
            dist.broadcast(decision, src=0, group=self._group)
        return bool(decision.item())
