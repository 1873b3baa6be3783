"""What a run tells people and machines: progress bar, interval lines, JSON lines.

Only rank 0 prints and writes. The JSON-lines log is appended to, one object per
line, every record carrying the run's ``run_id``:
``{"event": "startup", ...}`` (training/startup_report.py) and ``{"event": "config", ...}`` (`RunLog.record_config`)
once, ``{"event": "inference_benchmark", "stage": "inference_benchmark", ...}`` (training/inference_benchmark.py), ``{"event": "train", "step", "epoch", "loss", "lr",
"records_per_sec", "total_steps", "eta_seconds", ...}`` per interval and ``{"event": "eval", "stage", "step",
"auroc", "log_loss", "accuracy", "ne", "calibration", "positive_rate", "num_samples", "records_per_sec",
"seconds"}`` per evaluation (a test's also ``model``, ``"final"``, ``"best"``, ``"newest"`` or null, and
``exported``: see `TestedModel`), ``{"event": "summary", ...}`` at the end of training (``test``: the figures of the
best model when one was kept, else of the final weights; ``test_model``: which, as ``{"model", "step",
"exported"}``; ``final_test``: the final weights' figures when the best was tested too, else null;
``export_step``: the step of the checkpoint serving.export takes, null without --checkpoint_dir), ``{"event": "plan_memory", ...}`` after the first step (training/plan_memory.py), ``{"event": "warm_start", "path", "step", "meta_sha256", "origin_run_id", "optimizer", "grown_tables"}`` once for a --warm_start run (training/warm_start.py) (training/metrics.py says what each means; with --rolling_windows a
validation record also has ``window``, the window evaluated); every record also has
``time`` (seconds since the epoch). With a TensorBoard directory the same scalars go
to event files too, and each window's metrics also as ``window/<key>`` over the window.
The log is read back by one reader, common/run_log_file.py's `read_run_log`.
"""

import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from common.run_log_file import TestedModel  # noqa: F401  (the trainer's, with the log's)
from common.url_paths import redacted_record, redacted_text
from training.metrics import METRIC_NAMES

if TYPE_CHECKING:
    from training.config import TrainConfig


# JSON record keys also written to TensorBoard, as "<train|validation|test>/<key>".
TENSORBOARD_SCALARS = {"train": ("loss", "lr", "records_per_sec"), "eval": METRIC_NAMES}


def format_duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``2h07m``: an ETA's precision."""
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def format_metrics(stage: str, values: Mapping[str, float] | None) -> str:
    """``test AUROC 0.8012, log loss 0.4501, NE 0.8123`` (``test: none`` without values)."""
    if not values:
        return f"{stage}: none"
    return f"{stage} AUROC {values['auroc']:.4f}, log loss {values['log_loss']:.4f}, NE {values['ne']:.4f}"


class StepClock:
    """Where training is (``step 37/160``) and when it should end, from the training
    time of the steps this process has run (evaluation and checkpoints excluded, so
    the ETA does not count them either).

    Args:
        total_steps: the run's training steps (every epoch), counted from step 0.
    """

    def __init__(self, total_steps: int) -> None:
        self.total_steps = total_steps
        self._steps = 0
        self._seconds = 0.0

    def tick(self, step: int, steps: int, seconds: float) -> tuple[str, float | None]:
        """Adds an interval of ``steps`` steps that took ``seconds``; returns the
        line's ``step N/M | ETA 3m05s`` and the ETA in seconds (None before any time)."""
        self._steps += steps
        self._seconds += seconds
        if self._seconds <= 0:
            return f"step {step}/{self.total_steps}", None
        eta = max(self.total_steps - step, 0) * self._seconds / self._steps
        return f"step {step}/{self.total_steps} | ETA {format_duration(eta)}", eta


class RunLog:
    """Console and JSON-lines output of one run (silent on ranks other than 0).

    Args:
        enabled: True on rank 0.
        log_path: JSON-lines file (its directory is created), or None.
        tensorboard_dir: TensorBoard event files, or None.
        progress: show the progress bar (on rank 0).
    """

    def __init__(
        self, enabled: bool, log_path: str | None, tensorboard_dir: str | None = None, progress: bool = True
    ) -> None:
        self.enabled = enabled
        self.progress = progress
        self.run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        self._file = None
        self._bar: tqdm | None = None
        self._evaluation_bar: tqdm | None = None
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
                    if fields.get("window") is not None:  # --rolling_windows: over the window too
                        self._tensorboard.add_scalar(f"window/{key}", fields[key], fields["window"])
            if "peak_memory_bytes" in fields:
                self._tensorboard.add_scalar(
                    "train/peak_memory_gib", max(fields["peak_memory_bytes"]) / 2**30, fields["step"]
                )
        if self._file is None:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in fields.items()}
        clean = redacted_record(clean)  # a URL's credentials, whatever route brought them here
        # Every record starts so (common/run_log_file.RECORD_FIELDS: what a file a run appends to must start with).
        self._file.write(json.dumps({"event": event, "run_id": self.run_id, "time": time.time(), **clean}) + "\n")

    def record_config(self, config: "TrainConfig", world_size: int, resolved_device: str) -> None:
        """The run's one ``config`` record: every field of the configuration, nested as in
        training/config.py (``dataclasses.asdict``), the job's world size and the device the
        run resolved (``cuda:0``, ``cpu``)."""
        self.record("config", world_size=world_size, resolved_device=resolved_device, **dataclasses.asdict(config))

    def print(self, line: str) -> None:
        if not self.enabled:
            return
        line = redacted_text(line)
        if self._bar is not None:
            self._bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def start_progress(self, total: int, description: str, initial: int = 0) -> None:
        if self.enabled and self.progress:
            self.close_progress()
            self._bar = tqdm(
                total=total,
                initial=initial,
                desc=description,
                unit="step",
                dynamic_ncols=True,
                file=sys.stderr,
                mininterval=1.0,
            )

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def start_evaluation_progress(self, total: int, stage: str) -> None:
        """A bar for an evaluation, under the training bar; it appears only when the
        evaluation takes more than a few seconds and goes when it ends."""
        if self.enabled and self.progress:
            self._evaluation_bar = tqdm(
                total=total,
                desc=stage,
                unit="step",
                dynamic_ncols=True,
                file=sys.stderr,
                mininterval=1.0,
                delay=2.0,
                leave=False,
                position=1 if self._bar is not None else 0,
            )

    def advance_evaluation(self) -> None:
        if self._evaluation_bar is not None:
            self._evaluation_bar.update(1)

    def close_evaluation_progress(self) -> None:
        if self._evaluation_bar is not None:
            self._evaluation_bar.close()
            self._evaluation_bar = None

    def close_progress(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def close(self) -> None:
        self.close_evaluation_progress()
        self.close_progress()
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
