"""Charts and a summary of training runs from their JSON-lines logs.

    python -m training.report runs/a.jsonl [runs/b.jsonl ...] --output run.png

Draws training loss (its range set by the bulk of the losses, so one early spike cannot
flatten it), learning rate, records/s and validation AUROC, normalized entropy
(NE) and calibration over steps (a run with --rolling_windows gets a third row: the
same three metrics of each window, evaluated after training on the windows before it),
one line per run (a log holds every run appended to it,
told apart by ``run_id``), labelled by its model and the flags that differ between the runs,
with its test AUROC (and which model that is, once there was a choice: ``best, step 38, the
one export takes``); the legend sits under the panels. It prints per run: best validation
AUROC and its step, every test AUROC with its model (the delivered one first, then the final
weights'), with --rolling_windows the window whose model export takes, mean records/s without the first
(warm-up) interval, and the wall time from first to last record. A malformed log is
reported as one line naming the file and line, exit code 2.
"""

import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from common.cli import OneLineParser, cli_main
from common.errors import BadInput
from common.png_figure import FOOTER_HEIGHT, png_figure
from common.run_log_file import TestedModel, log_records
from models.interactions import INTERACTIONS

FIGURE_INCHES = (12.0, 8.0)  # two rows of panels; a third (rolling windows) adds half the height
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
    loss: list[tuple[int, float]] = field(default_factory=list)
    lr: list[tuple[int, float]] = field(default_factory=list)
    records_per_sec: list[tuple[int, float]] = field(default_factory=list)
    validation_auroc: list[tuple[int, float]] = field(default_factory=list)
    validation_ne: list[tuple[int, float]] = field(default_factory=list)
    validation_calibration: list[tuple[int, float]] = field(default_factory=list)
    # --rolling_windows: (window, value) of each window's evaluation
    window_auroc: list[tuple[int, float]] = field(default_factory=list)
    window_ne: list[tuple[int, float]] = field(default_factory=list)
    window_calibration: list[tuple[int, float]] = field(default_factory=list)
    first_time: float | None = None
    last_time: float | None = None
    # The run's configuration record (None for a log without one) and its test metrics:
    # those of the last test, which a run that kept a best model tests after its final weights.
    config: dict[str, object] | None = None
    test: dict[str, float] = field(default_factory=dict)
    # Every test's model (None for logs before records said) and AUROC, in order.
    tests: list[tuple[TestedModel | None, float | None]] = field(default_factory=list)
    # --rolling_windows: (window, step) of the window evaluation whose model export takes
    exported_window: tuple[int, int] | None = None

    def _named(self, model: TestedModel | None) -> bool:
        """Whether a test's model is worth naming: there was a choice (a best model kept,
        or a checkpoint directory to export from)."""
        return model is not None and (len(self.tests) > 1 or model.exported or model.kind in ("best", "newest"))

    @property
    def test_model(self) -> TestedModel | None:
        """Which model `test` is of, when the log says and it is worth naming."""
        model = self.tests[-1][0] if self.tests else None
        return model if self._named(model) else None

    def tests_text(self) -> str:
        """``test AUROC 0.6605 (best, step 38, the one export takes); 0.6201 (final, step 57)``."""
        parts = [
            f"{auroc:.4f}" + (f" ({model.text()})" if model is not None and self._named(model) else "")
            for model, auroc in reversed(self.tests)
            if auroc is not None
        ]
        return "test AUROC " + ("; ".join(parts) if parts else "n/a")

    def summary(self) -> dict[str, object]:
        best = max(self.validation_auroc, key=lambda p: p[1], default=None)
        rates = [r for _, r in self.records_per_sec[1:]] or [r for _, r in self.records_per_sec]
        return {
            "run": self.label,
            "best_validation_auroc": best[1] if best else None,
            "best_step": best[0] if best else None,
            "mean_records_per_sec": sum(rates) / len(rates) if rates else None,
            "total_seconds": (self.last_time - self.first_time) if self.first_time is not None else None,
            "steps": self.loss[-1][0] if self.loss else 0,
            "test_auroc": self.test.get("auroc"),
            "test_log_loss": self.test.get("log_loss"),
        }


