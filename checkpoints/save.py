"""Saving checkpoints into a directory (checkpoints/directory.py has its layout): the
run's lock on it, the check that it is writable, and `CheckpointManager`, which saves
atomically (COMPLETE, the manifest, last), marks the best, and prunes.

Files are hashed as they are written, a data file chunk by chunk (each item DCP
writes), into the manifest that COMPLETE holds. Older checkpoints are pruned only after
a newer one is complete; the one best.json names is never pruned. With
``asynchronous`` (--async_checkpoint) the state is copied to host memory and written by
a background thread while training goes on.
"""

import concurrent.futures
import contextlib
import copy
import json
import os
import threading
import uuid
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from iopath.common.file_io import g_pathmgr
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint.api import CheckpointException

from checkpoints.collective import all_gather, barrier, failure_line, first_error, raise_first_error
from checkpoints.directory import (
    BEST_FILE,
    COMPLETE_MARKER,
    LOCK_FILE,
    MANIFEST_VERSION,
    META_FILE,
    best_checkpoint,
    complete_checkpoints,
    is_complete,
    is_step_dir,
    step_dir_name,
)
from checkpoints.errors import CheckpointError, CheckpointSaveError
from checkpoints.meta import CheckpointMeta
from checkpoints.state import flat_state, rng_state
from checkpoints.storage import IOPathFileSystem, IOPathWriter, NoCopySavePlanner, is_local, join, local_path
from common.atomic import write_json
from common.manifest import ManifestEntry, entry_of_bytes
from common.path_lock import LockHeld, PathLock
from common.sigterm import Terminated, sigterm_deferred


def check_writable(directory: str) -> None:
    """Raises CheckpointError unless files can be created in ``directory`` (made if
    missing), so that a run learns it before training rather than at its first save."""
    probe = join(directory, f".write-test-{uuid.uuid4().hex}")
    try:
        g_pathmgr.mkdirs(directory)
        with g_pathmgr.open(probe, "w") as f:
            f.write("")
        g_pathmgr.rm(probe)
    except OSError as e:
        raise CheckpointError(f"--checkpoint_dir {directory}: cannot write there ({e.strerror or e})") from e


def lock_checkpoint_dir(directory: str, rank: int) -> PathLock | None:
    """Rank 0 takes ``directory``'s lock for the run (common/path_lock.py): a second
    run saving there would prune the first one's saves, and a resume would take the
    newest of either. Every rank raises LockHeld, naming the holder, when another run
    holds it. Returns rank 0's lock (None elsewhere, and for a remote iopath directory,
    which is not locked). Collective."""
    lock, refusal = None, None
    if rank == 0 and is_local(directory):
        lock = PathLock(join(local_path(directory), LOCK_FILE), f"--checkpoint_dir {directory}")
        try:
            lock.acquire()
        except LockHeld as e:
            lock, refusal = None, str(e)
    refusal = all_gather(refusal)[0]
    if refusal is not None:
        raise LockHeld(refusal)
    return lock


