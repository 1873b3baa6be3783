"""Reduces FBGEMM's CUDA wheel to one GPU architecture, for hosts that can carry in
only tens of MiB (docs/launching.md, "Installing offline").

    python scripts/trim_fbgemm_wheel.py WHEEL --arch sm_90 --output DIR [--drop NAME ...]
    python scripts/trim_fbgemm_wheel.py WHEEL --list    # each library's cubins by architecture

FBGEMM 1.6.0's cu130 wheel is 443 MiB (2.5 GB unpacked): its libraries carry device
code (cubins) for sm_80, sm_90a and sm_100a. A GPU loads only the cubin of its own
architecture, so the others are dead weight. `nvprune` cannot edit a shared library;
this does, in place: every ELF `.so` of the wheel has a `.nv_fatbin` section holding
fatbin containers, each a header and a run of entries (a header and a payload each).
Every entry of another architecture is blanked: its payload zeroed and its
architecture field set to 0, which no GPU has, so no driver ever picks it (a GPU
without a kept cubin gets "no kernel image is available", as for any build that lacks
its architecture). Nothing moves: sizes and offsets are unchanged, and the zeros
compress to nothing. The libraries named by ``--drop`` (FBGEMM's inference, VBE and
global-weight-decay kernels, which training never launches) are blanked whole, kept
so that ``import fbgemm_gpu`` still loads them. So is every cubin whose embedding
backward kernels all serve optimizers the project never builds (Adam, LAMB, LARS,
row-wise Adagrad with counters: `KEPT_OPTIMIZERS` are the ``--embedding_optimizer``
choices and FBGEMM's optimizer-less backward), about half the backward library.

The repacked wheel stores its members uncompressed (the same bytes on every run, so
its digest can be pinned, and xz over the whole wheelhouse compresses the cubins far
better than zip's deflate) with a RECORD of their new digests.
"""

import base64
import hashlib
import os
import re
import struct
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.cli import OneLineParser
from models.embedding_optimizer_config import EMBEDDING_OPTIMIZERS

FATBIN_MAGIC = 0xBA55ED50
ELF_MAGIC = b"\x7fELF"
# The fatbin container's header: magic, version, header size, size of what follows.
_CONTAINER = struct.Struct("<IHHQ")
# An entry's header, the fields used: kind (1 PTX, 2 cubin), version, header size,
# payload size, then at byte 28 the architecture (80, 90, 100).
_ENTRY = struct.Struct("<HHIQ")
_ARCH_OFFSET = 28
# FBGEMM 1.6's libraries that training never launches (inference, variable batch size
# per feature, global weight decay).
TRAINING_UNUSED = (
    "fbgemm_gpu_tbe_inference.so",
    "fbgemm_gpu_tbe_training_backward_vbe.so",
    "fbgemm_gpu_tbe_training_backward_gwd.so",
)


# FBGEMM's backward kernels name their optimizer: split_embedding_backward_codegen_<optimizer>_
# (un)weighted_... The project's --embedding_optimizer choices have FBGEMM's names; "none"
# is FBGEMM's backward without an optimizer.
KEPT_OPTIMIZERS = (*EMBEDDING_OPTIMIZERS, "none")
_BACKWARD_KERNEL = re.compile(rb"backward_codegen_([a-z_]+?)_(?:un)?weighted")


def unused_optimizer_cubin(cubin: bytes, kept=KEPT_OPTIMIZERS) -> bool:
    """Whether every embedding backward kernel of ``cubin`` (there is at least one)
    serves an optimizer outside ``kept``."""
    optimizers = {match.decode() for match in _BACKWARD_KERNEL.findall(cubin)}
    return bool(optimizers) and not optimizers & set(kept)


class TrimError(Exception):
    """A file that is not what this script understands: one line."""


def arch_number(arch: str) -> int:
    """``sm_90`` or ``sm_90a`` -> 90."""
    match = re.fullmatch(r"sm_(\d+)a?", arch)
    if not match:
        raise TrimError(f"--arch must look like sm_90, not '{arch}'")
    return int(match.group(1))


def fatbin_section(elf: bytes) -> tuple[int, int] | None:
    """(offset, size) of a 64-bit little-endian ELF's ``.nv_fatbin`` section, None without one."""
    if elf[:4] != ELF_MAGIC or elf[4] != 2 or elf[5] != 1:
        raise TrimError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)

    def section(index: int) -> tuple[int, int, int]:  # name offset, file offset, size
        base = shoff + index * shentsize
        (name,) = struct.unpack_from("<I", elf, base)
        offset, size = struct.unpack_from("<QQ", elf, base + 0x18)
        return name, offset, size

    _, names_at, _ = section(shstrndx)
    for index in range(shnum):
        name, offset, size = section(index)
        end = elf.index(b"\0", names_at + name)
        if elf[names_at + name : end] == b".nv_fatbin":
            return offset, size
    return None


def entries(elf: bytes, start: int, size: int):
    """Yields (entry offset, header size, payload size, kind, arch) of every entry of
    every fatbin container in ``elf[start:start+size]``; containers are 8-byte aligned
    with zero padding between them."""
    at, end = start, start + size
    while at + _CONTAINER.size <= end:
        magic, _, header_size, body_size = _CONTAINER.unpack_from(elf, at)
        if magic != FATBIN_MAGIC:
            if magic == 0:  # padding to the next container
                at += 8
                continue
            raise TrimError(f"no fatbin container at byte {at} of .nv_fatbin (magic {magic:#x})")
        entry, body_end = at + header_size, at + header_size + body_size
        if body_end > end:
            raise TrimError(f"fatbin container at byte {at} runs past .nv_fatbin")
        while entry < body_end:
            kind, _, entry_header, payload = _ENTRY.unpack_from(elf, entry)
            (arch,) = struct.unpack_from("<I", elf, entry + _ARCH_OFFSET)
            if entry_header < _ARCH_OFFSET + 4 or entry + entry_header + payload > body_end:
                raise TrimError(f"fatbin entry at byte {entry} runs past its container")
            yield entry, entry_header, payload, kind, arch
            entry += entry_header + payload
        at = body_end


