"""Sharded, atomic checkpoints with torch.distributed.checkpoint (DCP), through iopath.

Layout of ``--checkpoint_dir``::

    step_000000120/
        __0_0.distcp, __0_1.distcp, __1_0.distcp, ...
        .metadata                               DCP: model shards, optimizer state (two files a rank)
        rank_0.pt, rank_1.pt                    each rank's RNG states (tensors only)
        meta.json                               step, data position, config, plan
                                                (training/checkpoint_meta.py)
        COMPLETE                                written last, once every rank is done: the
                                                manifest (every file's size and SHA-256)
    best.json                                   which checkpoint is the best (early stopping)

A checkpoint counts only once COMPLETE exists, so a run killed mid-save leaves the
previous complete checkpoint as the newest one. Older checkpoints are pruned only
after a newer one is complete; the one best.json names is never pruned. Files are
hashed as they are written; a load checks each file against the manifest before using
it and refuses a damaged one by name. Checkpoints saved before manifests existed
(COMPLETE holds "complete") load with a warning, unverified.

Nothing here runs code from a file: ``.metadata`` goes through a restricted unpickler
(training/dcp_metadata.py), tensors come back through DCP's ``torch.load(weights_only=True)``,
the rest is JSON.
"""

import contextlib
import io
import json
import os
import random
import re
import sys
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Dict, Generator, Iterator, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import WriteItem
from iopath.common.file_io import g_pathmgr
from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner

from common.atomic import write_json
from common.errors import BadInput
from common.manifest import (HashingStream, ManifestEntry, ManifestError, check_bytes, check_manifest_format,
                             check_stream, entry_of_bytes)
from training.checkpoint_meta import CheckpointMeta
from training.config import CheckpointConfig, OptimizerConfig, TrainConfig
from training.dcp_metadata import UnsafeMetadataError, load_metadata
from training.failures import RankError

COMPLETE_MARKER = "COMPLETE"
META_FILE = "meta.json"
DCP_METADATA_FILE = ".metadata"
MANIFEST_VERSION = 1
BEST_FILE = "best.json"
_STEP_DIR = re.compile(r"step_(\d+)$")
# dtypes Tensor.numpy() accepts (not bfloat16 and the like: DCP copies those).
_NUMPY_DTYPES = {torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
                 torch.int8, torch.uint8, torch.bool}


class CheckpointError(BadInput):
    """A checkpoint cannot be used: missing, incomplete, corrupted or for another model."""


class CheckpointSaveError(RankError):
    """A checkpoint could not be written (a full disk, a lost mount); nothing complete was
    replaced or removed."""


def _join(path: str, name: str) -> str:
    return path.rstrip("/") + "/" + name


class IOPathFileSystem(FileSystemBase):
    """DCP storage on any path iopath can open (local files, or a registered remote handler).

    Every file it writes is hashed on its way to disk: ``written`` maps each path (after
    renames) to its manifest entry. A failed write is kept, not raised, until
    `raise_write_errors`: DCP's writer threads drop exceptions (with a traceback), and
    the checkpoint would then complete without the file.
    """

    def __init__(self) -> None:
        self.written: Dict[str, ManifestEntry] = {}
        self.write_errors: List[OSError] = []

    @contextlib.contextmanager
    def create_stream(self, path, mode: str) -> Generator:
        if "w" not in mode:
            with g_pathmgr.open(str(path), mode) as stream:
                yield stream
            return
        try:
            with g_pathmgr.open(str(path), mode) as stream:
                hashing = HashingStream(stream)
                yield hashing
                hashing.close()
        except OSError as e:  # a full disk fails at a write or at the close's flush
            self.write_errors.append(OSError(e.errno, e.strerror, str(path)))
            return
        self.written[str(path)] = hashing.entry()

    def raise_write_errors(self) -> None:
        if self.write_errors:
            raise self.write_errors[0]

    def concat_path(self, path, suffix: str) -> str:
        return _join(str(path), suffix)

    def rename(self, path, new_path) -> None:
        if g_pathmgr.exists(str(new_path)):  # iopath refuses to replace a file (it logs and returns)
            g_pathmgr.rm(str(new_path))
        g_pathmgr.mv(str(path), str(new_path))
        if str(path) in self.written:
            self.written[str(new_path)] = self.written.pop(str(path))

    def write_file(self, path: str, write: Any) -> None:
        """Writes ``path`` under a temporary name with ``write(stream)``, then renames it."""
        with self.create_stream(path + ".tmp", "wb") as stream:
            write(stream)
        self.raise_write_errors()
        self.rename(path + ".tmp", path)

    def init_path(self, path) -> str:
        return str(path)

    def mkdir(self, path) -> None:
        g_pathmgr.mkdirs(str(path))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return True

    def exists(self, path) -> bool:
        return g_pathmgr.exists(str(path))

    def rm_file(self, path) -> None:
        g_pathmgr.rm(str(path))

    def ls(self, path) -> List[str]:
        return [_join(str(path), name) for name in g_pathmgr.ls(str(path))]


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _local(path: str) -> str:
    return path.replace("file://", "", 1)


