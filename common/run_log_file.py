"""Reading the training's JSON-lines log (``--log_path``, written by
training/run_log.py's RunLog) with one-line errors, checking that a file a run would
append to is one, and what its test records say about the model they are of
(`TestedModel`).

The one reader of the log: `log_records` (each record with its line number) and
`read_run_log` (the records); every record is a `RunRecord`. Training, the report, the
sweeps, the matrix, the benchmarks and the tests all read through it."""

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from common.errors import BadInput

# What a test eval record's ``model`` can say (null: a checkpoint that is neither).
MODEL_KINDS = ("final", "best", "newest")

# The keys and types of every record training/run_log.py's RunLog.record writes.
RECORD_FIELDS: dict[str, type | tuple[type, ...]] = {"event": str, "run_id": str, "time": (int, float)}
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
        raise error(
            f"{flag} {path}: holds something other than a training run log (its first line is not a "
            "record of one), and a run appends to it: give a new file, or a run log to add this run to"
        )


class RunRecord(dict[str, Any]):
    """One record of a run log: the JSON object as a dict (every field as written), with
    the fields every record has typed (`RECORD_FIELDS`) and the line it was read from."""

    line: int = 0

    @property
    def event(self) -> str:
        """``config``, ``train``, ``eval``, ``summary``, ... (training/run_log.py)."""
        return str(self["event"])

    @property
    def run_id(self) -> str | None:
        """The run (attempt) that wrote it: a restarted job appends under a new one."""
        value = self.get("run_id")
        return None if value is None else str(value)

    @property
    def time(self) -> float | None:
        """Seconds since the epoch when it was written."""
        value = self.get("time")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def log_records(
    path: str, error: type[Exception] = BadInput, required: Sequence[str] = ("event",)
) -> Iterator[tuple[int, RunRecord]]:
    """(line number, record) of every non-blank line; raises ``error`` naming the file
    and line for an unreadable file, a line that is not JSON, or a record without the
    ``required`` keys.

    Example::

        for number, record in log_records("run.jsonl", ValueError):
            print(number, record.event)
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
            document = json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{path} line {number}: not JSON ({e.msg})") from None
        if not isinstance(document, dict) or any(key not in document for key in required):
            keys = " or ".join(f'"{key}"' for key in required)
            raise error(f"{path} line {number}: not a training log record (no {keys})")
        record = RunRecord(document)
        record.line = number
        yield number, record


def read_run_log(path: str, error: type[Exception] = BadInput, required: Sequence[str] = ("event",)) -> list[RunRecord]:
    """Every record of the run log at ``path``, in order (`log_records` without the
    line numbers; each record keeps its ``line``).

    Example::

        losses = [x for r in read_run_log("run.jsonl") if r.event == "train" for x in r["step_losses"]]
    """
    return [record for _, record in log_records(path, error, required)]


@dataclass(frozen=True)
class TestedModel:
    """Which model a test figure is of: ``kind`` "final" (the run's last weights), "best"
    (the best validation's, which best.json marks), "newest" (a directory's newest
    checkpoint, none marked best) or "" (a checkpoint that is neither); the step its
    weights are from; and whether ``serving.export --checkpoint DIR`` takes it (the
    run's --checkpoint_dir, or the directory of the checkpoint evaluated)."""

    kind: str
    step: int
    exported: bool

    def text(self) -> str:
        """``best, step 38, the one export takes``."""
        return ", ".join(
            [
                *([self.kind] if self.kind else []),
                f"step {self.step}",
                *(["the one export takes"] if self.exported else []),
            ]
        )

    def fields(self) -> dict[str, Any]:
        """The eval record's ``model`` (the kind, null for "") and ``exported``."""
        return {"model": self.kind or None, "exported": self.exported}

    @classmethod
    def of_record(cls, record: dict[str, Any], error: type[Exception], where: str) -> Optional["TestedModel"]:
        """The model a test ``eval`` record (or a summary's ``test_model``) is of; None
        for a log written before records said so (no ``exported``). Raises ``error``
        naming ``where`` (file and line) when the fields are malformed."""
        if "exported" not in record:
            return None
        kind, step, exported = record.get("model"), record.get("step"), record.get("exported")
        if not (kind is None or kind in MODEL_KINDS):
            raise error(f'{where}: "model" is {kind!r}, expected one of {", ".join(MODEL_KINDS)} or null')
        if not isinstance(step, int) or isinstance(step, bool) or not isinstance(exported, bool):
            raise error(f'{where}: a tested model needs an integer "step" and a true/false "exported"')
        return cls(kind or "", step, exported)
