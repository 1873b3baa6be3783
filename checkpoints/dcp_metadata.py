"""Reads a distributed checkpoint's ``.metadata`` without running code, and checks it
against the state it is about to fill before DCP reads any data file.

torch.distributed.checkpoint pickles its `Metadata` (which tensor chunk lives in which
file) and its own reader unpickles it with plain ``pickle.load``: a crafted file runs
any code it likes. This unpickler admits only the classes DCP writes there (its
metadata dataclasses, torch.Size, dtypes, layouts, a path) and a few plain builtins;
any other global refuses the whole file.

Admitted classes can still lie: DCP reads an entry declared bytes with
``torch.load(weights_only=False)`` (its DefaultLoadPlanner, torch 2.13) and joins a
storage path to the checkpoint's directory as it is. `check_metadata` therefore holds
every entry to what the project itself writes: tensors only (its state dicts hold
nothing else, so no entry is ever bytes), the live state's keys, shapes and dtypes,
chunks inside their tensor, and data files named as DCP names them in the checkpoint's
own directory (and listed in its manifest, when it has one).

Example::

    with open("ckpt/step_000000100/.metadata", "rb") as f:
        metadata = load_metadata(f.read(), "ckpt/step_000000100/.metadata")
    check_metadata(metadata, flat_state, "ckpt/step_000000100/.metadata", manifest_names, {"model"})
"""

import collections
import io
import math
import pathlib
import pickle
import re
from collections.abc import Collection, Mapping
from typing import Any

import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from common.errors import BadInput


class UnsafeMetadataError(BadInput):
    """The file is not plain DCP metadata; the message names the file and what it asked for."""


# What DCP pickles into .metadata (torch 2.13), by module. torch dtypes are admitted by
# type in find_class, as there are many of them.
_ALLOWED: dict[str, dict[str, Any]] = {
    "torch.distributed.checkpoint.metadata": {
        name: getattr(dcp_metadata, name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
        )
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo": _StorageInfo},
    "torch": {"Size": torch.Size},
    # Maps a layout's name to the torch.layout object: a dictionary lookup, nothing more.
    "torch.serialization": {"_get_layout": torch.serialization._get_layout},
    "pathlib": {"PosixPath": pathlib.PosixPath},  # StorageMeta.checkpoint_id
    "collections": {"OrderedDict": collections.OrderedDict},
}
_PLAIN_BUILTINS: frozenset[str] = frozenset({"set", "frozenset", "slice", "complex"})


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, source: str) -> None:
        super().__init__(io.BytesIO(data))
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _PLAIN_BUILTINS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        allowed = _ALLOWED.get(module, {})
        if name in allowed:
            return allowed[name]
        raise UnsafeMetadataError(
            f"{self.source}: refused: it asks to load {module}.{name}, which is not "
            "distributed-checkpoint metadata (a crafted or foreign file)"
        )


def load_metadata(data: bytes, source: str) -> Metadata:
    """The `Metadata` pickled in ``data``; UnsafeMetadataError (naming ``source``) for any
    other content, before anything outside the admitted classes is imported or called."""
    try:
        metadata = _MetadataUnpickler(data, source).load()
    except UnsafeMetadataError:
        raise
    except Exception as e:  # truncated or garbled: pickle raises many types
        raise UnsafeMetadataError(f"{source}: not readable as checkpoint metadata ({type(e).__name__}: {e})") from e
    if not isinstance(metadata, Metadata):
        raise UnsafeMetadataError(f"{source}: holds a {type(metadata).__name__}, not checkpoint metadata")
    return metadata


# The data files DCP's FileSystemWriter writes: __{rank}_{file index}.distcp, in the
# checkpoint's directory. Anything else (a separator, "..", an absolute path, another
# file of the checkpoint) is not where the project keeps tensor data.
_DATA_FILE = re.compile(r"__\d+_\d+\.distcp")


def _is_shape(value: Any) -> bool:
    return isinstance(value, torch.Size)


def _tensor_entry(key: Any, entry: Any, source: str) -> TensorStorageMetadata:
    """``entry`` when it is tensor metadata as DCP writes it; UnsafeMetadataError otherwise."""
    if isinstance(entry, BytesStorageMetadata):
        raise UnsafeMetadataError(
            f"{source}: {key} is stored as pickled bytes, where the project saves a tensor: "
            "refused (a crafted or foreign file)"
        )
    if not (
        isinstance(key, str)
        and isinstance(entry, TensorStorageMetadata)
        and _is_shape(getattr(entry, "size", None))
        and isinstance(getattr(entry, "properties", None), TensorProperties)
        and isinstance(getattr(entry.properties, "dtype", None), torch.dtype)
        and isinstance(getattr(entry, "chunks", None), list)
        and all(
            isinstance(c, ChunkStorageMetadata)
            and _is_shape(getattr(c, "offsets", None))
            and _is_shape(getattr(c, "sizes", None))
            for c in entry.chunks
        )
    ):
        raise UnsafeMetadataError(
            f"{source}: {key!r} is described by a {type(entry).__name__}, not tensor "
            "metadata as the project writes it (a crafted or foreign file)"
        )
    return entry