class _IOPathWriter(FileSystemWriter):
    def __init__(self, path: str) -> None:
        # fsync needs a real file descriptor: only for local files. Two files per rank,
        # written by two threads: one file's fsync (where the disk write really happens,
        # as the page cache holds it all until then) overlaps the other's writing.
        super().__init__(path, sync_files=_is_local(path), thread_count=2)
        self.fs = IOPathFileSystem()
        self.path = path

    def write_data(self, plan, planner):
        written = super().write_data(plan, planner)
        self.fs.raise_write_errors()  # inside DCP's collective step: every rank learns of it
        return written


class _NoCopySavePlanner(DefaultSavePlanner):
    """DCP clones every tensor whose storage is larger than the tensor itself, so that
    torch.save writes only its bytes. A fused table's weights and optimizer state are
    slices of one flat buffer per TBE module: this planner hands DCP such a slice on a
    storage of exactly its own bytes (the same memory, no copy) instead."""

    def resolve_data(self, write_item: WriteItem) -> Union[torch.Tensor, io.BytesIO]:
        data = super().resolve_data(write_item)
        if (isinstance(data, torch.Tensor) and data.device.type == "cpu" and data.is_contiguous()
                and data.untyped_storage().nbytes() != data.nbytes and data.dtype in _NUMPY_DTYPES):
            data = torch.from_numpy(data.detach().numpy())  # a storage of the slice's memory only
        return data


class _IOPathReader(FileSystemReader):
    """DCP's reader with the metadata read beforehand (`_read_dcp_metadata`, no code
    runs) and each data file checked against the manifest before it is read."""

    def __init__(self, path: str, metadata: Metadata, manifest: Optional[Dict[str, ManifestEntry]]) -> None:
        super().__init__(path)
        self.fs = IOPathFileSystem()
        self.path = path
        self.metadata = metadata
        self.manifest = manifest

    def read_metadata(self) -> Metadata:  # no **kwargs: DCP then tries no per-rank metadata file
        if getattr(self.metadata, "storage_meta", None) is None:
            self.metadata.storage_meta = StorageMeta()
        self.metadata.storage_meta.load_id = self.load_id
        return self.metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner):
        if self.manifest is not None:
            for name in sorted({self.storage_data[item.storage_index].relative_path for item in plan.items}):
                file = _join(self.path, name)
                with g_pathmgr.open(file, "rb") as stream:
                    check_stream(stream, file, self.manifest.get(name))
        return super().read_data(plan, planner)


