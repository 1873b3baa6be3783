"""What a run tells people and machines: progress bar, interval lines, JSON lines.

Only rank 0 prints and writes. The JSON-lines log is appended to, one object per
line, every record carrying the run's ``run_id``:
``{"event": "config", ...}`` once, ``{"event": "train", "step", "epoch", "loss", "lr",
"records_per_sec", ...}`` per interval and ``{"event": "eval", "stage", "step",
"auroc", "log_loss", "accuracy", "ne", "calibration", "positive_rate", "num_samples"}``
per evaluation (training/metrics.py says what each means); every record also has
``time`` (seconds since the epoch). With a TensorBoard directory the same scalars go
to event files too.
"""

import json
import math
import os
import sys
import time
from typing import Any, Optional

from tqdm import tqdm

from training.metrics import METRIC_NAMES


# JSON record keys also written to TensorBoard, as "<train|validation|test>/<key>".
TENSORBOARD_SCALARS = {"train": ("loss", "lr", "records_per_sec"), "eval": METRIC_NAMES}


class RunLog:
    """Console and JSON-lines output of one run (silent on ranks other than 0).

    Args:
        enabled: True on rank 0.
        log_path: JSON-lines file (its directory is created), or None.
        tensorboard_dir: TensorBoard event files, or None.
        progress: show the progress bar (on rank 0).
    """

    def __init__(self, enabled: bool, log_path: Optional[str], tensorboard_dir: Optional[str] = None,
                 progress: bool = True) -> None:
        self.enabled = enabled
        self.progress = progress
        self.run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        self._file = None
        self._bar: Optional[tqdm] = None
        self._tensorboard = None
        if enabled and log_path:
            os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
            self._file = open(log_path, "a", buffering=1)
        if enabled and tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(tensorboard_dir)

    def record(self, event: str, **fields: Any) -> None:
        """Appends one JSON object (non-finite floats become null), and writes the
        scalars of train and eval records to TensorBoard."""
        if self._tensorboard is not None and event in TENSORBOARD_SCALARS:
            prefix = fields.get("stage", "train")
            for key in TENSORBOARD_SCALARS[event]:
                if isinstance(fields.get(key), (int, float)):
                    self._tensorboard.add_scalar(f"{prefix}/{key}", fields[key], fields["step"])
            if "peak_memory_bytes" in fields:
                self._tensorboard.add_scalar("train/peak_memory_gib", max(fields["peak_memory_bytes"]) / 2**30,
                                             fields["step"])
        if self._file is None:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in fields.items()}
        self._file.write(json.dumps({"event": event, "run_id": self.run_id, "time": time.time(), **clean}) + "\n")

    def print(self, line: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def start_progress(self, total: int, description: str, initial: int = 0) -> None:
        if self.enabled and self.progress:
            self.close_progress()
            self._bar = tqdm(total=total, initial=initial, desc=description, unit="step", dynamic_ncols=True,
                             file=sys.stderr, mininterval=1.0)

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def close_progress(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def close(self) -> None:
        self.close_progress()
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