def _check_storage(index: Any, info: Any, source: str, listed: Collection[str] | None) -> None:
    """The storage of one chunk: a data file of the checkpoint, a plain byte range."""
    if not (isinstance(index, MetadataIndex) and isinstance(info, _StorageInfo)):
        raise UnsafeMetadataError(
            f"{source}: a storage entry is a {type(info).__name__}, not a file range (a crafted or foreign file)"
        )
    name = getattr(info, "relative_path", None)
    if not isinstance(name, str) or not _DATA_FILE.fullmatch(name):
        raise UnsafeMetadataError(
            f"{source}: {index.fqn} is stored in {name!r}, which is not a data file name "
            "of the checkpoint (__R_N.distcp in its directory): refused unread"
        )
    if listed is not None and name not in listed:
        raise UnsafeMetadataError(
            f"{source}: {index.fqn} is stored in {name!r}, which the checkpoint's manifest "
            "does not list: refused unread"
        )
    if getattr(info, "transform_descriptors", None):  # DCP's stream extensions (compression...)
        raise UnsafeMetadataError(
            f"{source}: {index.fqn} is stored through the transforms "
            f"{info.transform_descriptors!r}, which the project never writes"
        )
    if not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0
        for n in (getattr(info, "offset", None), getattr(info, "length", None))
    ):
        raise UnsafeMetadataError(
            f"{source}: {index.fqn} has a storage range that is not two non-negative "
            "integers (a crafted or foreign file)"
        )


def _shape_and_dtype(key: str, value: Any) -> tuple[torch.Size, torch.dtype]:
    """The global shape and dtype of a value of the live state (a sharded table's whole
    table, not this rank's shard)."""
    if isinstance(value, ShardedTensor):
        return value.size(), value.metadata().tensor_properties.dtype
    if isinstance(value, torch.Tensor):  # DTensor too: its size is the global one
        return value.size(), value.dtype
    raise TypeError(f"{key}: the state to load holds a {type(value).__name__}: checkpoints hold tensors only")


def _check_chunks(key: str, entry: TensorStorageMetadata, stored: set[tuple[str, torch.Size]], source: str) -> None:
    """Each chunk inside the tensor, with a storage entry; together as large as the tensor."""
    shape = list(entry.size)
    elements = 0
    for chunk in entry.chunks:
        offsets, sizes = list(chunk.offsets), list(chunk.sizes)
        if (
            len(offsets) != len(shape)
            or len(sizes) != len(shape)
            or any(o < 0 or s < 0 or o + s > n for o, s, n in zip(offsets, sizes, shape))
        ):
            raise UnsafeMetadataError(
                f"{source}: {key} has a chunk at offset {offsets} of size {sizes}, outside its shape {shape}"
            )
        if (key, chunk.offsets) not in stored:
            raise UnsafeMetadataError(f"{source}: {key} has a chunk at offset {offsets} without a storage entry")
        elements += math.prod(sizes)
    if elements != math.prod(shape):
        raise UnsafeMetadataError(
            f"{source}: {key}'s chunks hold {elements} elements, its shape {shape} has {math.prod(shape)}"
        )


def check_metadata(
    metadata: Metadata,
    state: Mapping[str, Any],
    source: str,
    listed: Collection[str] | None,
    whole_sections: Collection[str],
) -> None:
    """Raises UnsafeMetadataError (one line naming ``source`` and the entry) unless
    ``metadata`` describes what the project writes for ``state`` (a flat state dict:
    dotted keys to tensors, sharded or not).

    Every entry must be tensor metadata with chunks inside its shape, stored in data
    files named as DCP names them (and in ``listed``, the manifest's file names, unless
    None: a checkpoint saved before manifests). Every key of ``state`` must have an
    entry of its shape and dtype (or another floating dtype: DCP casts on load, which is
    how fp16-trained tables load into an fp32 model). In ``whole_sections`` (the first
    component of a key: "model"), which every rank holds whole, an entry that ``state``
    lacks means another model; elsewhere it may be another rank's (a rank's optimizer
    state covers the tables it holds), and this rank does not read it.
    """
    entries = getattr(metadata, "state_dict_metadata", None)
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(entries, dict) or not isinstance(storage, dict):
        raise UnsafeMetadataError(f"{source}: holds no entries or no storage table (a crafted or foreign file)")
    tensors = {key: _tensor_entry(key, entry, source) for key, entry in entries.items()}
    for index, info in storage.items():
        _check_storage(index, info, source, listed)
    for key, value in state.items():
        entry = tensors.get(key)
        if entry is None:
            raise UnsafeMetadataError(
                f"{source}: has no entry {key}, which this model has (a checkpoint of another model?)"
            )
        shape, dtype = _shape_and_dtype(key, value)
        if entry.size != shape:
            raise UnsafeMetadataError(
                f"{source}: {key} has shape {list(entry.size)} there, {list(shape)} in this model"
            )
        saved = entry.properties.dtype
        if saved != dtype and not (saved.is_floating_point and dtype.is_floating_point):
            raise UnsafeMetadataError(f"{source}: {key} has dtype {saved} there, {dtype} in this model")
    # A section this load does not fill (the id vocabulary read alone, before the model
    # exists) says nothing of the model.
    loaded = {key.split(".", 1)[0] for key in state}
    for key in tensors:
        if key not in state and key.split(".", 1)[0] in whole_sections and key.split(".", 1)[0] in loaded:
            raise UnsafeMetadataError(
                f"{source}: {key} is not part of this model's state (a checkpoint of another model?)"
            )
    stored = {(index.fqn, index.offset) for index in storage}
    for key, entry in tensors.items():
        _check_chunks(key, entry, stored, source)
