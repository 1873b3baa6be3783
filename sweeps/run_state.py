"""What a sweep knows about each of its runs: ``OUTPUT_DIR/RUN/run.json``.

Written (under a temporary name, then renamed) when the sweep starts, when the run
is submitted and when it ends, so ``python -m sweeps status`` and ``report`` read the
same facts from another process. States: pending, submitted, running, succeeded,
failed, cancelled.

Example::

    record = RunRecord.read(os.path.join(output_dir, "max_table_rows=100"))
    print(record.state, record.exit_code, record.error)
"""

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any

from common.atomic import write_json
from common.errors import BadInput

RUN_FILE = "run.json"
LOG_FILE = "log.jsonl"
PENDING, SUBMITTED, RUNNING, SUCCEEDED, FAILED, CANCELLED = (
    "pending",
    "submitted",
    "running",
    "succeeded",
    "failed",
    "cancelled",
)
TERMINAL = (SUCCEEDED, FAILED, CANCELLED)


class RunStateError(BadInput):
    """A run.json that is not one this tool wrote; the message names the file."""


@dataclass
class RunRecord:
    """One run of a sweep.

    Args:
        index: position in the sweep.
        name: the run's directory name.
        directory: absolute path of the run directory.
        grid_values: the run's own flags (its grid values).
        argv: the training flags it runs with (``--log_path`` included).
        scheduler: torchx scheduler name.
        ranks: nodes x processes per node.
        ranks_per_node: processes per node.
        state: one of the states above.
        app_handle: torchx's handle once submitted.
        exit_code: the failing rank's exit code (or the job's), when it failed.
        error: the last error line of its output, or the scheduler's reason.
        submitted, finished: seconds since the epoch.
        config: with the sweep's ``seeds``, the configuration this run repeats with
            its seed (results.md's mean and standard deviation group by it).
    """

    index: int
    name: str
    directory: str
    grid_values: dict[str, Any]
    argv: list[str]
    scheduler: str
    ranks: int
    ranks_per_node: int
    state: str = PENDING
    app_handle: str | None = None
    exit_code: int | None = None
    error: str | None = None
    submitted: float | None = None
    finished: float | None = None
    config: str | None = None

    @property
    def log_path(self) -> str:
        return os.path.join(self.directory, LOG_FILE)

    def write(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        write_json(os.path.join(self.directory, RUN_FILE), dataclasses.asdict(self))

    @classmethod
    def read(cls, directory: str) -> "RunRecord":
        path = os.path.join(directory, RUN_FILE)
        try:
            with open(path) as f:
                payload = json.load(f)
            return cls(**payload)
        except (OSError, json.JSONDecodeError, TypeError) as e:
            raise RunStateError(f"{path}: not a run record of python -m sweeps ({e})") from None


def read_runs(output_dir: str) -> list[RunRecord]:
    """Every run recorded under ``output_dir``, in grid order.

    Raises:
        RunStateError: the directory holds no runs, or a damaged run.json.
    """
    if not os.path.isdir(output_dir):
        raise RunStateError(f"{output_dir}: no such directory")
    records = [
        RunRecord.read(os.path.join(output_dir, d))
        for d in sorted(os.listdir(output_dir))
        if os.path.isfile(os.path.join(output_dir, d, RUN_FILE))
    ]
    if not records:
        raise RunStateError(f"{output_dir}: no sweep runs here (no */{RUN_FILE})")
    return sorted(records, key=lambda r: r.index)
