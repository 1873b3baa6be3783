"""Delta exports: the table rows a model changed since a full export, and its dense part.

    python -m serving.export --checkpoint CKPT --output DELTA_DIR --delta_from BASE_DIR

A day of training changes the rows of the ids it saw and the dense layers; a delta
export holds those bytes only, and is applied by ``serving.predict`` and
``serving.serve`` (``--model DELTA_DIR``) onto the full export it was taken from, its
*base*. DELTA_DIR receives:

    fp32.delta     the changed bytes of the fp32 program's weights (fp16.delta and
                   int8.delta of the quantized programs, at their stored size)
    delta.json     its base (the SHA-256 of the base's manifest.json, which names the
                   digest of every base file; and where the base was, relative to
                   DELTA_DIR), and where each changed region lies in the .delta files
    id_sketch.delta  a Parquet model's seen-id filters: the bits each gained since the
                   base's id_sketch.bin, Golomb-Rice coded (`rice_encode`); or
                   id_sketch.bin, whole, when they are not the base's grown
    inputs.json    the new model's inputs (serving/model_inputs.py), its variants of
                   format ``delta``; the layout's files (a vocabulary) are the base's
    manifest.json  written last, as in every export (serving/model_files.py)

Applying a delta writes its rows into the base's torch.export programs, loaded as
every program is (code-free, checked against the base's manifest): the result is
byte for byte the program a full export of the same checkpoint writes. The writer
checks that it is before the delta exists: the graphs must be equal (same model,
features, tables, calibration method and exporter) and every tensor's shape too (a
table that grew needs a full export), and the delta, applied to the base, must give
the new program's every byte.

Each weight is cut into regions of rows: a 2-D tensor (the fp32 program's concatenated
tables, a dense layer) by its first dimension, the quantized programs' byte buffer of
tables (FBGEMM's ``weights_host``) table by table at its stored row size, anything else
as one row. A region's changed rows are stored after their index: none when every row
changed (``all``), a bitmap of the rows, or the gaps between changed rows in 1, 2 or 4
bytes, whichever is smallest. Only ``--format program`` exports have deltas: an
AOTInductor package holds its weights inside compiled code.

Example::

    record = read_delta("delta_dir", read_manifest("delta_dir"))
    program = load_delta_program("delta_dir", manifest, record, "fp32", "base_dir")
"""

import dataclasses
import hashlib
import io
import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from common.delta_files import DELTA_FILE, DELTA_VERSION, SKETCH_DELTA_FILE
from common.errors import BadInput
from common.json_fields import (
    INTEGER,
    TEXT,
    FileFieldError,
    JsonObject,
    Kind,
    int_list,
    one_of,
    optional,
    versioned_json,
)
from common.manifest import ManifestEntry
from serving.model_files import (
    DELTA_FORMAT,
    MANIFEST_FILE,
    TORCH_EXPORT_FORMAT,
    load_exported_program,
    read_file,
    read_manifest,
)
from serving.model_inputs import INPUTS_FILE, ModelInputs, read_inputs

# Version 2 cut a filter into regions of this many bytes: a gap between two changed bytes fits 16 bits.
_SKETCH_REGION_BYTES = 1 << 16
ENCODINGS = ("all", "bitmap", "gaps8", "gaps16", "gaps32")
_GAP_TYPES = {"gaps8": np.uint8, "gaps16": np.uint16, "gaps32": np.uint32}
# FBGEMM's inference kernels align each row of a quantized table to 16 bytes (torchrec's setting).
_QUANTIZED_ROW_ALIGNMENT = 16
_WHAT = "an exported model's delta record"


def delta_file(precision: str) -> str:
    """The changed bytes of a precision's program in a delta export (``int8.delta``)."""
    return f"{precision}.{DELTA_FORMAT}"


@dataclass
class Region:
    """Rows of one tensor of a program, and where the changed ones lie in the .delta file.

    Args:
        tensor: the tensor's name in the program (its state_dict or constants).
        dtype, shape: the tensor's, as the base must have it.
        start: the byte of the tensor where the region's first row starts.
        row_bytes, rows: the region's rows.
        encoding: how the changed rows are indexed (`ENCODINGS`).
        changed: how many rows changed.
        offset: the byte of the .delta file where the index starts, the rows after it.
        index_bytes: the index's size.
    """

    tensor: str
    dtype: str
    shape: list[int]
    start: int
    row_bytes: int
    rows: int
    encoding: str
    changed: int
    offset: int
    index_bytes: int

    @property
    def end(self) -> int:
        """The byte of the .delta file after the region's rows."""
        return self.offset + self.index_bytes + self.changed * self.row_bytes


