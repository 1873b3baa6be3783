"""File manifests: each file's size and SHA-256, to refuse damaged files before loading them.

A manifest maps file names (relative to their directory) to ``{"bytes": N, "sha256": HEX}``.
Writers hash as they write (`HashingStream`), so a manifest costs no second read of
what was saved; readers check a file's size and hash before using it (`check_bytes`,
`check_stream`). A manifest guards against damage (bit flips, truncation, a missing
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
from typing import Any, BinaryIO, Dict, Optional

from common.errors import BadInput

ManifestEntry = Dict[str, Any]
_READ_CHUNK = 8 << 20


class ManifestError(BadInput):
    """A file is missing, or differs from its manifest entry; the message names the file."""


class HashingStream(io.RawIOBase):
    """A write-only binary stream that hashes what passes through it to ``stream``.

    Sequential writes only (no seek), which is how torch.save and DCP write files.

    Args:
        stream: the binary file to write to.
    """

    def __init__(self, stream: BinaryIO) -> None:
        super().__init__()
        self._stream = stream
        self._sha = hashlib.sha256()
        self._bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        self._sha.update(view)  # hashlib releases the GIL on large buffers: writer threads overlap
        self._stream.write(view)
        self._bytes += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self._bytes

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
        return {"bytes": self._bytes, "sha256": self._sha.hexdigest()}


def entry_of_bytes(data: bytes) -> ManifestEntry:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _check(name: str, expected: Optional[ManifestEntry], size: int, digest: Optional[str]) -> None:
    if expected is None:
        raise ManifestError(f"{name}: not listed in the manifest, refusing to load it")
    if size != expected["bytes"]:
        raise ManifestError(f"{name}: {size} bytes, the manifest says {expected['bytes']}: "
                            "the file is truncated or damaged")
    if digest is not None and digest != expected["sha256"]:
        raise ManifestError(f"{name}: its SHA-256 differs from the manifest's: the file is damaged")


def check_bytes(data: bytes, name: str, expected: Optional[ManifestEntry]) -> None:
    """Raises ManifestError (naming ``name``) unless ``data`` is what the entry describes."""
    _check(name, expected, len(data), hashlib.sha256(data).hexdigest())


def check_stream(stream: BinaryIO, name: str, expected: Optional[ManifestEntry]) -> None:
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


def check_manifest_format(manifest: Any, name: str) -> Dict[str, ManifestEntry]:
    """The ``files`` of a parsed manifest, ManifestError naming ``name`` when malformed."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(
            isinstance(e, dict) and isinstance(e.get("bytes"), int) and isinstance(e.get("sha256"), str)
            for e in files.values()):
        raise ManifestError(f"{name}: not a file manifest (damaged?)")
    return files
