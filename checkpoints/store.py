"""The checkpoint store: saves, finds, verifies and loads sharded, atomic checkpoints
with torch.distributed.checkpoint (DCP), through iopath (checkpoints/storage.py).

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
                                                pid and start time; `lock_checkpoint_dir`)

A checkpoint counts only once COMPLETE exists, so a run killed mid-save leaves the
previous complete checkpoint as the newest one. Older checkpoints are pruned only
after a newer one is complete; the one best.json names is never pruned. Files are
hashed as they are written, a data file chunk by chunk (each item DCP writes); a load
checks each file before parsing it, and each chunk as DCP's reader reads it, before
torch.load sees it, and refuses a damaged one by name and byte range. Checkpoints saved
before manifests existed (COMPLETE holds "complete") load with a warning, unverified.
With ``asynchronous`` (--async_checkpoint) the state is copied to host memory and
written by a background thread while training goes on.

Nothing here runs code from a file: ``.metadata`` goes through a restricted unpickler
and is checked against the state being loaded before any data file is opened
(checkpoints/dcp_metadata.py: tensors only, the live keys, shapes and dtypes, data files
of the directory), tensors come back through DCP's ``torch.load(weights_only=True)``,
the rest is JSON. A checkpoint without a manifest goes through the same checks.
"""

import concurrent.futures
import contextlib
import copy
import io
import json
import os
import pickle
import random
import re
import sys
import threading
import uuid
from typing import Any, Optional
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from iopath.common.file_io import g_pathmgr
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

from checkpoints.dcp_metadata import UnsafeMetadataError, check_metadata, load_metadata
from checkpoints.errors import CheckpointError, CheckpointSaveError
from checkpoints.meta import CheckpointMeta
from checkpoints.storage import (IOPathFileSystem, IOPathReader, IOPathWriter, NoCopySavePlanner, TensorLoadPlanner,
                                 is_local, join, local_path)
from common.atomic import write_json
from common.errors import BadInput
from common.manifest import ManifestEntry, ManifestError, check_bytes, check_manifest_format, entry_of_bytes
from common.path_lock import LockHeld, PathLock
from common.sigterm import Terminated, sigterm_deferred

COMPLETE_MARKER = "COMPLETE"
META_FILE = "meta.json"
DCP_METADATA_FILE = ".metadata"
# 2: a data file's entry gives a digest per chunk (each item DCP writes), checked as
# it is read; 1: one SHA-256 per file, checked in a pass before the file is read.
MANIFEST_VERSION = 2
BEST_FILE = "best.json"
LOCK_FILE = ".lock"
_STEP_DIR = re.compile(r"step_(\d+)$")
# The section of a checkpoint's state that every rank holds whole (a sharded table as a
# sharded tensor of all its rows); a rank's optimizer state covers only its own tables.
_WHOLE_ON_EVERY_RANK = ("model",)