@dataclass
class SketchBits:
    """The bits one seen-id filter gained since the base's, in SKETCH_DELTA_FILE: their
    positions (ascending) as gaps, Golomb-Rice coded (`rice_encode`).

    Args:
        feature: the filter's feature.
        bits: the filter's size in bits, as the base's must be.
        added: how many bits it gained.
        rice: the code's parameter (each gap's low bits).
        offset: the byte of SKETCH_DELTA_FILE where the code starts.
        code_bytes: the code's size.
    """

    feature: str
    bits: int
    added: int
    rice: int
    offset: int
    code_bytes: int


@dataclass
class DeltaRecord:
    """The contents of delta.json.

    Args:
        base_digest: SHA-256 (hex) of the base's manifest.json.
        base_path: where the base was when the delta was written, relative to the delta.
        base_step, base_checkpoint: the base's inputs.json step and checkpoint.
        regions: each variant's regions, by variant name (fp32, fp16, int8).
        sketch_bits: the bits each seen-id filter gained since the base's (in
            SKETCH_DELTA_FILE), or None when the delta carries its filters whole
            (id_sketch.bin) or has none.
        sketch: version 2's form of the same: the regions of the filters' bytes that
            changed (one byte a row; each filter's regions name it). Read, not written.
        sketch_sha256: SHA-256 of the filters the changes give applied onto the base's.
        version: the file format.
    """

    base_digest: str
    base_path: str
    base_step: int
    base_checkpoint: str
    regions: dict[str, list[Region]] = field(default_factory=dict)
    sketch_bits: list[SketchBits] | None = None
    sketch: list[Region] | None = None
    sketch_sha256: str | None = None
    version: int = DELTA_VERSION

    @property
    def sketch_changes(self) -> bool:
        """Whether the delta's seen-id filters are changes onto the base's (SKETCH_DELTA_FILE)."""
        return self.sketch_bits is not None or self.sketch is not None

    def to_json(self) -> bytes:
        return versioned_json(self, kind=DELTA_FORMAT)

    @classmethod
    def from_json(cls, data: bytes, path: str) -> "DeltaRecord":
        """Reads delta.json; FileFieldError naming the file and the field (a newer version too)."""
        document, _ = JsonObject.versioned(data, path, _WHAT, DELTA_VERSION)
        document.get("kind", one_of(DELTA_FORMAT))
        regions: dict[str, list[Region]] = {}
        for name, variant in document.get("regions", _OBJECT_OF_LISTS).items():
            regions[name] = [
                _read_region(JsonObject(value, path, f"regions.{name}[{i}]", _WHAT)) for i, value in enumerate(variant)
            ]
        sketch = document.get("sketch", optional(_LIST), None)  # version 1: filters whole, if any
        sketch_bits = document.get("sketch_bits", optional(_LIST), None)  # version 3 on
        return cls(
            base_digest=document.get("base_digest", TEXT),
            base_path=document.get("base_path", TEXT),
            base_step=document.get("base_step", INTEGER),
            base_checkpoint=document.get("base_checkpoint", TEXT),
            regions=regions,
            sketch_bits=None
            if sketch_bits is None
            else [
                _read_sketch_bits(JsonObject(value, path, f"sketch_bits[{i}]", _WHAT))
                for i, value in enumerate(sketch_bits)
            ],
            sketch=None
            if sketch is None
            else [_read_region(JsonObject(value, path, f"sketch[{i}]", _WHAT)) for i, value in enumerate(sketch)],
            sketch_sha256=document.get("sketch_sha256", optional(TEXT), None),
        )


_LIST = Kind(lambda v: isinstance(v, list), "a list")
_OBJECT_OF_LISTS = Kind(
    lambda v: isinstance(v, dict) and all(isinstance(x, list) for x in v.values()), "an object of lists"
)