class CheckpointManager:
    """Saves and finds the checkpoints of one directory. Save and load are collective.

    With ``asynchronous``, `save` copies the state to host memory and returns; a
    background thread writes it, with its collectives on a gloo group of its own (the
    training step's collectives on the default group run meanwhile, and two threads'
    collectives on one group would interleave). The thread runs the same
    save as the blocking one, COMPLETE last once every rank's files are durable. One
    save is in flight at a time: the next `save`, `mark_best` and `wait` wait for it
    and raise its error, the blocking save's, on every rank (they all wait).

    Args:
        directory: where checkpoints go (any iopath path).
        keep_last_n: complete checkpoints to keep (0: all).
        rank: this process's rank; rank 0 writes meta.json, the marker, and prunes.
        asynchronous: write in the background (``--async_checkpoint``). Collective
            when several ranks run (it creates the save's process group).

    Example::

        manager = CheckpointManager("ckpt", keep_last_n=2, rank=0)
        manager.save({"model": dmp.state_dict()}, meta)  # meta: a CheckpointMeta of step 120
    """

    def __init__(self, directory: str, keep_last_n: int, rank: int, asynchronous: bool = False) -> None:
        self.directory = directory
        self.keep_last_n = keep_last_n
        self.rank = rank
        self.asynchronous = asynchronous
        self._group = (
            dist.new_group(backend="gloo")
            if asynchronous and dist.is_initialized() and dist.get_world_size() > 1
            else None
        )
        self._in_flight: concurrent.futures.Future | None = None

    def save(self, state: dict[str, Any], meta: CheckpointMeta) -> str:
        """Writes the checkpoint of ``meta.step``; returns its path. Collective.

        Raises CheckpointSaveError (one line) on every rank when the storage fails on
        any, e.g. a full disk: the partial checkpoint is removed and every complete one
        kept. Raises Terminated when SIGTERM arrives meanwhile: the partial checkpoint
        stays incomplete (no COMPLETE marker), so a resume takes the previous one.
        Asynchronous: returns once ``state`` is copied; the previous save's error, if
        any, is raised first.
        """
        path = join(self.directory, step_dir_name(meta.step))
        self.wait()
        rng = rng_state()  # now: the background thread runs while training draws more
        if not self.asynchronous:
            self._save_or_raise(path, state, meta, rng)
            return path
        staged = {name: _host_copy(value) for name, value in flat_state(state).items()}
        self._in_flight = concurrent.futures.Future()
        threading.Thread(
            target=self._save_in_background,
            args=(path, staged, meta, rng, self._in_flight),
            name=f"checkpoint step {meta.step}",
            daemon=True,
        ).start()
        return path

    def _save_in_background(
        self,
        path: str,
        staged: dict[str, Any],
        meta: CheckpointMeta,
        rng: dict[str, Any],
        done: concurrent.futures.Future,
    ) -> None:
        # A daemon thread: a process that ends meanwhile leaves the save without its
        # COMPLETE marker, which every reader ignores.
        try:
            self._save_or_raise(path, staged, meta, rng)
        except BaseException as e:  # raised by `wait` in the training thread
            done.set_exception(e)
        else:
            done.set_result(path)

    def wait(self) -> None:
        """Waits for the save in flight, if any; raises its error (as the blocking
        save would have). Collective in effect: every rank's save ends together."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.result()

    def _save_or_raise(self, path: str, state: dict[str, Any], meta: CheckpointMeta, rng: dict[str, Any]) -> None:
        try:
            self._save(path, state, meta, rng)
        except (OSError, CheckpointException) as e:
            # Each rank's failure: DCP's collective steps (and raise_first_error) gather them.
            failures = {r: f[0] for r, f in e.failures.items()} if isinstance(e, CheckpointException) else {}
            failures = failures or {self.rank: e}
            if isinstance(failures.get(self.rank), Terminated):
                raise failures[self.rank] from e
            rank = min(failures)
            cause = failures[rank]
            if isinstance(cause, Terminated):
                raise CheckpointSaveError(f"saving checkpoint {path} failed: rank {rank} was stopped (SIGTERM)") from e
            if not isinstance(cause, OSError):
                raise RuntimeError(f"saving checkpoint {path} failed: {e}") from e  # a bug: keep its traceback
            if self.rank == 0:  # every rank is past its writes: a failure is collective (see _save)
                with contextlib.suppress(OSError):  # what is left is incomplete: ignored, pruned later
                    _remove_checkpoint(path)
            raise CheckpointSaveError(f"saving checkpoint {path} failed: {failure_line(e)}") from e

    def _save(self, path: str, state: dict[str, Any], meta: CheckpointMeta, rng: dict[str, Any]) -> None:
        if self.rank == 0:
            g_pathmgr.mkdirs(path)
            if is_complete(path):  # re-saving the same step: invalid until rewritten
                g_pathmgr.rm(join(path, COMPLETE_MARKER))
        barrier(self._group)
        writer = IOPathWriter(path)  # hashes each file as its threads write it
        # Collective: a failure of any rank's writes raises CheckpointException on every rank.
        dcp.save(flat_state(state), storage_writer=writer, planner=NoCopySavePlanner(), process_group=self._group)
        with sigterm_deferred():  # torch.save would turn Terminated into "unexpected pos": a traceback
            error = first_error(
                lambda: writer.fs.write_file(join(path, f"rank_{self.rank}.pt"), lambda f: torch.save(rng, f))
            )
        files = {name[len(path) + 1 :]: entry for name, entry in writer.fs.written.items()}
        gathered = all_gather((files, error), self._group)
        raise_first_error([rank_error for _, rank_error in gathered])
        files = {name: entry for rank_files, _ in gathered for name, entry in rank_files.items()}
        if self.rank == 0:
            error = first_error(lambda: self._complete(path, writer.fs, files, meta))
        raise_first_error(all_gather(error, self._group))  # also the barrier that ends the save

    def _complete(self, path: str, fs: IOPathFileSystem, files: dict[str, ManifestEntry], meta: CheckpointMeta) -> None:
        """Rank 0, once every rank's files are written: meta.json, the COMPLETE marker
        (the manifest), then pruning."""
        meta_json = meta.to_json()
        fs.write_file(join(path, META_FILE), lambda f: f.write(meta_json))
        files[META_FILE] = entry_of_bytes(meta_json)
        manifest = json.dumps(
            {"manifest_version": MANIFEST_VERSION, "files": dict(sorted(files.items()))}, indent=1
        ).encode()
        fs.write_file(join(path, COMPLETE_MARKER), lambda f: f.write(manifest))
        self._prune(keep=path)

    def mark_best(self, path: str, info: dict[str, Any]) -> None:
        """Names the complete checkpoint ``path`` in best.json (replaced atomically),
        then prunes what it kept. Collective; waits for the save in flight (``path``'s)."""
        self.wait()
        if self.rank == 0:
            pointer = join(self.directory, BEST_FILE)
            best = {"checkpoint": os.path.basename(path), **info}
            if is_local(pointer):
                write_json(local_path(pointer), best, indent=1)
            else:  # iopath's mv does not overwrite
                with g_pathmgr.open(pointer + ".tmp", "w") as f:
                    json.dump(best, f, indent=1)
                if g_pathmgr.exists(pointer):
                    g_pathmgr.rm(pointer)
                g_pathmgr.mv(pointer + ".tmp", pointer)
            self._prune(keep=path)
        barrier()

    def _prune(self, keep: str) -> None:
        if self.keep_last_n <= 0:
            return
        complete = complete_checkpoints(self.directory)
        best = best_checkpoint(self.directory)
        doomed = [path for path in complete[: -self.keep_last_n] if path != best]
        # Leftovers of interrupted saves older than the newest complete checkpoint.
        for name in g_pathmgr.ls(self.directory):
            path = join(self.directory, name)
            if is_step_dir(name) and path not in complete and name < os.path.basename(keep):
                doomed.append(path)
        for path in doomed:
            if path != keep:
                _remove_checkpoint(path)


def _host_copy(value: Any) -> Any:
    """A copy of one state leaf in host memory, which training no longer changes. A CPU
    sharded tensor (a table) gets its local shards copied once (torch's staging,
    `_create_cpu_state_dict`, deep-copies it first, then copies again; DCP's
    StateDictStager refuses a ShardedTensor); anything else goes through torch's own
    staging functions, as DCP's async save once did."""
    if isinstance(value, ShardedTensor) and all(s.tensor.device.type == "cpu" for s in value.local_shards()):
        shards = [Shard(shard.tensor.clone(), shard.metadata) for shard in value.local_shards()]
        return ShardedTensor._init_from_local_shards_and_global_metadata(
            shards, value.metadata(), process_group=value._process_group
        )
    if type(value) is torch.Tensor:
        return value.detach().to("cpu", copy=True)
    if not torch.is_tensor(value):
        return copy.deepcopy(value)  # a plain value (an optimizer's step count...)
    staged = _create_cpu_state_dict({"leaf": value})
    _copy_state_dict({"leaf": value}, staged)
    return staged["leaf"]


def _remove_checkpoint(path: str) -> None:
    """Deletes a checkpoint directory: its marker first, so a half-deleted one is never
    taken for complete (iopath removes files, not directories)."""
    if is_complete(path):
        g_pathmgr.rm(join(path, COMPLETE_MARKER))
    for name in g_pathmgr.ls(path):
        g_pathmgr.rm(join(path, name))
    if is_local(path):
        os.rmdir(local_path(path))
