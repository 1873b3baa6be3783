"""torch.distributed.checkpoint (DCP) storage on any path iopath opens: the file system,
writer, reader and planners `checkpoints.save` and `checkpoints.load` go through.

Every file written is hashed on its way to disk (a data file chunk by chunk, each item
DCP writes) for the manifest; every chunk read is checked against its manifest digest
before torch.load sees it. The reader is handed the ``.metadata`` that
`checkpoints.dcp_metadata` read and checked beforehand: DCP's own reading of it would
unpickle it unchecked.
"""

import contextlib
import dataclasses
import io
import pickle
from collections.abc import Generator
from typing import IO, Any

import torch
from iopath.common.file_io import g_pathmgr
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader, FileSystemWriter, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem, WriteItem
from torch.futures import Future
from torch.utils.serialization import config as serialization_config

from checkpoints.errors import CheckpointError
from common.atomic import surfacing_write_errors
from common.manifest import HashingStream, ManifestEntry, check_chunk, check_stream
from common.sigterm import sigterm_deferred

_DATA_FILE_SUFFIX = ".distcp"
# dtypes Tensor.numpy() accepts (not bfloat16 and the like: DCP copies those).
_NUMPY_DTYPES = {
    torch.float64,
    torch.float32,
    torch.float16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
}


def join(path: str, name: str) -> str:
    return path.rstrip("/") + "/" + name


class IOPathFileSystem(FileSystemBase):
    """DCP storage on any path iopath can open (local files, or a registered remote handler).

    Every file it writes is hashed on its way to disk (a data file chunk by chunk):
    ``written`` maps each path (after renames) to its manifest entry. A failed write is
    kept, not raised, until `raise_write_errors`: DCP's writer threads drop exceptions
    (with a traceback), and the checkpoint would then complete without the file.
    """

    def __init__(self) -> None:
        self.written: dict[str, ManifestEntry] = {}
        self.write_errors: list[OSError] = []

    @contextlib.contextmanager
    def create_stream(self, path, mode: str) -> Generator:
        if "w" not in mode:
            with g_pathmgr.open(str(path), mode) as stream:
                yield stream
            return
        try:
            with g_pathmgr.open(str(path), mode) as stream, surfacing_write_errors(stream) as checked:
                hashing = HashingStream(checked, chunked=str(path).endswith(_DATA_FILE_SUFFIX))
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
        return join(str(path), suffix)

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

    def ls(self, path) -> list[str]:
        return [join(str(path), name) for name in g_pathmgr.ls(str(path))]


def is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def local_path(path: str) -> str:
    return path.replace("file://", "", 1)


class IOPathWriter(FileSystemWriter):
    def __init__(self, path: str) -> None:
        # fsync needs a real file descriptor: only for local files. Two files per rank,
        # written by two threads: one file's fsync (where the disk write really happens,
        # as the page cache holds it all until then) overlaps the other's writing.
        super().__init__(path, sync_files=is_local(path), thread_count=2)
        self.fs = IOPathFileSystem()
        self.path = path

    def write_data(self, plan, planner):
        # torch.save's CRC32 of every record is a pass over the bytes as long as the
        # SHA-256 the manifest keeps (measured: each about as slow as a copy), and torch.load
        # never checks it: the manifest's chunk digests are the check.
        with sigterm_deferred(), serialization_config.patch("save.compute_crc32", False):
            written = super().write_data(plan, planner)
        self.fs.raise_write_errors()  # inside DCP's collective step: every rank learns of it
        return written

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)
        self.fs.raise_write_errors()  # .metadata, written by rank 0 inside DCP's last collective step


class NoCopySavePlanner(DefaultSavePlanner):
    """DCP clones every tensor whose storage is larger than the tensor itself, so that
    torch.save writes only its bytes. A fused table's weights and optimizer state are
    slices of one flat buffer per TBE module: this planner hands DCP such a slice on a
    storage of exactly its own bytes (the same memory, no copy) instead."""

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        data = super().resolve_data(write_item)
        if (
            isinstance(data, torch.Tensor)
            and data.device.type == "cpu"
            and data.is_contiguous()
            and data.untyped_storage().nbytes() != data.nbytes
            and data.dtype in _NUMPY_DTYPES
        ):
            data = torch.from_numpy(data.detach().numpy())  # a storage of the slice's memory only
        return data


class IOPathReader(FileSystemReader):
    """DCP's reader with the metadata read and checked beforehand (`checkpoints.opened`: no
    code runs, no file outside the checkpoint is named), each chunk of a data file
    checked against its manifest digest as it is read, before torch.load sees it (a
    version 1 manifest: each file in a pass before it is read), and a file that holds
    anything but tensors refused by name."""

    def __init__(self, path: str, metadata: Metadata, manifest: dict[str, ManifestEntry] | None) -> None:
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

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for name, items in sorted(per_file.items()):
            file = join(self.path, name)
            if self.manifest is not None and "chunks" not in self.manifest.get(name, {}):
                with g_pathmgr.open(file, "rb") as stream:
                    check_stream(stream, file, self.manifest.get(name))
            try:
                super().read_data(dataclasses.replace(plan, items=items), planner)
            except pickle.UnpicklingError as e:  # torch.load(weights_only=True) met something else
                raise CheckpointError(
                    f"{file}: holds objects other than tensors, which the project never writes there: refused unread"
                ) from e
        done: Future = Future()
        done.set_result(None)
        return done

    def _slice_file(self, file, sinfo: _StorageInfo) -> IO[bytes]:
        entry = self.manifest.get(sinfo.relative_path) if self.manifest is not None else None
        if entry is None or "chunks" not in entry:  # checked whole in read_data, or no manifest
            return super()._slice_file(file, sinfo)
        file.seek(sinfo.offset)
        data = file.read(sinfo.length)
        check_chunk(data, join(self.path, sinfo.relative_path), entry, sinfo.offset)
        return io.BytesIO(data)


class TensorLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner without its ``torch.load(weights_only=False)`` of bytes entries
    (torch 2.13): the project saves tensors only, and `check_metadata` refuses a bytes
    entry before loading starts; this refuses one that got past it."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        raise CheckpointError(
            f"{read_item.dest_index.fqn} is stored as pickled bytes, where the project saves a tensor: refused unread"
        )
