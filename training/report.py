"""Charts and a summary of training runs from their JSON-lines logs.

    python -m training.report runs/a.jsonl [runs/b.jsonl ...] --output run.png

Draws training loss (its range set by the bulk of the losses, so one early spike cannot
flatten it), learning rate, records/s and validation AUROC, normalized entropy
(NE) and calibration over steps, one line per run (a log holds every run appended to it, told apart by ``run_id``), and
prints per run: best validation AUROC and its step, mean records/s without the first
(warm-up) interval, and the wall time from first to last record. A malformed log is
reported as one line naming the file and line, exit code 2.
"""

import os
import statistics
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from common.cli import OneLineParser, cli_main
from common.errors import BadInput
from common.png_figure import png_figure
from common.run_log_file import log_records

FIGURE_INCHES = (12.0, 8.0)
FIGURE_DPI = 100  # so the PNG is 1200 x 800 pixels
# A loss farther than this from the middle half of the losses is off the loss panel's range
# (in inter-quartile ranges, or in fractions of the median when the losses are flat).
OUTLIER_IQRS = 3.0
OUTLIER_MEDIAN_FRACTION = 0.5
_REQUIRED = {"train": ("step", "loss", "lr", "records_per_sec"), "eval": ("stage", "step")}


class LogError(BadInput):
    """A log line is not a record this tool understands."""


@dataclass
class Run:
    """The records of one run: (step, value) series and the wall-clock span."""

    label: str
    loss: List[Tuple[int, float]] = field(default_factory=list)
    lr: List[Tuple[int, float]] = field(default_factory=list)
    records_per_sec: List[Tuple[int, float]] = field(default_factory=list)
    validation_auroc: List[Tuple[int, float]] = field(default_factory=list)
    validation_ne: List[Tuple[int, float]] = field(default_factory=list)
    validation_calibration: List[Tuple[int, float]] = field(default_factory=list)
    first_time: Optional[float] = None
    last_time: Optional[float] = None

    def summary(self) -> Dict[str, object]:
        best = max(self.validation_auroc, key=lambda p: p[1], default=None)
        rates = [r for _, r in self.records_per_sec[1:]] or [r for _, r in self.records_per_sec]
        return {
            "run": self.label,
            "best_validation_auroc": best[1] if best else None,
            "best_step": best[0] if best else None,
            "mean_records_per_sec": sum(rates) / len(rates) if rates else None,
            "total_seconds": (self.last_time - self.first_time) if self.first_time is not None else None,
            "steps": self.loss[-1][0] if self.loss else 0,
        }


def read_runs(path: str) -> List[Run]:
    """The runs of one log file, in the order they first appear."""
    runs: Dict[str, Run] = {}
    for number, record in log_records(path, LogError):
        event = record["event"]
        missing = [k for k in _REQUIRED.get(event, ()) if record.get(k) is None]
        if missing:
            raise LogError(f"{path} line {number}: {event} record without {', '.join(missing)}")
        run_id = str(record.get("run_id", "run"))
        run = runs.setdefault(run_id, Run(label=f"{os.path.basename(path)}:{run_id}"))
        if isinstance(record.get("time"), (int, float)):
            run.first_time = record["time"] if run.first_time is None else run.first_time
            run.last_time = record["time"]
        if event == "train":
            step = int(record["step"])
            run.loss.append((step, float(record["loss"])))
            run.lr.append((step, float(record["lr"])))
            run.records_per_sec.append((step, float(record["records_per_sec"])))
        elif event == "eval" and record["stage"] == "validation":
            for key in ("auroc", "ne", "calibration"):  # null when not finite; older logs have no NE
                if record.get(key) is not None:
                    getattr(run, f"validation_{key}").append((int(record["step"]), float(record[key])))
    if not runs:
        raise LogError(f"{path}: no records")
    return list(runs.values())


def robust_range(values: Sequence[float]) -> Optional[Tuple[float, float]]:
    """The y-range of the values that are not outliers, padded by 5%; None when no value is
    an outlier (the plot's own range is right then).

    A value is an outlier when it lies more than ``max(OUTLIER_IQRS * IQR,
    OUTLIER_MEDIAN_FRACTION * |median|)`` beyond the quartiles, so one early spike of
    4e4 cannot flatten a loss curve near 0.6, while a curve falling from 0.69 to 0.45
    keeps its every point.

    Args:
        values: the plotted values (all runs of a panel).

    Example::

        robust_range([0.7, 42355.0, 0.65, 0.62, 0.6])  # about (0.595, 0.705)
    """
    if len(values) < 4:
        return None
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    reach = max(OUTLIER_IQRS * (q3 - q1), OUTLIER_MEDIAN_FRACTION * abs(median))
    bulk = [v for v in values if q1 - reach <= v <= q3 + reach]
    if len(bulk) == len(values):
        return None
    low, high = min(bulk), max(bulk)
    pad = 0.05 * (high - low) or 0.05 * abs(high) or 0.05
    return low - pad, high + pad


def loss_limits(runs: Sequence[Run]) -> Optional[Tuple[float, float]]:
    """The loss panel's y-range over every run (`robust_range` of all their losses)."""
    return robust_range([loss for run in runs for _, loss in run.loss])


def draw(runs: Sequence[Run], output: str) -> None:
    """Writes a 2 x 3 chart to ``output`` (PNG), under a temporary name first."""
    panels = [("loss", "training loss"), ("lr", "learning rate"), ("records_per_sec", "records/s"),
              ("validation_auroc", "validation AUROC"), ("validation_ne", "validation normalized entropy"),
              ("validation_calibration", "validation calibration (predicted / clicks)")]
    limits = loss_limits(runs)
    with png_figure(output, 2, 3, figsize=FIGURE_INCHES, dpi=FIGURE_DPI) as (_, axes):
        for ax, (attr, title) in zip(axes.flat, panels):
            for run in runs:
                points = getattr(run, attr)
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 30 else None,
                            label=run.label)
            ax.set_title(title)
            if attr == "loss" and limits is not None:
                ax.set_ylim(*limits)
                ax.set_title(f"{title} (outliers off the range)")
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        axes.flat[0].legend(fontsize="small")


PROG = "training.report"


@cli_main(PROG)
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", help="JSON-lines logs written with --log_path")
    parser.add_argument("--output", default="run.png", help="PNG to write (1200 x 800)")
    args = parser.parse_args(argv)
    runs = [run for path in args.logs for run in read_runs(path)]
    try:
        draw(runs, args.output)
    except OSError as e:
        raise BadInput(f"--output {args.output}: cannot write it: {e.strerror}") from e
    for run in runs:
        s = run.summary()
        auroc = "n/a" if s["best_validation_auroc"] is None else f"{s['best_validation_auroc']:.4f} at step {s['best_step']}"
        rate = "n/a" if s["mean_records_per_sec"] is None else f"{s['mean_records_per_sec']:,.0f}"
        total = "n/a" if s["total_seconds"] is None else f"{s['total_seconds']:.1f} s"
        print(f"{s['run']}: {s['steps']} steps | best validation AUROC {auroc} | "
              f"mean records/s (after warm-up) {rate} | total time {total}")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
