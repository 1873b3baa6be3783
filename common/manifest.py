"""File manifests: each file's size and SHA-256, to refuse damaged files before loading them.

A manifest maps file names (relative to their directory) to ``{"bytes": N, "sha256": HEX}``,
or, for a file read in pieces (a checkpoint's data file), to ``{"bytes": N, "chunks":
[[OFFSET, LENGTH, HEX], ...]}``: one SHA-256 per piece, the pieces covering the file in
order, so a reader checks each piece as it reads it (`check_chunk`) and no byte is read
twice. Writers hash as they write (`HashingStream`), so a manifest costs no second read
of what was saved; readers check a whole file's size and hash before using it
(`check_bytes`, `check_stream`). A manifest guards against damage (bit flips, truncation, a missing
file), not against someone who rewrites the manifest too: code-free loading is what
protects against hostile files.

Example::

    with open("model/weights.bin", "wb") as raw:
        stream = HashingStream(raw)
        stream.write(payload)
    manifest = {"weights.bin": stream.entry()}
    with open("model/weights.bin", "rb") as f:
        check_stream(f, "model/weights.bin", manifest["weights.bin"])  # ManifestError if damaged
"""

import hashlib
import io
from typing import Any, BinaryIO

from common.errors import BadInput

ManifestEntry = dict[str, Any]
_READ_CHUNK = 8 << 20


class ManifestError(BadInput):
    """A file is missing, or differs from its manifest entry; the message names the file."""


class HashingStream(io.RawIOBase):
    """A write-only binary stream that hashes what passes through it to ``stream``.

    Sequential writes only (no seek), which is how torch.save and DCP write files.
    With ``chunked``, each piece between two `tell` calls gets its own digest: DCP's
    writer asks for the position before and after each item it writes (and torch.save
    never asks), so the pieces are the items a reader reads one by one.

    Args:
        stream: the binary file to write to.
        chunked: a digest per piece (``"chunks"``) instead of one for the file.
    """

    def __init__(self, stream: BinaryIO, chunked: bool = False) -> None:
        super().__init__()
        self._stream = stream
        self._chunked = chunked
        self._sha = hashlib.sha256()
        self._bytes = 0
        self._chunk_start = 0
        self._chunks: list[list[Any]] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._sha.update(view)  # hashlib releases the GIL on large buffers: writer threads overlap
        self._stream.write(view)
        self._bytes += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        if self._chunked:
            self._end_chunk()
        return self._bytes

    def _end_chunk(self) -> None:
        if self._bytes > self._chunk_start:
            self._chunks.append([self._chunk_start, self._bytes - self._chunk_start, self._sha.hexdigest()])
            self._sha = hashlib.sha256()
            self._chunk_start = self._bytes

    def flush(self) -> None:
        self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    def close(self) -> None:  # the caller closes ``stream``
        if not self.closed:
            self.flush()
        super().close()

    def entry(self) -> ManifestEntry:
        """The manifest entry of everything written so far."""
        if self._chunked:
            self._end_chunk()
            return {"bytes": self._bytes, "chunks": [list(chunk) for chunk in self._chunks]}
        return {"bytes": self._bytes, "sha256": self._sha.hexdigest()}


def entry_of_bytes(data: bytes) -> ManifestEntry:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


_NOT_LISTED = "{name}: not listed in the manifest, refusing to load it"


def _check(name: str, expected: ManifestEntry | None, size: int, digest: str | None) -> None:
    if expected is None:
        raise ManifestError(_NOT_LISTED.format(name=name))
    if size != expected["bytes"]:
        raise ManifestError(
            f"{name}: {size} bytes, the manifest says {expected['bytes']}: the file is truncated or damaged"
        )
    if digest is not None and digest != expected["sha256"]:
        raise ManifestError(f"{name}: its SHA-256 differs from the manifest's: the file is damaged")


def check_chunk(data: Any, name: str, expected: ManifestEntry | None, offset: int) -> None:
    """Raises ManifestError (naming ``name`` and the byte range) unless ``data``, read at
    ``offset`` of the file, is a piece the chunked entry lists, with its digest."""
    if expected is None:
        raise ManifestError(_NOT_LISTED.format(name=name))
    where = f"{name} bytes {offset}-{offset + len(data)}"
    if "chunks" not in expected:
        raise ManifestError(f"{name}: the manifest gives it no chunk digests, refusing to load it in pieces")
    digest = next((chunk[2] for chunk in expected["chunks"] if chunk[0] == offset and chunk[1] == len(data)), None)
    if digest is None:
        raise ManifestError(f"{where}: not a chunk the manifest lists (the file is truncated or damaged)")
    if hashlib.sha256(data).hexdigest() != digest:
        raise ManifestError(f"{where}: its SHA-256 differs from the manifest's: the file is damaged")


def check_bytes(data: bytes, name: str, expected: ManifestEntry | None) -> None:
    """Raises ManifestError (naming ``name``) unless ``data`` is what the entry describes."""
    if expected is not None and "chunks" in expected:
        _check(name, expected, len(data), None)
        view = memoryview(data)
        for offset, length, _ in expected["chunks"]:
            check_chunk(view[offset : offset + length], name, expected, offset)
        return
    _check(name, expected, len(data), hashlib.sha256(data).hexdigest())


def check_stream(stream: BinaryIO, name: str, expected: ManifestEntry | None) -> None:
    """Reads ``stream`` to its end; raises ManifestError unless it matches the entry."""
    if expected is None:
        _check(name, None, 0, None)
    sha = hashlib.sha256()
    size = 0
    while True:
        chunk = stream.read(_READ_CHUNK)
        if not chunk:
            break
        sha.update(chunk)
        size += len(chunk)
    _check(name, expected, size, sha.hexdigest())


def _is_chunk_list(chunks: Any, size: int) -> bool:
    """Whether ``chunks`` are [offset, length, hex] pieces covering ``size`` bytes in order."""
    if not isinstance(chunks, list):
        return False
    end = 0
    for chunk in chunks:
        if not (
            isinstance(chunk, list)
            and len(chunk) == 3
            and chunk[0] == end
            and isinstance(chunk[1], int)
            and chunk[1] > 0
            and isinstance(chunk[2], str)
        ):
            return False
        end += chunk[1]
    return end == size


def _is_entry(entry: Any, chunked: bool) -> bool:
    if not (isinstance(entry, dict) and isinstance(entry.get("bytes"), int)):
        return False
    if isinstance(entry.get("sha256"), str):
        return True
    return chunked and _is_chunk_list(entry.get("chunks"), entry["bytes"])


def check_manifest_format(manifest: Any, name: str, chunked: bool = False) -> dict[str, ManifestEntry]:
    """The ``files`` of a parsed manifest, ManifestError naming ``name`` when malformed.
    ``chunked``: entries may give per-chunk digests instead of one for the file."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(_is_entry(e, chunked) for e in files.values()):
        raise ManifestError(f"{name}: not a file manifest (damaged?)")
    return files
