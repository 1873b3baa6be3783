"""Reading the training's JSON-lines log (``--log_path``) with one-line errors, and
checking that a file a run would append to is one."""

import json
import os
from typing import Any
from collections.abc import Iterator, Sequence

from common.errors import BadInput

# The keys and types of every record training/run_log.py's RunLog.record writes.
RECORD_FIELDS = {"event": str, "run_id": str, "time": (int, float)}
# A run log's first record (the start-up facts, the configuration) is a few KiB: a
# first line longer than this is no run log's.
_FIRST_LINE_LIMIT = 1 << 20


def check_appendable(path: str, flag: str = "--log_path", error: type[Exception] = BadInput) -> None:
    """Refuses a ``path`` a run cannot append its records to: a directory, or an
    existing file whose first line is not a record a run log starts with (an empty or
    missing file passes). Reads at most the first line.

    Raises:
        error: ``"--log_path day_0.npy: holds something other than a training run log ..."``.
    """
    if os.path.isdir(path):
        raise error(f"{flag} {path} is a directory: give the JSON-lines file to write")
    try:
        with open(path, "rb") as f:
            head = f.read(_FIRST_LINE_LIMIT)
    except FileNotFoundError:
        return
    except OSError as e:
        raise error(f"{flag} {path}: cannot read ({e.strerror})") from None
    if not head.strip():
        return
    first, newline, _ = head.lstrip().partition(b"\n")
    try:
        record = json.loads(first) if newline or len(head) < _FIRST_LINE_LIMIT else None
    except ValueError:  # not JSON, or not UTF-8
        record = None
    if not (isinstance(record, dict) and all(isinstance(record.get(key), kind) for key, kind in RECORD_FIELDS.items())):
        raise error(f"{flag} {path}: holds something other than a training run log (its first line is not a "
                    "record of one), and a run appends to it: give a new file, or a run log to add this run to")


def log_records(path: str, error: type[Exception],
                required: Sequence[str] = ("event",)) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) of every non-blank line; raises ``error`` naming the file
    and line for an unreadable file, a line that is not JSON, or a record without the
    ``required`` keys.

    Example::

        for number, record in log_records("run.jsonl", ValueError):
            print(number, record["event"])
    """
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{path} line {number}: not JSON ({e.msg})") from None
        if not isinstance(record, dict) or any(key not in record for key in required):
            keys = " or ".join(f'"{key}"' for key in required)
            raise error(f"{path} line {number}: not a training log record (no {keys})")
        yield number, record