def read_runs(path: str) -> list[Run]:
    """The runs of one log file, in the order they first appear."""
    runs: dict[str, Run] = {}
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
        elif event == "config":
            run.config = record
        elif event == "eval" and record["stage"] == "test":
            run.test = {k: float(record[k]) for k in ("auroc", "log_loss") if isinstance(record.get(k), (int, float))}
            run.tests.append((TestedModel.of_record(record, LogError, f"{path} line {number}"), run.test.get("auroc")))
        elif event == "summary" and isinstance(record.get("windows"), list):
            exported = [w for w in record["windows"] if isinstance(w, dict) and w.get("exported") is True]
            if exported and isinstance(exported[-1].get("window"), int) and isinstance(exported[-1].get("step"), int):
                run.exported_window = (exported[-1]["window"], exported[-1]["step"])
        elif event == "eval" and record["stage"] == "validation":
            for key in ("auroc", "ne", "calibration"):  # null when not finite; older logs have no NE
                if record.get(key) is not None:
                    getattr(run, f"validation_{key}").append((int(record["step"]), float(record[key])))
                    if record.get("window") is not None:
                        getattr(run, f"window_{key}").append((int(record["window"]), float(record[key])))
    if not runs:
        raise LogError(f"{path}: no records")
    return list(runs.values())


def robust_range(values: Sequence[float]) -> tuple[float, float] | None:
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


def loss_limits(runs: Sequence[Run]) -> tuple[float, float] | None:
    """The loss panel's y-range over every run (`robust_range` of all their losses)."""
    return robust_range([loss for run in runs for _, loss in run.loss])


# Configuration keys that differ between runs without making them different runs.
_NOT_A_DIFFERENCE = {
    "run_id",
    "time",
    "event",
    "log_path",
    "tensorboard_dir",
    "checkpoint",
    "interaction_type",
    "print_lr",
    "print_sharding_plan",
    "print_progress",
    "resolved_device",
}
# A label shows at most this many differing flags (then "+N more"), values cut at this length.
MAX_LABEL_FLAGS = 3
MAX_LABEL_VALUE = 16
# Legend labels up to this many characters go two to a row, longer ones one.
TWO_COLUMN_LABEL = 60
LEGEND_ROW_HEIGHT = 0.035  # of the figure's height


def _flat(config: dict[str, object], prefix: str = "") -> dict[str, object]:
    """{leaf key: value} of a nested config record (sections dropped from the keys)."""
    flat: dict[str, object] = {}
    for key, value in config.items():
        if key in _NOT_A_DIFFERENCE:
            continue
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _value_text(value: object) -> str:
    text = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
    return text if len(text) <= MAX_LABEL_VALUE else text[: MAX_LABEL_VALUE - 1] + "…"


def model_name(run: Run) -> str:
    """DLRM, DCNv2, ... from the run's config record ("run" for a log without one)."""
    if run.config is None:
        return "run"
    model = run.config.get("model")
    kind = model.get("interaction_type") if isinstance(model, dict) else None
    # The model the interaction builds (the config record names no entry point).
    entry = INTERACTIONS.get(str(kind))
    return entry.model_name if entry is not None else str(kind)


def run_labels(runs: Sequence[Run]) -> list[str]:
    """A legend label per run: its model and the flags whose values differ between the
    runs (``DCNv2 learning_rate=0.1``; model flags only between runs of one model), then its test AUROC when it has one; runs whose
    labels would be equal are numbered, runs without a config record keep their log's
    name and run id."""
    flats = [_flat(run.config) if run.config is not None else None for run in runs]
    known = [(model_name(run), f) for run, f in zip(runs, flats) if f is not None]
    keys = list(dict.fromkeys(k for _, f in known for k in f))

    def differs(key: str, model: str | None = None) -> bool:
        return len({repr(f.get(key)) for name, f in known if model in (None, name)}) > 1

    # The model sections of a DLRM and a DCNv2 run differ by the entry points' own
    # defaults: between models the model's name says it, within one model they are named.
    differing = [
        k
        for k in keys
        if (differs(k) and not k.startswith("model.")) or any(differs(k, name) for name in {name for name, _ in known})
    ]
    # A list that differs (table rows) usually follows from a scalar that differs
    # (max_table_rows): the lists are named only when no scalar differs.
    scalars = [k for k in differing if not any(isinstance(f.get(k), list) for _, f in known)]
    differing = scalars or differing
    labels = []
    for run, flat in zip(runs, flats):
        if flat is None:
            labels.append(run.label)
            continue
        shown = [f"{k.rsplit('.', 1)[-1]}={_value_text(flat.get(k))}" for k in differing[:MAX_LABEL_FLAGS]]
        if len(differing) > MAX_LABEL_FLAGS:
            shown.append(f"+{len(differing) - MAX_LABEL_FLAGS} more")
        labels.append(" ".join([model_name(run)] + shown))
    for label in set(labels):
        same = [i for i, other in enumerate(labels) if other == label]
        if len(same) > 1:
            for number, i in enumerate(same, 1):
                labels[i] = f"{label} #{number}"
    return [
        label
        + (
            f" (test AUROC {run.test['auroc']:.4f}"
            + (f", {run.test_model.text()}" if run.test_model is not None else "")
            + ")"
            if "auroc" in run.test
            else ""
        )
        for label, run in zip(labels, runs)
    ]


