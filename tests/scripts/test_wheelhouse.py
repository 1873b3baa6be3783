"""scripts/trim_fbgemm_wheel.py on a wheel of the same layout as FBGEMM's (an ELF
library whose .nv_fatbin section holds fatbin containers of cubins for sm_80, sm_90
and sm_100, built here byte by byte), and scripts/wheelhouse.py's requirement picking
and manifest. The real FBGEMM 1.6.0 wheel's result is pinned in
stacks/torch2.11/trimmed-wheels (docs/launching.md)."""

import base64
import hashlib
import json
import os
import struct
import zipfile

import pytest

from harness.launch import REPO
from scripts.trim_fbgemm_wheel import FATBIN_MAGIC, TrimError, architectures, sha256_of, trim_wheel
from scripts.wheelhouse import (
    WHEELHOUSE_PACKAGES,
    Wheelhouse,
    WheelhouseError,
    carried_requirements,
    check_variant,
    stack_pins,
)


def cubin(arch: int, kernel: str) -> bytes:
    """A stand-in cubin: an ELF magic, the kernel's name, filler that is not zero."""
    return b"\x7fELF" + f"_Z{len(kernel)}{kernel}".encode() + bytes([arch]) * (200 + arch)


def entry(arch: int, payload: bytes) -> bytes:
    """A fatbin entry: kind 2 (cubin), header of 64 bytes with the arch at byte 28."""
    header = struct.pack("<HHIQ", 2, 0x0101, 64, len(payload)) + bytes(8) + struct.pack("<HHI", 1, 8, arch)
    return header + bytes(64 - len(header)) + payload


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def elf_library(fatbin: bytes) -> bytes:
    """A 64-bit little-endian ELF: some host code, then .nv_fatbin, .shstrtab and the section headers."""
    host = b"host code" * 10
    names = b"\0.nv_fatbin\0.shstrtab\0"
    fatbin_at = 64 + len(host)
    names_at = fatbin_at + len(fatbin)
    sections_at = names_at + len(names)
    header = (
        b"\x7fELF"
        + bytes([2, 1, 1])
        + bytes(9)
        + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, sections_at, 0, 64, 0, 0, 64, 3, 2)
    )

    def section(name: int, kind: int, offset: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, offset, size, 0, 0, 1, 0)

    return (
        header
        + host
        + fatbin
        + names
        + section(0, 0, 0, 0)
        + section(1, 1, fatbin_at, len(fatbin))
        + section(11, 3, names_at, len(names))
    )


def write_wheel(path: str, members: dict) -> str:
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in members.items():
            wheel.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        wheel.writestr("fake-1.0.dist-info/RECORD", "\n".join(record + ["fake-1.0.dist-info/RECORD,,"]) + "\n")
    return path


FORWARD = "split_embedding_codegen_forward_unweighted_kernel"
ROWWISE = "split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel"
ADAM = "split_embedding_backward_codegen_adam_unweighted_kernel"


def fbgemm_like_wheel(directory) -> str:
    training = elf_library(
        container(*(entry(a, cubin(a, FORWARD)) for a in (80, 90, 100)))
        + bytes(8)  # padding between containers
        + container(*(entry(a, cubin(a, ROWWISE)) for a in (80, 90, 100)))
        + container(*(entry(a, cubin(a, ADAM)) for a in (80, 90, 100)))
    )
    inference = elf_library(container(*(entry(a, cubin(a, FORWARD)) for a in (80, 90, 100))))
    return write_wheel(
        os.path.join(directory, "fake-1.0-cp312-cp312-manylinux_2_28_x86_64.whl"),
        {
            "fake/__init__.py": b"print('fake')\n",
            "fake/training.so": training,
            "fake/fbgemm_gpu_tbe_inference.so": inference,
            "fake-1.0.dist-info/METADATA": b"Name: fake\n",
        },
    )