def trim_library(elf: bytearray, keep_arch: int | None, kept_optimizers=KEPT_OPTIMIZERS) -> dict[str, int]:
    """Blanks, in place, every fatbin entry whose architecture is not ``keep_arch``
    (None: every entry) or whose backward kernels serve only optimizers outside
    ``kept_optimizers``. Returns {"kept": n, "blanked": n, "bytes_blanked": n}."""
    found = fatbin_section(elf)
    counts = {"kept": 0, "blanked": 0, "bytes_blanked": 0}
    if found is None:
        return counts
    for entry, header, payload, _, arch in list(entries(elf, *found)):
        if (
            keep_arch is not None
            and arch == keep_arch
            and not unused_optimizer_cubin(bytes(elf[entry + header : entry + header + payload]), kept_optimizers)
        ):
            counts["kept"] += 1
            continue
        elf[entry + header : entry + header + payload] = bytes(payload)
        struct.pack_into("<I", elf, entry + _ARCH_OFFSET, 0)
        counts["blanked"] += 1
        counts["bytes_blanked"] += payload
    return counts


def architectures(elf: bytes) -> dict[int, int]:
    """{arch: number of entries} of a library's fatbins (0: blanked)."""
    found = fatbin_section(elf)
    result: dict[int, int] = {}
    if found is not None:
        for *_, arch in entries(elf, *found):
            result[arch] = result.get(arch, 0) + 1
    return result


def _record_digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def trim_wheel(wheel: str, arch: str, output_dir: str, drop=TRAINING_UNUSED, log=print) -> str:
    """Writes the trimmed copy of ``wheel`` (same file name) into ``output_dir``; returns its path."""
    keep = arch_number(arch)
    os.makedirs(output_dir, exist_ok=True)
    target = os.path.join(output_dir, os.path.basename(wheel))
    if os.path.abspath(target) == os.path.abspath(wheel):
        raise TrimError(f"--output {output_dir} holds the wheel itself; give another directory")
    record_lines, record_name = [], None
    totals = {"kept": 0, "blanked": 0, "bytes_blanked": 0}
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target + ".part", "w", zipfile.ZIP_STORED) as out:
        for info in source.infolist():
            if info.filename.endswith(".dist-info/RECORD"):
                record_name = info.filename
                continue
            data = source.read(info.filename)
            if info.filename.endswith(".so") and data[:4] == ELF_MAGIC:
                elf = bytearray(data)
                dropped = os.path.basename(info.filename) in drop
                counts = trim_library(elf, None if dropped else keep)
                for key in totals:
                    totals[key] += counts[key]
                if counts["kept"] == 0 and counts["blanked"] and not dropped:
                    raise TrimError(f"{info.filename} has no {arch} cubin: this wheel cannot run on {arch}")
                data = bytes(elf)
            # Same name, date and mode; stored, so the output's bytes depend on the input only.
            member = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            member.external_attr = info.external_attr
            member.compress_type = zipfile.ZIP_STORED
            out.writestr(member, data)
            record_lines.append(f"{info.filename},{_record_digest(data)},{len(data)}")
        if record_name is None:
            raise TrimError(f"{wheel} has no .dist-info/RECORD: not a wheel")
        record_lines.append(f"{record_name},,")
        member = zipfile.ZipInfo(record_name, date_time=source.getinfo(record_name).date_time)
        member.external_attr = source.getinfo(record_name).external_attr
        out.writestr(member, "\n".join(record_lines) + "\n")
    os.replace(target + ".part", target)
    log(
        f"trim: {os.path.basename(wheel)}: kept {totals['kept']} {arch} cubins, blanked {totals['blanked']} "
        f"entries ({totals['bytes_blanked'] / 2**20:.0f} MiB), {len(drop)} libraries blanked whole, backward "
        f"kernels for {', '.join(KEPT_OPTIMIZERS)} only"
    )
    return target


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv=None) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", help="FBGEMM's CUDA wheel")
    parser.add_argument("--arch", help="the GPU architecture to keep, e.g. sm_90")
    parser.add_argument("--output", help="directory for the trimmed wheel")
    parser.add_argument(
        "--drop",
        action="append",
        default=None,
        help=f"a library (file name) to blank whole; default: {', '.join(TRAINING_UNUSED)}",
    )
    parser.add_argument("--list", action="store_true", help="print each library's architectures and exit")
    args = parser.parse_args(argv)
    if not args.list and not (args.arch and args.output):
        parser.error("--arch and --output are needed to trim (or --list)")
    try:
        if args.list:
            with zipfile.ZipFile(args.wheel) as wheel:
                for name in wheel.namelist():
                    if name.endswith(".so"):
                        print(name, architectures(wheel.read(name)))
            return 0
        path = trim_wheel(args.wheel, args.arch, args.output, tuple(args.drop or TRAINING_UNUSED))
    except (TrimError, zipfile.BadZipFile, OSError) as e:
        print(f"trim: {args.wheel}: {e}", file=sys.stderr)
        return 2
    print(f"trim: {path} sha256 {sha256_of(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
