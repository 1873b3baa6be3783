"""Reading the training's JSON-lines log (``--log_path``) with one-line errors."""

import json
from typing import Any
from collections.abc import Iterator, Sequence


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