def _leaves(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every value of a nested dict that is not itself a dict.
    Empty dicts hold no leaves, so they contribute nothing.

    DCP is handed these leaves, never the nested dicts: its loader turns a dict whose
    values are all empty (a stateless optimizer such as SGD: {"state": {p: {}}})
    into a leaf of its own that the saver never wrote, and the load fails with
    "Missing key". The nested structure comes from the live objects on both sides.
    """
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _leaves(value, name + ".")
        else:
            yield name, value


def flat_state(state: dict[str, Any]) -> dict[str, Any]:
    """The leaves of a nested state dict under their dotted keys (what DCP stores;
    loading fills them in place)."""
    return dict(_leaves(state))


def _all_gather(value: Any, group: Optional[dist.ProcessGroup] = None) -> list[Any]:
    """Every rank's ``value``, by rank (collective when several ranks run)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value, group=group)
    return gathered


def _first_error(write: Callable[[], None]) -> Optional[OSError]:
    """Runs ``write``; returns its OSError (a full disk) instead of raising it, for the
    ranks to share before any raises (a rank raising alone leaves the others waiting)."""
    try:
        write()
    except OSError as e:
        return e
    return None


def _raise_first_error(errors: list[Optional[OSError]]) -> None:
    """Raises the lowest rank's error, as DCP reports its own (CheckpointException)."""
    failures = {rank: (error, None) for rank, error in enumerate(errors) if error is not None}
    if failures:
        raise CheckpointException("save", failures)  # type: ignore[arg-type]


def _barrier(group: Optional[dist.ProcessGroup] = None) -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier(group=group)


def is_complete(path: str) -> bool:
    return g_pathmgr.exists(join(path, COMPLETE_MARKER))


def _read(file: str, mode: str, failure: str) -> Any:
    """The whole of ``file`` (text or bytes by ``mode``); ``failure`` and the reason, one
    line, when it cannot be read."""
    try:
        with g_pathmgr.open(file, mode) as f:
            return f.read()
    except OSError as e:
        raise CheckpointError(f"{failure} ({e.strerror or e})") from e


def read_manifest(path: str) -> Optional[dict[str, ManifestEntry]]:
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


def _read_checked(path: str, name: str, manifest: Optional[dict[str, ManifestEntry]]) -> bytes:
    """The bytes of one file of the checkpoint, checked against the manifest."""
    file = join(path, name)
    data = _read(file, "rb", f"checkpoint {path}: {name} is missing or unreadable")
    if manifest is not None:
        try:
            check_bytes(data, file, manifest.get(name))
        except ManifestError as e:
            raise CheckpointError(f"checkpoint file {e}") from e
    return data


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


def lock_checkpoint_dir(directory: str, rank: int) -> Optional[PathLock]:
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
    refusal = _all_gather(refusal)[0]
    if refusal is not None:
        raise LockHeld(refusal)
    return lock


def _failure(error: BaseException) -> str:
    """One line for a failure; a DCP CheckpointException gives its lowest failing rank's."""
    where = ""
    if isinstance(error, CheckpointException) and error.failures:
        rank = min(error.failures)
        where, error = f" (on rank {rank})", error.failures[rank][0]
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return (lines[0] if lines else type(error).__name__)[:300] + where


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


def newest_checkpoint(directory: str) -> Optional[str]:
    complete = complete_checkpoints(directory)
    return complete[-1] if complete else None


def best_checkpoint(directory: str) -> Optional[str]:
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


def read_meta(path: str) -> CheckpointMeta:
    """The checkpoint's meta.json; CheckpointError when absent, incomplete or unreadable,
    FileFieldError (naming the field) when malformed or newer than this code."""
    if not g_pathmgr.exists(path):
        raise CheckpointError(f"checkpoint {path}: no such directory")
    if not is_complete(path):
        raise CheckpointError(f"checkpoint {path} is incomplete (no {COMPLETE_MARKER} marker): "
                              "its save did not finish")
    return CheckpointMeta.from_json(_read_checked(path, META_FILE, read_manifest(path)), join(path, META_FILE))


def _rng_state() -> dict[str, Any]:
    """This process's generators: CPU, Python, and its own CUDA device's only (a rank
    uses one device; saving every visible one breaks a resume on a host that shows
    fewer)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device (set per rank)
    return state


def _checked_rng_state(state: Any) -> dict[str, Any]:
    """``state`` if it has the kinds, keys and sizes `_rng_state` writes (the CUDA state,
    saved on GPU hosts, may be there or not); ValueError naming what differs. Checked
    whole before any generator is set, so a refused file changes none of them."""
    if not isinstance(state, dict) or not {"torch", "python"} <= set(state) <= {"torch", "python", "cuda"}:
        found = sorted(map(repr, state)) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"expected a dictionary of 'torch', 'python' (and 'cuda'), found {found}")
    for key in [key for key in ("torch", "cuda") if key in state]:
        value = state[key]
        if not (isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1):
            raise ValueError(f"'{key}' is not a 1-D byte tensor")
    expected_bytes = torch.get_rng_state().numel()
    if state["torch"].numel() != expected_bytes:
        raise ValueError(f"'torch' holds {state['torch'].numel()} bytes, not {expected_bytes}")
    random.Random().setstate(state["python"])  # raises on anything but a generator's state
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


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
        self._group = (dist.new_group(backend="gloo") if asynchronous and dist.is_initialized()
                       and dist.get_world_size() > 1 else None)
        self._in_flight: Optional[concurrent.futures.Future] = None

    def save(self, state: dict[str, Any], meta: CheckpointMeta) -> str:
        """Writes the checkpoint of ``meta.step``; returns its path. Collective.

        Raises CheckpointSaveError (one line) on every rank when the storage fails on
        any, e.g. a full disk: the partial checkpoint is removed and every complete one
        kept. Raises Terminated when SIGTERM arrives meanwhile: the partial checkpoint
        stays incomplete (no COMPLETE marker), so a resume takes the previous one.
        Asynchronous: returns once ``state`` is copied; the previous save's error, if
        any, is raised first.
        """
        path = join(self.directory, f"step_{meta.step:09d}")
        self.wait()
        rng = _rng_state()  # now: the background thread runs while training draws more
        if not self.asynchronous:
            self._save_or_raise(path, state, meta, rng)
            return path
        staged = {name: _host_copy(value) for name, value in flat_state(state).items()}
        self._in_flight = concurrent.futures.Future()
        threading.Thread(target=self._save_in_background, args=(path, staged, meta, rng, self._in_flight),
                         name=f"checkpoint step {meta.step}", daemon=True).start()
        return path

    def _save_in_background(self, path: str, staged: dict[str, Any], meta: CheckpointMeta, rng: dict[str, Any],
                            done: concurrent.futures.Future) -> None:
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
            # Each rank's failure: DCP's collective steps (and _raise_first_error) gather them.
            failures = {r: f[0] for r, f in e.failures.items()} if isinstance(e, CheckpointException) else {}
            failures = failures or {self.rank: e}
            if isinstance(failures.get(self.rank), Terminated):
                raise failures[self.rank]
            rank = min(failures)
            cause = failures[rank]
            if isinstance(cause, Terminated):
                raise CheckpointSaveError(f"saving checkpoint {path} failed: rank {rank} was stopped "
                                          "(SIGTERM)") from e
            if not isinstance(cause, OSError):
                raise RuntimeError(f"saving checkpoint {path} failed: {e}") from e  # a bug: keep its traceback
            if self.rank == 0:  # every rank is past its writes: a failure is collective (see _save)
                with contextlib.suppress(OSError):  # what is left is incomplete: ignored, pruned later
                    _remove_checkpoint(path)
            raise CheckpointSaveError(f"saving checkpoint {path} failed: {_failure(e)}") from e

    def _save(self, path: str, state: dict[str, Any], meta: CheckpointMeta, rng: dict[str, Any]) -> None:
        if self.rank == 0:
            g_pathmgr.mkdirs(path)
            if is_complete(path):  # re-saving the same step: invalid until rewritten
                g_pathmgr.rm(join(path, COMPLETE_MARKER))
        _barrier(self._group)
        writer = IOPathWriter(path)  # hashes each file as its threads write it
        # Collective: a failure of any rank's writes raises CheckpointException on every rank.
        dcp.save(flat_state(state), storage_writer=writer, planner=NoCopySavePlanner(), process_group=self._group)
        with sigterm_deferred():  # torch.save would turn Terminated into "unexpected pos": a traceback
            error = _first_error(lambda: writer.fs.write_file(join(path, f"rank_{self.rank}.pt"),
                                                              lambda f: torch.save(rng, f)))
        files = {name[len(path) + 1:]: entry for name, entry in writer.fs.written.items()}
        gathered = _all_gather((files, error), self._group)
        _raise_first_error([rank_error for _, rank_error in gathered])
        files = {name: entry for rank_files, _ in gathered for name, entry in rank_files.items()}
        if self.rank == 0:
            error = _first_error(lambda: self._complete(path, writer.fs, files, meta))
        _raise_first_error(_all_gather(error, self._group))  # also the barrier that ends the save

    def _complete(self, path: str, fs: IOPathFileSystem, files: dict[str, ManifestEntry],
                  meta: CheckpointMeta) -> None:
        """Rank 0, once every rank's files are written: meta.json, the COMPLETE marker
        (the manifest), then pruning."""
        meta_json = meta.to_json()
        fs.write_file(join(path, META_FILE), lambda f: f.write(meta_json))
        files[META_FILE] = entry_of_bytes(meta_json)
        manifest = json.dumps({"manifest_version": MANIFEST_VERSION, "files": dict(sorted(files.items()))},
                              indent=1).encode()
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
        _barrier()

    def _prune(self, keep: str) -> None:
        if self.keep_last_n <= 0:
            return
        complete = complete_checkpoints(self.directory)
        best = best_checkpoint(self.directory)
        doomed = [path for path in complete[: -self.keep_last_n] if path != best]
        # Leftovers of interrupted saves older than the newest complete checkpoint.
        for name in g_pathmgr.ls(self.directory):
            path = join(self.directory, name)
            if _STEP_DIR.match(name) and path not in complete and name < os.path.basename(keep):
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
        return ShardedTensor._init_from_local_shards_and_global_metadata(shards, value.metadata(),
                                                                         process_group=value._process_group)
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


def _checked_dcp_metadata(path: str, manifest: Optional[dict[str, ManifestEntry]],
                          flat: dict[str, Any]) -> Metadata:
    """The checkpoint's .metadata, read without running code and checked against the
    flat state it is to fill (`check_metadata`); CheckpointError naming the file."""
    source = join(path, DCP_METADATA_FILE)
    try:
        metadata = load_metadata(_read_checked(path, DCP_METADATA_FILE, manifest), source)
        check_metadata(metadata, flat, source, set(manifest) if manifest is not None else None,
                       _WHOLE_ON_EVERY_RANK)
    except UnsafeMetadataError as e:
        raise CheckpointError(f"checkpoint file {e}") from e
    return metadata


def check_stored_shapes(path: str, state: dict[str, Any]) -> None:
    """Raises CheckpointError unless the checkpoint stores every tensor of ``state``
    with its shape, in data files large enough to hold them. Reads .metadata and the
    files' sizes only, so ``state`` may live on the meta device: a meta.json declaring
    tables other than those stored is refused before the model is allocated."""
    manifest = read_manifest(path)
    flat = {name: value for name, value in flat_state(state).items() if torch.is_tensor(value)}
    metadata = _checked_dcp_metadata(path, manifest, flat)
    needed = sum(value.numel() * metadata.state_dict_metadata[name].properties.dtype.itemsize
                 for name, value in flat.items())
    sizes = [_file_size(path, str(name), manifest)
             for name in {info.relative_path for info in metadata.storage_data.values()}]
    held = sum(size for size in sizes if size is not None)
    if None not in sizes and needed > held:
        raise CheckpointError(f"checkpoint {path}: its tensors need {needed} bytes, its data files hold {held}: "
                              "meta.json and .metadata describe more than is stored")


def _file_size(path: str, name: str, manifest: Optional[dict[str, ManifestEntry]]) -> Optional[int]:
    """The size of one file of a checkpoint: on disk for a local one, else its
    manifest's (None: unknown, an old remote checkpoint)."""
    if is_local(path):
        try:
            return os.path.getsize(os.path.join(local_path(path), os.path.basename(name)))
        except OSError as e:
            raise CheckpointError(f"checkpoint {path}: {name} is missing or unreadable ({e.strerror or e})") from e
    entry = (manifest or {}).get(os.path.basename(name))
    return int(entry["bytes"]) if entry else None


def load_checkpoint(path: str, state: dict[str, Any], rank: int, restore_rng: bool) -> None:
    """Fills ``state`` (tensors and sharded tensors, in place) from the checkpoint at path.

    Raises CheckpointError when the files are missing, corrupted, or not what the
    project writes for ``state`` (on every rank).
    """
    flat = flat_state(state)
    manifest = read_manifest(path)
    if manifest is None and rank == 0:
        print(f"warning: checkpoint {path} has no manifest (saved before integrity checks): "
              "its files are loaded unverified", file=sys.stderr, flush=True)
    # Read and checked against the state it fills here, on every rank before any
    # collective and before DCP opens a data file: a missing, damaged or crafted file
    # fails every rank alike with one line. With or without a manifest: whoever crafts
    # the files can rewrite it too.
    metadata = _checked_dcp_metadata(path, manifest, flat)
    try:
        dcp.load(flat, storage_reader=IOPathReader(path, metadata, manifest), planner=TensorLoadPlanner())
    except (Exception, CheckpointException) as e:  # DCP gathers every rank's failure; report one line
        raise CheckpointError(f"checkpoint {path} could not be loaded: {_failure(e)}") from e
    rank_file = f"rank_{rank}.pt"
    if restore_rng and (rank_file in manifest if manifest is not None else g_pathmgr.exists(join(path, rank_file))):
        data = _read_checked(path, rank_file, manifest)
        try:
            loaded = torch.load(io.BytesIO(data), weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, LookupError, TypeError, ValueError) as e:
            raise CheckpointError(f"checkpoint file {join(path, rank_file)}: not the random-generator state "
                                  "the project saves (tensors and plain values): refused") from e
        try:
            generators = _checked_rng_state(loaded)
        except (TypeError, ValueError) as e:
            first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise CheckpointError(f"checkpoint file {join(path, rank_file)}: not the random-generator state "
                                  f"the project saves ({first_line}): refused") from e
        _set_rng_state(generators)