def _leaves(tree: Dict[str, Any], prefix: str = "") -> Iterator[Tuple[str, Dict[str, Any], str]]:
    """(dotted key, container, key in container) of every value of a nested dict that
    is not itself a dict. Empty dicts hold no leaves, so they contribute nothing.

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
            yield name, tree, key


def flat_state(state: Dict[str, Any]) -> Dict[str, Any]:
    """The leaves of a nested state dict under their dotted keys (what DCP stores)."""
    return {name: container[key] for name, container, key in _leaves(state)}


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def is_complete(path: str) -> bool:
    return g_pathmgr.exists(_join(path, COMPLETE_MARKER))


def read_manifest(path: str) -> Optional[Dict[str, ManifestEntry]]:
    """The manifest of a complete checkpoint (its COMPLETE marker's content): file name ->
    size and SHA-256. None for a checkpoint saved before manifests ("complete")."""
    marker = _join(path, COMPLETE_MARKER)
    try:
        with g_pathmgr.open(marker, "r") as f:
            text = f.read()
    except OSError as e:
        raise CheckpointError(f"checkpoint {path}: its {COMPLETE_MARKER} marker is unreadable ({e})") from e
    if text.strip() == "complete":
        return None
    try:
        return check_manifest_format(json.loads(text), marker)
    except (BadInput, json.JSONDecodeError) as e:  # a ManifestError, or not JSON
        raise CheckpointError(f"{marker}: not a checkpoint manifest (damaged?)") from e


def _read_checked(path: str, name: str, manifest: Optional[Dict[str, ManifestEntry]]) -> bytes:
    """The bytes of one file of the checkpoint, checked against the manifest."""
    file = _join(path, name)
    try:
        with g_pathmgr.open(file, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError(f"checkpoint {path}: {name} is missing or unreadable ({e.strerror or e})") from e
    if manifest is not None:
        try:
            check_bytes(data, file, manifest.get(name))
        except ManifestError as e:
            raise CheckpointError(f"checkpoint file {e}") from e
    return data


def check_writable(directory: str) -> None:
    """Raises CheckpointError unless files can be created in ``directory`` (made if
    missing), so that a run learns it before training rather than at its first save."""
    probe = _join(directory, f".write-test-{uuid.uuid4().hex}")
    try:
        g_pathmgr.mkdirs(directory)
        with g_pathmgr.open(probe, "w") as f:
            f.write("")
        g_pathmgr.rm(probe)
    except OSError as e:
        raise CheckpointError(f"--checkpoint_dir {directory}: cannot write there ({e.strerror or e})") from e


def _failure(error: BaseException) -> str:
    """One line for a failure; a DCP CheckpointException gives its lowest failing rank's."""
    where = ""
    if isinstance(error, CheckpointException) and error.failures:
        rank = min(error.failures)
        where, error = f" (on rank {rank})", error.failures[rank][0]
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return (lines[0] if lines else type(error).__name__)[:300] + where


def complete_checkpoints(directory: str) -> List[str]:
    """Complete checkpoints in ``directory``, oldest first."""
    if not g_pathmgr.exists(directory):
        return []
    found = []
    for name in g_pathmgr.ls(directory):
        match = _STEP_DIR.match(name)
        path = _join(directory, name)
        if match and is_complete(path):
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def newest_checkpoint(directory: str) -> Optional[str]:
    complete = complete_checkpoints(directory)
    return complete[-1] if complete else None


def best_checkpoint(directory: str) -> Optional[str]:
    """The checkpoint best.json marks in ``directory``; None when none is marked."""
    pointer = _join(directory, BEST_FILE)
    if not g_pathmgr.exists(pointer):
        return None
    try:
        with g_pathmgr.open(pointer, "r") as f:
            name = json.load(f)["checkpoint"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{pointer} is unreadable ({e})") from e
    path = _join(directory, str(name))
    if not _STEP_DIR.match(str(name)) or not is_complete(path):
        raise CheckpointError(f"{pointer} marks {name!r} as best, which is not a complete checkpoint of {directory}")
    return path


def checkpoint_to_load(path: str, flag: str, prefer_best: bool = True) -> str:
    """``path`` when it is a checkpoint; for a directory of checkpoints, the one marked
    best (unless ``prefer_best`` is False), else the newest complete one. ``flag`` names
    the path in the error when there is none."""
    if g_pathmgr.exists(_join(path, META_FILE)) or _STEP_DIR.match(os.path.basename(path.rstrip("/"))):
        return path
    chosen = (best_checkpoint(path) if prefer_best and g_pathmgr.exists(path) else None) or newest_checkpoint(path)
    if chosen is None:
        raise CheckpointError(f"{flag} {path}: neither a checkpoint nor a directory holding a complete one")
    return chosen


def read_meta(path: str) -> CheckpointMeta:
    """The checkpoint's meta.json; CheckpointError when absent, incomplete or unreadable,
    FileFieldError (naming the field) when malformed or newer than this code."""
    if not g_pathmgr.exists(path):
        raise CheckpointError(f"checkpoint {path}: no such directory")
    if not is_complete(path):
        raise CheckpointError(f"checkpoint {path} is incomplete (no {COMPLETE_MARKER} marker): "
                              "its save did not finish")
    return CheckpointMeta.from_json(_read_checked(path, META_FILE, read_manifest(path)), _join(path, META_FILE))


def _rng_state() -> Dict[str, Any]:
    """This process's generators: CPU, Python, and its own CUDA device's only (a rank
    uses one device; saving every visible one breaks a resume on a host that shows
    fewer)."""
    state: Dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device (set per rank)
    return state


def _set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class CheckpointManager:
    """Saves and finds the checkpoints of one directory. Save and load are collective.

    Args:
        directory: where checkpoints go (any iopath path).
        keep_last_n: complete checkpoints to keep (0: all).
        rank: this process's rank; rank 0 writes meta.json, the marker, and prunes.

    Example::

        manager = CheckpointManager("ckpt", keep_last_n=2, rank=0)
        manager.save({"model": dmp.state_dict()}, meta)  # meta: a CheckpointMeta of step 120
    """

    def __init__(self, directory: str, keep_last_n: int, rank: int) -> None:
        self.directory = directory
        self.keep_last_n = keep_last_n
        self.rank = rank

    def save(self, state: Dict[str, Any], meta: CheckpointMeta) -> str:
        """Writes the checkpoint of ``meta.step``; returns its path. Collective.

        Raises CheckpointSaveError (one line) when the storage fails, e.g. a full disk:
        the checkpoint stays incomplete and every complete one is kept.
        """
        path = _join(self.directory, f"step_{meta.step:09d}")
        try:
            self._save(path, state, meta)
        except (OSError, CheckpointException) as e:
            cause = e.failures[min(e.failures)][0] if isinstance(e, CheckpointException) and e.failures else e
            if not isinstance(cause, OSError):
                raise RuntimeError(f"saving checkpoint {path} failed: {e}") from e  # a bug: keep its traceback
            raise CheckpointSaveError(f"saving checkpoint {path} failed: {_failure(e)}") from e
        return path

    def _save(self, path: str, state: Dict[str, Any], meta: CheckpointMeta) -> None:
        if self.rank == 0:
            g_pathmgr.mkdirs(path)
            if is_complete(path):  # re-saving the same step: invalid until rewritten
                g_pathmgr.rm(_join(path, COMPLETE_MARKER))
        _barrier()
        writer = _IOPathWriter(path)  # hashes each file as its threads write it
        dcp.save(flat_state(state), storage_writer=writer, planner=_NoCopySavePlanner())
        writer.fs.raise_write_errors()  # .metadata, written by rank 0 after the collective steps
        writer.fs.write_file(_join(path, f"rank_{self.rank}.pt"), lambda f: torch.save(_rng_state(), f))
        files = {name[len(path) + 1:]: entry for name, entry in writer.fs.written.items()}
        if dist.is_initialized() and dist.get_world_size() > 1:  # every rank's files are written
            gathered: List[Dict[str, ManifestEntry]] = [{} for _ in range(dist.get_world_size())]
            dist.all_gather_object(gathered, files)
            files = {name: entry for rank_files in gathered for name, entry in rank_files.items()}
        if self.rank == 0:
            meta_json = meta.to_json()
            writer.fs.write_file(_join(path, META_FILE), lambda f: f.write(meta_json))
            files[META_FILE] = entry_of_bytes(meta_json)
            manifest = json.dumps({"manifest_version": MANIFEST_VERSION, "files": dict(sorted(files.items()))},
                                  indent=1).encode()
            writer.fs.write_file(_join(path, COMPLETE_MARKER), lambda f: f.write(manifest))
            self._prune(keep=path)
        _barrier()

    def mark_best(self, path: str, info: Dict[str, Any]) -> None:
        """Names the complete checkpoint ``path`` in best.json (replaced atomically),
        then prunes what it kept. Collective."""
        if self.rank == 0:
            pointer = _join(self.directory, BEST_FILE)
            best = {"checkpoint": os.path.basename(path), **info}
            if _is_local(pointer):
                write_json(_local(pointer), best, indent=1)
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
            path = _join(self.directory, name)
            if _STEP_DIR.match(name) and path not in complete and name < os.path.basename(keep):
                doomed.append(path)
        for path in doomed:
            if path != keep:
                _remove_checkpoint(path)


def _remove_checkpoint(path: str) -> None:
    """Deletes a checkpoint directory: its marker first, so a half-deleted one is never
    taken for complete (iopath removes files, not directories)."""
    if is_complete(path):
        g_pathmgr.rm(_join(path, COMPLETE_MARKER))
    for name in g_pathmgr.ls(path):
        g_pathmgr.rm(_join(path, name))
    if _is_local(path):
        os.rmdir(_local(path))


def load_checkpoint(path: str, state: Dict[str, Any], rank: int, restore_rng: bool) -> None:
    """Fills ``state`` (tensors and sharded tensors, in place) from the checkpoint at path.

    Raises CheckpointError when the files are missing or corrupted (on every rank).
    """
    leaves = list(_leaves(state))
    flat = {name: container[key] for name, container, key in leaves}
    manifest = read_manifest(path)
    if manifest is None and rank == 0:
        print(f"warning: checkpoint {path} has no manifest (saved before integrity checks): "
              "its files are loaded unverified", file=sys.stderr, flush=True)
    # Read here, on every rank before any collective: a missing, damaged or crafted file
    # fails every rank alike with one line.
    metadata_file = _join(path, DCP_METADATA_FILE)
    try:
        metadata = load_metadata(_read_checked(path, DCP_METADATA_FILE, manifest), metadata_file)
    except UnsafeMetadataError as e:
        raise CheckpointError(f"checkpoint file {e}") from e
    try:
        dcp.load(flat, storage_reader=_IOPathReader(path, metadata, manifest))
    except (Exception, CheckpointException) as e:  # DCP gathers every rank's failure; report one line
        raise CheckpointError(f"checkpoint {path} could not be loaded: {_failure(e)}") from e
    for name, container, key in leaves:  # tensors were filled in place; other values replaced
        container[key] = flat[name]
    rank_file = f"rank_{rank}.pt"
    if restore_rng and (rank_file in manifest if manifest is not None else g_pathmgr.exists(_join(path, rank_file))):
        _set_rng_state(torch.load(io.BytesIO(_read_checked(path, rank_file, manifest)), weights_only=True))


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


# ---------------------------------------------------------------- what a run loads

@dataclass
class RestorePoint:
    """A checkpoint a run starts from: weights only, or everything (``full``)."""

    path: str
    meta: CheckpointMeta
    full: bool


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


def find_restore_point(config: TrainConfig) -> Optional[RestorePoint]:
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
    meta = read_meta(path)
    differences = list(iter_differences(asdict(meta.model), asdict(config.model)))
    if full:
        differences += list(iter_differences(_optimizers(meta.optimizer), _optimizers(config.optim), "optim."))
    if differences:
        more = f" (and {len(differences) - 3} more differences)" if len(differences) > 3 else ""
        raise CheckpointError(f"checkpoint {path} does not match this run: {'; '.join(differences[:3])}{more}")
    return RestorePoint(path, meta, full)  # type: ignore[arg-type]


def _optimizers(optim: OptimizerConfig) -> Dict[str, str]:
    """The optimizers whose state a checkpoint holds (a resume needs the same ones)."""
    return {"optimizer": optim.optimizer, "dense_optimizer": optim.resolved_dense_optimizer}