def _read_region(region: JsonObject) -> Region:
    read = Region(
        tensor=region.get("tensor", TEXT),
        dtype=region.get("dtype", TEXT),
        shape=region.get("shape", int_list()),
        start=region.get("start", INTEGER),
        row_bytes=region.get("row_bytes", INTEGER),
        rows=region.get("rows", INTEGER),
        encoding=region.get("encoding", one_of(*ENCODINGS)),
        changed=region.get("changed", INTEGER),
        offset=region.get("offset", INTEGER),
        index_bytes=region.get("index_bytes", INTEGER),
    )
    if read.changed > read.rows or (read.encoding == "all") != (read.changed == read.rows):
        raise FileFieldError(
            f"{region.path}: {region.where}: {read.changed} of {read.rows} rows changed, as {read.encoding}"
        )
    return read


def _read_sketch_bits(entry: JsonObject) -> SketchBits:
    read = SketchBits(
        feature=entry.get("feature", TEXT),
        bits=entry.get("bits", INTEGER),
        added=entry.get("added", INTEGER),
        rice=entry.get("rice", INTEGER),
        offset=entry.get("offset", INTEGER),
        code_bytes=entry.get("code_bytes", INTEGER),
    )
    if read.added > read.bits or read.rice >= 64:
        raise FileFieldError(f"{entry.path}: {entry.where}: {read.added} of {read.bits} bits, parameter {read.rice}")
    return read


def is_delta(model_dir: str) -> bool:
    """Whether ``model_dir`` is a delta export (it has a delta.json)."""
    return os.path.exists(os.path.join(model_dir, DELTA_FILE))


def read_delta(model_dir: str, manifest: dict[str, ManifestEntry] | None) -> DeltaRecord:
    """A delta export's delta.json, checked against its manifest."""
    return DeltaRecord.from_json(read_file(model_dir, DELTA_FILE, manifest), os.path.join(model_dir, DELTA_FILE))


def manifest_digest(model_dir: str, flag: str) -> str:
    """SHA-256 (hex) of a full export's manifest.json, which names every file's digest:
    the identity of the export a delta applies to. BadInput (naming ``flag``) for an
    export without one (made before manifests) or a delta export."""
    if is_delta(model_dir):
        raise BadInput(
            f"{flag} {model_dir} is a delta export: deltas are taken from and applied to a full export "
            "(the one it names in its delta.json)"
        )
    path = os.path.join(model_dir, MANIFEST_FILE)
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError as e:
        raise BadInput(
            f"{flag} {model_dir}: no {MANIFEST_FILE} to identify it by ({e.strerror or e}): "
            "a delta needs a full export made with manifests (export it again)"
        ) from e


# What makes two exports the same model for its inputs: a delta changes none of it.
_SAME_MODEL_FIELDS = (
    "dense_feature_names",
    "sparse_feature_names",
    "sparse_hotness",
    "num_embeddings_per_feature",
    "layout",
    "preprocessing",
    "histories",
)


def different_inputs(one: ModelInputs, other: ModelInputs) -> str | None:
    """The first field of inputs.json in which two exports are not the same model (other
    features, tables or input transforms), or None."""
    for name in _SAME_MODEL_FIELDS:
        if _model_part(getattr(one, name)) != _model_part(getattr(other, name)):
            return name
    return None


def _model_part(value: object) -> object:
    """``value`` without the seen-id filters' facts (a Parquet model's preprocessing):
    they are what the model read, which a day of training changes (a delta carries its
    own filters, id_sketch.bin), not the shape of its inputs."""
    if getattr(value, "id_sketch", None) is not None:
        return dataclasses.replace(value, id_sketch=None)  # type: ignore[type-var]
    return value


def program_tensors(program: torch.export.ExportedProgram) -> dict[str, torch.Tensor]:
    """Every tensor of a program's weights: its state_dict and its constants."""
    tensors = dict(program.state_dict)
    tensors.update((name, value) for name, value in program.constants.items() if isinstance(value, torch.Tensor))
    return tensors


def program_graph(archive_bytes: bytes) -> bytes:
    """The graphs (models/*.json) of a torch.export archive, without its weights."""
    with zipfile.ZipFile(io.BytesIO(archive_bytes)) as archive:
        members = sorted(name for name in archive.namelist() if "/models/" in f"/{name}")
        return b"\n".join(name.encode() + b"\n" + archive.read(name) for name in members)


