"""Reads a distributed checkpoint's ``.metadata`` without running code.

torch.distributed.checkpoint pickles its `Metadata` (which tensor chunk lives in which
file) and its own reader unpickles it with plain ``pickle.load``: a crafted file runs
any code it likes. This unpickler admits only the classes DCP writes there (its
metadata dataclasses, torch.Size, dtypes, layouts, a path) and a few plain builtins;
any other global refuses the whole file.

Example::

    with open("ckpt/step_000000100/.metadata", "rb") as f:
        metadata = load_metadata(f.read(), "ckpt/step_000000100/.metadata")
"""

import collections
import io
import pathlib
import pickle
from typing import Any, Dict, FrozenSet

import torch
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata

from common.errors import BadInput


class UnsafeMetadataError(BadInput):
    """The file is not plain DCP metadata; the message names the file and what it asked for."""


# What DCP pickles into .metadata (torch 2.13), by module. torch dtypes are admitted by
# type in find_class, as there are many of them.
_ALLOWED: Dict[str, Dict[str, Any]] = {
    "torch.distributed.checkpoint.metadata": {
        name: getattr(dcp_metadata, name)
        for name in ("Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata",
                     "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo": _StorageInfo},
    "torch": {"Size": torch.Size},
    # Maps a layout's name to the torch.layout object: a dictionary lookup, nothing more.
    "torch.serialization": {"_get_layout": torch.serialization._get_layout},
    "pathlib": {"PosixPath": pathlib.PosixPath},  # StorageMeta.checkpoint_id
    "collections": {"OrderedDict": collections.OrderedDict},
}
_PLAIN_BUILTINS: FrozenSet[str] = frozenset({"set", "frozenset", "slice", "complex"})


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
        raise UnsafeMetadataError(f"{self.source}: refused: it asks to load {module}.{name}, which is not "
                                  "distributed-checkpoint metadata (a crafted or foreign file)")


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