def has_windows(runs: Sequence[Run]) -> bool:
    """Whether a run evaluated rolling windows (the figure then has a third row)."""
    return any(run.window_auroc for run in runs)


def draw_panels(fig: object, axes: object, runs: Sequence[Run]) -> None:
    """`draw`'s panels on a 2 x 3 grid of axes (3 x 3 with `has_windows`), with one
    legend for the figure under them."""
    panels = [
        ("loss", "training loss"),
        ("lr", "learning rate"),
        ("records_per_sec", "records/s"),
        ("validation_auroc", "validation AUROC"),
        ("validation_ne", "validation normalized entropy"),
        ("validation_calibration", "validation calibration\n(predicted / clicks)"),
    ]
    if has_windows(runs):
        panels += [
            ("window_auroc", "AUROC of each window"),
            ("window_ne", "NE of each window"),
            ("window_calibration", "calibration of each window"),
        ]
    limits = loss_limits(runs)
    labels = run_labels(runs)
    for ax, (attr, title) in zip(axes.flat, panels):
        for run, label in zip(runs, labels):
            points = getattr(run, attr)
            ax.plot(
                [p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 30 else None, label=label
            )
        ax.set_title(title, fontsize="medium")
        if attr == "loss" and limits is not None:
            ax.set_ylim(*limits)
            ax.set_title(f"{title}\n(outliers off the range)", fontsize="medium")
        if attr.startswith("window_"):
            ax.set_xlabel("window (trained on the windows before it)")
            ax.xaxis.get_major_locator().set_params(integer=True)
        else:
            ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(
        handles,
        names,
        loc="lower center",
        bbox_to_anchor=(0.5, FOOTER_HEIGHT),
        ncol=legend_columns(names),
        fontsize="small",
        frameon=False,
    )


def legend_columns(labels: Sequence[str]) -> int:
    return 2 if max(map(len, labels), default=0) <= TWO_COLUMN_LABEL else 1


def legend_height(labels: Sequence[str]) -> float:
    """The fraction of the figure's height the legend under the panels takes."""
    return LEGEND_ROW_HEIGHT * (-(-len(labels) // legend_columns(labels)))


def draw(runs: Sequence[Run], output: str) -> None:
    """Writes a 2 x 3 chart (3 x 3 with rolling windows) to ``output`` (PNG), under a
    temporary name first."""
    rows = 3 if has_windows(runs) else 2
    width, height = FIGURE_INCHES
    with png_figure(
        output,
        rows,
        3,
        bottom=legend_height(run_labels(runs)) * 2 / rows,
        figsize=(width, height * rows / 2),
        dpi=FIGURE_DPI,
    ) as (fig, axes):
        draw_panels(fig, axes, runs)


PROG = "training.report"


@cli_main(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", help="JSON-lines logs written with --log_path")
    parser.add_argument(
        "--output", default="run.png", help="PNG to write (1200 x 800; 1200 x 1200 with rolling windows)"
    )
    args = parser.parse_args(argv)
    runs = [run for path in args.logs for run in read_runs(path)]
    try:
        draw(runs, args.output)
    except OSError as e:
        raise BadInput(f"--output {args.output}: cannot write it: {e.strerror}") from e
    for run in runs:
        s = run.summary()
        auroc = (
            "n/a"
            if s["best_validation_auroc"] is None
            else f"{s['best_validation_auroc']:.4f} at step {s['best_step']}"
        )
        rate = "n/a" if s["mean_records_per_sec"] is None else f"{s['mean_records_per_sec']:,.0f}"
        total = "n/a" if s["total_seconds"] is None else f"{s['total_seconds']:.1f} s"
        window = (
            ""
            if run.exported_window is None
            else f" | the model export takes: window {run.exported_window[0]}'s (step {run.exported_window[1]})"
        )
        print(
            f"{s['run']}: {s['steps']} steps | best validation AUROC {auroc} | {run.tests_text()}{window} | "
            f"mean records/s (after warm-up) {rate} | total time {total}"
        )
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
