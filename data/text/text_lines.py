"""Whole lines of a text file (plain or .gz), a chunk at a time, with their line numbers.

Preprocessing reads raw Criteo days this way, and the predictor reads its input so:
memory is bounded by the chunk size, and a damaged or truncated .gz is one error
naming the file.

Example::

    for first_line, nbytes, lines in iter_line_chunks(DaySource(0, "day_0.gz"), 1 << 20):
        ...  # lines: whole lines; first_line: the 0-based number of the first of them
"""

import gzip
import os
import zlib
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass

import numpy as np

from common.errors import BadInput


@dataclass(frozen=True)
class DaySource:
    """The lines of one output day: a whole file, or a line range of the Kaggle file."""

    day: int
    path: str
    first_line: int = 0  # 0-based line number of the day's first line in the file
    num_lines: int | None = None  # None: to the end of the file
    file_lines: int | None = None  # lines of the whole file, when cut into days

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def signature(self) -> dict[str, object]:
        stat = os.stat(self.path)
        return {
            "path": os.path.abspath(self.path),
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "first_line": self.first_line,
            "num_lines": self.num_lines,
        }


def read_blocks(path: str, block_bytes: int) -> Iterator[bytes]:
    """The bytes of a file (decompressed when it ends in .gz), a block at a time.

    Raises:
        BadInput: naming the file, when it cannot be read, is not gzip data, or is
            a truncated .gz.
    """
    try:
        with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
            while block := f.read(block_bytes):
                yield block
    except EOFError as e:
        raise BadInput(f"{path}: truncated (the compressed data ends early)") from e
    except (gzip.BadGzipFile, zlib.error) as e:
        raise BadInput(f"{path}: not valid gzip data ({e})") from e
    except OSError as e:
        raise BadInput(f"{path}: cannot read ({e.strerror or e})") from e


def _newline_positions(data: bytes) -> np.ndarray:
    return np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)


def iter_line_chunks(source: DaySource, chunk_bytes: int) -> Iterator[tuple[int, int, bytes]]:
    """Yields (0-based line number of the first line, bytes read, whole lines) of a source."""
    skip, left = source.first_line, source.num_lines
    line = 0
    carry = b""
    with closing(read_blocks(source.path, chunk_bytes)) as blocks:
        while left is None or left > 0:
            block = next(blocks, b"")
            data = carry + block
            if not block:
                if data:  # a last line without newline
                    data += b"\n"
                else:
                    break
            cut = data.rfind(b"\n") + 1
            lines, carry = data[:cut], data[cut:]
            if not block:
                carry = b""
            if not lines:
                continue
            count = lines.count(b"\n")
            if skip:
                if skip >= count:
                    skip, line = skip - count, line + count
                    continue
                lines = lines[_newline_positions(lines)[skip - 1] + 1 :]
                count, line, skip = count - skip, line + skip, 0
            if left is not None and count > left:
                lines, count = lines[: _newline_positions(lines)[left - 1] + 1], left
            yield line, len(block), lines
            line += count
            if left is not None:
                left -= count
            if not block:
                break