def saved_graph(program: torch.export.ExportedProgram) -> bytes:
    """`program_graph` of ``program`` as torch.export.save writes it."""
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    return program_graph(buffer.getvalue())


def _weights(name: str, tensor: torch.Tensor) -> bool:
    """Whether a delta may change ``tensor``: weights (floating point: tables, dense
    layers, calibration) and FBGEMM's quantized tables, never the integer tensors that
    say where rows are (offsets, sizes, indices), which the graph's checks rely on."""
    return tensor.is_floating_point() or (name.endswith("weights_host") and tensor.dtype == torch.uint8)


def _byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor, as a 1-D uint8 view of its storage."""
    return tensor.detach().reshape(-1).view(torch.uint8)


def _regions_of(name: str, tensor: torch.Tensor, tensors: dict[str, torch.Tensor]) -> list[tuple[int, int, int]]:
    """(start byte, row bytes, rows) of each region of ``tensor``; together they cover it."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return []
    if tensor.dim() >= 2 and tensor.shape[0] > 0:
        return [(0, nbytes // tensor.shape[0], tensor.shape[0])]
    tables = _quantized_tables(name, tensor, tensors) if name.endswith("weights_host") else None
    if not tables:
        return [(0, nbytes, 1)]
    # Tables of the same row size one after the other are one region: the padding
    # between them (each table starts at a cache line) as rows that never change.
    regions: list[tuple[int, int, int]] = []
    position = 0
    for start, row_bytes, rows in tables:
        gap = start - position
        if regions and regions[-1][1] == row_bytes and gap % row_bytes == 0:
            first, _, count = regions[-1]
            regions[-1] = (first, row_bytes, count + gap // row_bytes + rows)
        else:
            if gap:
                regions.append((position, gap, 1))
            regions.append((start, row_bytes, rows))
        position = start + row_bytes * rows
    tail = nbytes - position
    if tail and tail % regions[-1][1] == 0:
        first, row_bytes, count = regions[-1]
        regions[-1] = (first, row_bytes, count + tail // row_bytes)
    elif tail:
        regions.append((position, tail, 1))
    return regions


def _quantized_tables(name: str, tensor: torch.Tensor, tensors: dict[str, torch.Tensor]) -> list[tuple[int, int, int]]:
    """The tables of an FBGEMM inference kernel's byte buffer (start, row bytes, rows),
    from the kernel's offsets, dimensions, types and row counts beside it in the
    program; [] when they do not describe disjoint tables inside it (written whole then)."""
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import rounded_row_size_in_bytes

    prefix = name[: -len("weights_host")]
    try:
        offsets = tensors[prefix + "weights_offsets"].tolist()
        dims = tensors[prefix + "D_offsets"].diff().tolist()
        types = tensors[prefix + "weights_tys"].tolist()
        rows = tensors[prefix + "rows_per_table"].tolist()
        if tensor.dtype != torch.uint8 or not len(offsets) == len(dims) == len(types) == len(rows):
            return []
        tables = sorted(
            {
                (start, rounded_row_size_in_bytes(dim, SparseType.from_int(kind), _QUANTIZED_ROW_ALIGNMENT), count)
                for start, dim, kind, count in zip(offsets, dims, types, rows)
            }
        )
    except (KeyError, ValueError, RuntimeError):
        return []
    position = 0
    for start, row_bytes, count in tables:
        if start < position or row_bytes <= 0:
            return []
        position = start + row_bytes * count
    return tables if position <= tensor.numel() else []


def _encode(changed: np.ndarray, rows: int) -> tuple[str, bytes]:
    """The smallest index of the changed rows (sorted) of a region of ``rows`` rows."""
    if len(changed) == rows:
        return "all", b""
    options = [("bitmap", np.packbits(np.isin(np.arange(rows), changed)).tobytes())]
    gaps = np.diff(changed, prepend=0)
    for encoding, dtype in _GAP_TYPES.items():
        if gaps.max(initial=0) < 1 << (8 * np.dtype(dtype).itemsize):
            options.append((encoding, gaps.astype(dtype).tobytes()))
            break
    return min(options, key=lambda option: len(option[1]))


def _decode(region: Region, index: bytes, where: str) -> np.ndarray:
    """The changed rows a region's index names; BadInput unless they are sorted, distinct and inside it."""
    if region.encoding == "all":
        return np.arange(region.rows)
    if region.encoding == "bitmap":
        if len(index) != (region.rows + 7) // 8:
            raise BadInput(f"{where}: its bitmap has {len(index)} bytes for {region.rows} rows")
        rows = np.flatnonzero(np.unpackbits(np.frombuffer(index, np.uint8))[: region.rows])
    else:
        dtype = _GAP_TYPES[region.encoding]
        if len(index) != region.changed * np.dtype(dtype).itemsize:
            raise BadInput(f"{where}: its index has {len(index)} bytes for {region.changed} rows")
        gaps = np.frombuffer(index, dtype).astype(np.int64)
        if len(gaps) > 1 and not (gaps[1:] > 0).all():
            raise BadInput(f"{where}: its changed rows are not in order")
        rows = np.cumsum(gaps)
    if len(rows) != region.changed or (len(rows) and rows[-1] >= region.rows):
        raise BadInput(f"{where}: its index does not name {region.changed} rows below {region.rows}")
    return rows


def diff_programs(base: dict[str, torch.Tensor], new: dict[str, torch.Tensor], path: str) -> tuple[list[Region], bytes]:
    """The regions and .delta bytes that turn the tensors ``base`` into ``new``
    (BadInput naming ``path``, the delta's file, when their names or shapes differ)."""
    if base.keys() != new.keys():
        extra = sorted(base.keys() ^ new.keys())[0]
        raise BadInput(f"{path}: the program's weights differ from the base's ({extra}): export in full")
    regions, payload, offset = [], [], 0
    for name in sorted(new):
        before, after = base[name], new[name]
        if before.shape != after.shape or before.dtype != after.dtype:
            raise BadInput(
                f"{path}: {name} is {after.dtype} {list(after.shape)}, the base's {before.dtype} "
                f"{list(before.shape)} (a table that grew?): a delta keeps every shape: export in full"
            )
        old_bytes, new_bytes = _byte_view(before.contiguous()), _byte_view(after.contiguous())
        if not _weights(name, after):
            if not torch.equal(old_bytes, new_bytes):
                raise BadInput(f"{path}: {name} ({after.dtype}) differs from the base's: export in full")
            continue
        for start, row_bytes, rows in _regions_of(name, after, new):
            end = start + row_bytes * rows
            old_rows = old_bytes[start:end].view(rows, row_bytes)
            new_rows = new_bytes[start:end].view(rows, row_bytes)
            changed = torch.nonzero((old_rows != new_rows).any(1)).flatten().numpy()
            if not len(changed):
                continue
            encoding, index = _encode(changed, rows)
            data = new_rows[torch.from_numpy(changed)].numpy().tobytes()
            regions.append(
                Region(
                    name,
                    str(after.dtype).removeprefix("torch."),
                    list(after.shape),
                    start,
                    row_bytes,
                    rows,
                    encoding,
                    len(changed),
                    offset,
                    len(index),
                )  # fmt: skip
            )
            payload += [index, data]
            offset += len(index) + len(data)
    return regions, b"".join(payload)


def apply_regions(tensors: dict[str, torch.Tensor], regions: list[Region], payload: bytes, path: str) -> None:
    """Writes the changed rows of ``payload`` (the .delta file ``path``) into ``tensors``
    (a program's, in place); BadInput naming the file and the tensor when a region does
    not fit them."""
    for region in regions:
        where = f"{path}: {region.tensor}"
        tensor = tensors.get(region.tensor)
        if tensor is None:
            raise BadInput(f"{where}: the base's program has no such tensor")
        if not _weights(region.tensor, tensor):
            raise BadInput(f"{where}: a {tensor.dtype} tensor, not weights: a delta changes weights only")
        if str(tensor.dtype).removeprefix("torch.") != region.dtype or list(tensor.shape) != region.shape:
            raise BadInput(
                f"{where} is {region.dtype} {region.shape} in the delta, {tensor.dtype} {list(tensor.shape)} "
                "in the base"
            )
        if not tensor.is_contiguous() or region.start + region.row_bytes * region.rows > tensor.numel() * (
            tensor.element_size()
        ):
            raise BadInput(f"{where}: its rows lie outside the tensor")
        if region.end > len(payload):
            raise BadInput(f"{where}: its rows lie past the end of the file ({len(payload)} bytes; damaged?)")
        rows = _decode(region, payload[region.offset : region.offset + region.index_bytes], where)
        start = region.offset + region.index_bytes
        data = np.frombuffer(payload, np.uint8, region.changed * region.row_bytes, start)
        block = _byte_view(tensor)[region.start : region.start + region.row_bytes * region.rows]
        with torch.no_grad():
            block.view(region.rows, region.row_bytes)[torch.from_numpy(rows)] = torch.from_numpy(
                data.reshape(region.changed, region.row_bytes).copy()
            )


def check_applies(
    base: dict[str, torch.Tensor], new: dict[str, torch.Tensor], regions: list[Region], payload: bytes
) -> None:
    """Applies the delta to a copy of ``base`` and checks it gives ``new`` byte for byte
    (an assertion of the writer: a region layout that missed a byte would fail here)."""
    copies = {name: tensor.detach().clone() for name, tensor in base.items()}
    apply_regions(copies, regions, payload, "<delta>")
    for name, tensor in new.items():
        if not torch.equal(_byte_view(copies[name].contiguous()), _byte_view(tensor.contiguous())):
            raise AssertionError(f"the delta does not reproduce {name}")


def rice_encode(positions: np.ndarray, bits: int) -> tuple[int, bytes]:
    """The Golomb-Rice code of ``positions``, ascending and distinct, below ``bits``, and
    its parameter ``k``: the gaps ``g`` (the first position, then each position less the
    one before it, less 1), each as ``g >> k`` in unary (that many 0 bits and a 1) and its
    ``k`` low bits. The low bits of every gap come first, ``k`` bits each, then the unary
    parts (two streams, each padded with 0 bits to a byte), so that both decode without
    a loop. ``k`` is the one giving the shortest code: for ``n`` positions spread evenly
    at random it is about ``log2(bits / n x ln 2)``, the classic choice, and the code
    about ``log2(bits / n) + 1.5`` bits a position, near the ``log2(C(bits, n)) / n``
    any code needs."""
    gaps: np.ndarray = np.diff(np.asarray(positions, np.int64), prepend=-1) - 1
    if not len(gaps):
        return 0, b""
    candidates = np.arange(max(int(bits).bit_length(), 1))
    sizes = [(len(gaps) * k + 7) // 8 + (len(gaps) + int((gaps >> k).sum()) + 7) // 8 for k in candidates]
    k = int(candidates[int(np.argmin(sizes))])
    low = np.empty((len(gaps), k), np.uint8)  # most significant first; a column at a time: n x k bytes at most
    for j in range(k):
        low[:, j] = (gaps >> (k - 1 - j)) & 1
    ends = np.cumsum((gaps >> k) + 1) - 1  # the 1 closing each unary part
    unary = np.zeros(int(ends[-1]) + 1, np.uint8)
    unary[ends] = 1
    return k, np.packbits(low.ravel()).tobytes() + np.packbits(unary).tobytes()


def rice_decode(code: bytes, count: int, k: int, bits: int, where: str) -> np.ndarray:
    """The ``count`` positions (int64, ascending) `rice_encode` wrote as ``code`` with
    parameter ``k``; BadInput naming ``where`` (one line) unless the code is exactly
    that: its streams' sizes, padding, and every position below ``bits``."""
    if count == 0:
        if code:
            raise BadInput(f"{where}: {len(code)} bytes of code for no bits")
        return np.zeros(0, np.int64)
    if k >= max(bits.bit_length(), 1):
        raise BadInput(f"{where}: a code of parameter {k} for a filter of {bits} bits (damaged?)")
    low_bytes = (count * k + 7) // 8
    if len(code) <= low_bytes:
        raise BadInput(f"{where}: its code is {len(code)} bytes, short of {count} gaps of {k} low bits (truncated?)")
    stream = np.frombuffer(code, np.uint8)
    low = np.unpackbits(stream[:low_bytes])
    unary = np.unpackbits(stream[low_bytes:])
    ends = np.flatnonzero(unary)
    if len(ends) != count or low[count * k :].any() or len(unary) - int(ends[-1]) > 8:
        raise BadInput(
            f"{where}: its code does not hold {count} gaps ({len(ends)} unary ends in {len(code)} bytes; "
            "truncated or damaged?)"
        )
    gaps = np.diff(ends, prepend=-1) - 1
    columns = low[: count * k].reshape(count, k)
    for j in range(k):
        gaps = (gaps << 1) | columns[:, j]
    positions = np.cumsum(gaps + 1) - 1
    if positions[-1] >= bits:
        raise BadInput(f"{where}: its code names bit {int(positions[-1])} of a filter of {bits} (damaged?)")
    return positions


def gained_bits(before: np.ndarray, after: np.ndarray) -> np.ndarray | None:
    """The positions (ascending; bit ``i`` of byte ``b`` is ``8b + i``, the filters'
    little-endian packing) of the bits ``after`` has and ``before`` has not, both packed
    uint8 filters of one size; None when ``after`` lacks a bit of ``before`` (it is no
    descendant: filters only gain bits, by OR)."""
    changed = np.flatnonzero(before != after)
    if (before[changed] & ~after[changed]).any():
        return None
    rows, places = np.nonzero(np.unpackbits(after[changed, None] & ~before[changed, None], axis=1, bitorder="little"))
    return changed[rows].astype(np.int64) * 8 + places


def diff_sketches(
    base: Sequence[np.ndarray], new: Sequence[np.ndarray], names: Sequence[str]
) -> tuple[list[SketchBits], bytes] | None:
    """The SketchBits and SKETCH_DELTA_FILE bytes of the seen-id filters ``new`` (uint8,
    one array a feature) against the base's: the bits each gained, Golomb-Rice coded.
    None when a filter changed size or lost a bit (the new model is no descendant of the
    base's: its filters are carried whole): a filter only grows by OR, which is how they
    are applied."""
    entries, payload, offset = [], [], 0
    for name, before, after in zip(names, base, new):
        gained = gained_bits(before, after) if before.shape == after.shape else None
        if gained is None:
            return None
        if not len(gained):
            continue
        k, code = rice_encode(gained, len(after) * 8)
        entries.append(SketchBits(name, len(after) * 8, len(gained), k, offset, len(code)))
        payload.append(code)
        offset += len(code)
    return entries, b"".join(payload)


def apply_sketch_delta(
    model_dir: str, manifest: dict[str, ManifestEntry] | None, base: Sequence[np.ndarray], names: Sequence[str]
) -> list[np.ndarray]:
    """The seen-id filters of the delta export ``model_dir``: the bits it says they
    gained set in ``base`` (the base export's filters, one uint8 array a feature; a
    version 2 delta: its changed bytes OR-ed in), checked against the digest delta.json
    records. BadInput (one line) when the delta has none, its code is damaged, or the
    result is not the filters it was taken from (another base's filters)."""
    record = read_delta(model_dir, manifest)
    path = os.path.join(model_dir, SKETCH_DELTA_FILE)
    if not record.sketch_changes or record.sketch_sha256 is None:
        raise BadInput(f"{model_dir}: a delta export with seen-id filters in neither id_sketch.bin nor {path}")
    payload = read_file(model_dir, SKETCH_DELTA_FILE, manifest)
    filters = {name: np.array(b, np.uint8) for name, b in zip(names, base)}
    for entry in record.sketch_bits or []:
        where = f"{path}: {entry.feature}"
        target = filters.get(entry.feature)
        if target is None or entry.bits != len(target) * 8:
            raise BadInput(f"{where}: not a filter of the base's ({', '.join(names)}, {[len(b) for b in base]} bytes)")
        if entry.offset + entry.code_bytes > len(payload):
            raise BadInput(f"{where}: its code lies past the end of the file ({len(payload)} bytes; truncated?)")
        code = payload[entry.offset : entry.offset + entry.code_bytes]
        positions = rice_decode(code, entry.added, entry.rice, entry.bits, where)
        np.bitwise_or.at(target, positions >> 3, np.left_shift(1, positions & 7).astype(np.uint8))
    for region in record.sketch or []:  # version 2
        where = f"{path}: {region.tensor}"
        target = filters.get(region.tensor)
        if target is None or region.dtype != "uint8" or region.row_bytes != 1 or region.shape != [len(target)]:
            raise BadInput(f"{where}: not a filter of the base's ({', '.join(names)}, {[len(b) for b in base]} bytes)")
        if region.start + region.rows > len(target) or region.end > len(payload):
            raise BadInput(f"{where}: its bytes lie outside the filter or the file (damaged?)")
        rows = _decode(region, payload[region.offset : region.offset + region.index_bytes], where)
        data = np.frombuffer(payload, np.uint8, region.changed, region.offset + region.index_bytes)
        target[region.start + rows] |= data
    result = [filters[name] for name in names]
    digest = hashlib.sha256(b"".join(f.tobytes() for f in result)).hexdigest()
    if digest != record.sketch_sha256:
        raise BadInput(
            f"{path}: applied onto the base's seen-id filters it gives filters of sha256 {digest[:12]}, not the "
            f"model's {record.sketch_sha256[:12]}: the base's id_sketch.bin is not the one it was taken from"
        )
    return result


@dataclass
class Base:
    """The full export a delta is taken from or applied to, read and identified.

    Args:
        path: its directory.
        manifest: its manifest.json.
        digest: SHA-256 of its manifest.json.
        inputs: its inputs.json.
    """

    path: str
    manifest: dict[str, ManifestEntry]
    digest: str
    inputs: ModelInputs

    @classmethod
    def open(cls, path: str, flag: str) -> "Base":
        if not os.path.isdir(path):
            raise BadInput(f"{flag} {path}: no such directory")
        digest = manifest_digest(path, flag)
        manifest = read_manifest(path)
        assert manifest is not None  # manifest_digest read it
        return cls(path, manifest, digest, read_inputs(path, manifest))

    def program(self, precision: str, flag: str) -> torch.export.ExportedProgram:
        """The base's torch.export program of ``precision``; BadInput when it has none."""
        variant = self.inputs.variants.get(precision)
        if variant is None or variant.format != TORCH_EXPORT_FORMAT:
            raise BadInput(
                f"{flag} {self.path} has no {precision} torch.export program (it has "
                f"{', '.join(n for n, v in self.inputs.variants.items() if v.format == TORCH_EXPORT_FORMAT)})"
            )
        return load_exported_program(self.path, variant.file, self.manifest, self.inputs.input_columns())

    def graph(self, precision: str) -> bytes:
        return program_graph(read_file(self.path, self.inputs.variants[precision].file, self.manifest))


def find_base(delta_dir: str, record: DeltaRecord, inputs: ModelInputs, base: str | None) -> Base:
    """The base of the delta ``delta_dir``: ``base`` when given (``--base``), else where
    the delta records it, relative to the delta. BadInput (one line) when it is of
    another model, or is not the export the delta was taken from (its digest)."""
    flag = "--base" if base is not None else f"{os.path.join(delta_dir, DELTA_FILE)}: base_path"
    path = base if base is not None else os.path.normpath(os.path.join(delta_dir, record.base_path))
    opened = Base.open(path, flag)
    other = different_inputs(inputs, opened.inputs)
    if other is not None:
        raise BadInput(
            f"{flag} {path} is another model than the delta {delta_dir} ({other} differ in their {INPUTS_FILE}): "
            "give the full export the delta was taken from"
        )
    if opened.digest != record.base_digest:
        raise BadInput(
            f"{flag} {path} is not the export the delta {delta_dir} was taken from (its {MANIFEST_FILE} "
            f"digests to {opened.digest[:12]}, the delta's base to {record.base_digest[:12]}, step "
            f"{record.base_step}): give that export"
        )
    return opened


def load_delta_program(
    delta_dir: str,
    manifest: dict[str, ManifestEntry] | None,
    record: DeltaRecord,
    inputs: ModelInputs,
    variant: str,
    base: Base,
) -> torch.export.ExportedProgram:
    """The base's program of ``variant`` with the delta's rows written into it."""
    entry = inputs.variants[variant]
    if variant not in record.regions:
        raise BadInput(f"{os.path.join(delta_dir, DELTA_FILE)}: no regions for its {variant} variant (damaged?)")
    program = base.program(variant, "the delta's base")
    payload = read_file(delta_dir, entry.file, manifest)
    apply_regions(program_tensors(program), record.regions[variant], payload, os.path.join(delta_dir, entry.file))
    return program


def describe(record: DeltaRecord) -> str:
    """One line: the base and the changed rows of each variant."""
    words = []
    for variant, regions in record.regions.items():
        changed = sum(r.changed for r in regions if r.rows > 1)
        words.append(f"{variant} {changed} rows")
    return f"delta of step {record.base_step} ({record.base_path}): " + ", ".join(words)
