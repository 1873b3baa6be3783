"""Manifest version 2: each chunk of a data file carries its own SHA-256, checked as DCP's
reader reads it, so a damaged chunk is refused naming the file and byte range and its
values never reach the model; version 1 manifests (one digest per file) still load."""

import hashlib
import json
import os

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from checkpoints.errors import CheckpointError
from checkpoints.load import load_checkpoint
from checkpoints.meta import CheckpointMeta
from checkpoints.opened import read_manifest
from checkpoints.save import CheckpointManager


def _state(fill: float = 0.0) -> dict:
    """Several tensors, so that each data file holds several chunks."""
    shapes = {"big": (4096, 16), "mid": (1024, 16), "small": (64, 16), "bias": (16,)}
    if fill == 0.0:
        return {"model": {name: torch.zeros(shape) for name, shape in shapes.items()}}
    generator = torch.Generator().manual_seed(3)
    return {"model": {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()}}


def _save(tmp_path) -> str:
    meta = CheckpointMeta(
        step=1, epoch=0, batch_in_epoch=1, world_size=1, config={}, plan={}, data_source=None, data_features=None
    )
    return CheckpointManager(str(tmp_path / "ckpt"), keep_last_n=0, rank=0).save(_state(1.0), meta)


def _flip_middle_byte(path: str) -> int:
    offset = os.path.getsize(path) // 2
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))
    return offset


def _tensor_stored_at(checkpoint: str, name: str, offset: int):
    """(dotted key, chunk offset, chunk length) of the tensor whose chunk holds ``offset`` of ``name``."""
    storage = FileSystemReader(checkpoint).read_metadata().storage_data
    for index, info in storage.items():
        if info.relative_path == name and info.offset <= offset < info.offset + info.length:
            return index.fqn, info.offset, info.length
    raise AssertionError(f"no chunk of {name} holds byte {offset}")


def test_saved_manifest_has_chunk_digests_covering_each_data_file(tmp_path):
    checkpoint = _save(tmp_path)
    manifest = json.load(open(os.path.join(checkpoint, "COMPLETE")))
    assert manifest["manifest_version"] == 2
    data_files = [name for name in manifest["files"] if name.endswith(".distcp")]
    assert data_files
    for name in data_files:
        entry = manifest["files"][name]
        data = open(os.path.join(checkpoint, name), "rb").read()
        assert "sha256" not in entry and entry["bytes"] == len(data)
        end = 0
        for offset, length, digest in entry["chunks"]:
            assert offset == end and hashlib.sha256(data[offset : offset + length]).hexdigest() == digest
            end += length
        assert end == len(data)
    # Every item DCP stored is one chunk: the reader checks what it reads, nothing more.
    storage = FileSystemReader(checkpoint).read_metadata().storage_data
    chunks = {(name, c[0], c[1]) for name in data_files for c in manifest["files"][name]["chunks"]}
    assert {(i.relative_path, i.offset, i.length) for i in storage.values()} == chunks
    loaded = _state()
    load_checkpoint(checkpoint, loaded, rank=0, restore_rng=False)
    for name, value in _state(1.0)["model"].items():
        assert torch.equal(loaded["model"][name], value)


def test_damaged_chunk_is_refused_by_file_and_byte_range_before_reaching_the_model(tmp_path):
    checkpoint = _save(tmp_path)
    shard = os.path.join(checkpoint, "__0_0.distcp")
    flipped = _flip_middle_byte(shard)
    key, offset, length = _tensor_stored_at(checkpoint, "__0_0.distcp", flipped)
    loaded = _state()
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(checkpoint, loaded, rank=0, restore_rng=False)
    assert (
        f"{shard} bytes {offset}-{offset + length}: its SHA-256 differs from the manifest's: the file is damaged"
    ) in str(error.value)
    assert torch.count_nonzero(loaded["model"][key.split(".", 1)[1]]) == 0  # the damaged values never arrived


def test_version_1_manifest_still_loads_with_its_whole_file_check(tmp_path):
    checkpoint = _save(tmp_path)
    files = {}
    for name in sorted(os.listdir(checkpoint)):
        if name != "COMPLETE":
            data = open(os.path.join(checkpoint, name), "rb").read()
            files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    with open(os.path.join(checkpoint, "COMPLETE"), "w") as f:
        json.dump({"manifest_version": 1, "files": files}, f)
    assert read_manifest(checkpoint) == files
    loaded = _state()
    load_checkpoint(checkpoint, loaded, rank=0, restore_rng=False)
    assert torch.equal(loaded["model"]["big"], _state(1.0)["model"]["big"])
    shard = os.path.join(checkpoint, "__0_0.distcp")
    _flip_middle_byte(shard)
    with pytest.raises(CheckpointError, match=f"{shard}: its SHA-256 differs from the manifest's: the file is damaged"):
        load_checkpoint(checkpoint, _state(), rank=0, restore_rng=False)
    # A version 1 manifest giving chunks is not one the project wrote.
    files["__0_0.distcp"] = {"bytes": 1, "chunks": [[0, 1, "00"]]}
    with open(os.path.join(checkpoint, "COMPLETE"), "w") as f:
        json.dump({"manifest_version": 1, "files": files}, f)
    with pytest.raises(CheckpointError, match="not a checkpoint manifest"):
        read_manifest(checkpoint)