def test_trim_keeps_one_architecture_and_the_project_optimizers_in_place(tmp_path):
    source = fbgemm_like_wheel(str(tmp_path))
    trimmed = trim_wheel(
        source, "sm_90", str(tmp_path / "out"), drop=("fbgemm_gpu_tbe_inference.so",), log=lambda line: None
    )
    with zipfile.ZipFile(source) as before, zipfile.ZipFile(trimmed) as after:
        assert before.namelist() == after.namelist()
        assert all(info.compress_type == zipfile.ZIP_STORED for info in after.infolist())
        old, new = before.read("fake/training.so"), after.read("fake/training.so")
        assert len(new) == len(old) and new[:154] == old[:154]  # nothing moved; header and host code kept
        # sm_90's forward and row-wise Adagrad cubins kept byte for byte, Adam's and the others blanked
        assert architectures(new) == {90: 2, 0: 7}
        assert cubin(90, FORWARD) in new and cubin(90, ROWWISE) in new and cubin(90, ADAM) not in new
        assert ADAM.encode() not in new and cubin(80, FORWARD) not in new
        assert architectures(after.read("fake/fbgemm_gpu_tbe_inference.so")) == {0: 3}  # dropped whole
        assert after.read("fake/__init__.py") == before.read("fake/__init__.py")
        for line in after.read("fake-1.0.dist-info/RECORD").decode().splitlines():
            name, digest, size = line.split(",")
            if digest:
                data = after.read(name)
                expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                assert digest == f"sha256={expected}" and int(size) == len(data), name
    again = trim_wheel(
        source, "sm_90", str(tmp_path / "again"), drop=("fbgemm_gpu_tbe_inference.so",), log=lambda line: None
    )
    assert sha256_of(again) == sha256_of(trimmed)  # the digest can be pinned


def test_trim_refuses_an_architecture_the_wheel_lacks(tmp_path):
    source = fbgemm_like_wheel(str(tmp_path))
    with pytest.raises(TrimError) as e:
        trim_wheel(source, "sm_75", str(tmp_path / "out"), log=lambda line: None)
    assert str(e.value) == "fake/training.so has no sm_75 cubin: this wheel cannot run on sm_75"
    with pytest.raises(TrimError) as e:
        trim_wheel(source, "hopper", str(tmp_path / "out"), log=lambda line: None)
    assert str(e.value) == "--arch must look like sm_90, not 'hopper'"


def test_wheelhouse_carries_the_pins_of_requirements_txt_and_the_stack():
    carried = carried_requirements(os.path.join(REPO, "requirements.txt"))
    assert len(carried) == len(WHEELHOUSE_PACKAGES) and all("==" in line for line in carried)
    assert stack_pins("torch2.11", "cuda", "cu130") == {
        "torch": "torch==2.11.0+cu130",
        "fbgemm": "fbgemm-gpu==1.6.0+cu130",
        "torchrec": "torchrec==1.6.1",
    }
    assert stack_pins("torch2.11", "cpu", "")["fbgemm"] == "fbgemm-gpu-cpu==1.6.0"
    assert check_variant("torch2.11", "") == "cu130"
    with pytest.raises(WheelhouseError) as e:
        check_variant("torch2.11", "cu126")
    assert str(e.value) == "CUDA_VARIANT must be cu130 for the torch2.11 stack, not 'cu126'"


def test_wheelhouse_manifest_is_read_field_by_field(tmp_path):
    from common.json_fields import FileFieldError

    fields = {
        "version": 1,
        "stack": "torch2.11",
        "device": "cuda",
        "cuda_variant": "cu130",
        "gpu_arch": "sm_90",
        "python": "3.12",
        "torch": "2.11.0+cu130",
        "fbgemm": "fbgemm-gpu==1.6.0",
        "torchrec": "torchrec==1.6.1",
        "requirements": ["numpy==2.4.6"],
        "archive_sha256": "0" * 64,
    }
    (tmp_path / "wheelhouse.json").write_text(json.dumps(fields))
    assert Wheelhouse.read(str(tmp_path)).torchrec == "torchrec==1.6.1"
    (tmp_path / "wheelhouse.json").write_text(json.dumps({**fields, "version": 2}))
    with pytest.raises(FileFieldError) as e:
        Wheelhouse.read(str(tmp_path))
    assert str(e.value).startswith(f"{tmp_path}/wheelhouse.json: version is 2, newer than this code reads (1)")
