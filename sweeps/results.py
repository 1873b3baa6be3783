"""A sweep's results: one row per run from its JSON-lines log and its table memory,
written as ``results.md``, ``results.csv`` and ``results.png`` in the sweep directory.
results.md ranks the runs by validation AUROC (results.csv keeps the sweep's order);
with ``seeds`` it first shows each configuration's mean and standard deviation.

The columns follow the public TorchRec DLRM example's results table (ranks instead of
GPUs), plus the log loss, which model the AUROCs are of (``model``: ``best, step 38, the
one export takes``, from the run's last test record: the model the run delivers), the
peak memory of the largest rank, the planner's memory estimate for the rank it loads
most beside what that rank's tables took (the run log's ``plan_memory`` record) and
the run's state.
Every file is written under a temporary name and renamed when complete.

Example::

    rows = collect_rows(read_runs("sweeps/table_sizes"))
    write_results("sweeps/table_sizes", rows)
"""

import csv
import io
import os
import shlex
import statistics
from collections.abc import Sequence
from typing import Any

from common.atomic import write_text
from common.byte_sizes import GIB
from common.errors import BadInput
from common.png_figure import png_figure
from common.run_log_file import TestedModel, read_run_log
from sweeps.run_state import FAILED, RunRecord
from sweeps.spec import value_text
from sweeps.table_memory import table_memory
from training.failures import EXIT_DIVERGED, EXIT_NON_FINITE_LOSS

# A failed run that ended with one of these exit codes diverged (a NaN loss, or figures
# no better than a constant predictor's): its row's state says so, not "failed".
DIVERGED = "diverged"
_DIVERGED_CODES = (EXIT_NON_FINITE_LOSS, EXIT_DIVERGED)

COLUMNS = (
    "run",
    "state",
    "table_gib",
    "planner_gib",
    "planned_rank_gib",
    "built_rank_gib",
    "ranks",
    "local_batch_size",
    "global_batch_size",
    "val_auroc",
    "test_auroc",
    "test_log_loss",
    "model",
    "records_per_sec",
    "train_seconds",
    "peak_memory_bytes",
    "flags",
)
# results.md headings (the public example's wording where it has one).
_HEADINGS = {
    "run": "Run",
    "state": "State",
    "table_gib": "Size of embedding tables (GiB)",
    "planner_gib": "Planner estimate (GiB)",
    "planned_rank_gib": "Planner estimate, largest rank (GiB)",
    "built_rank_gib": "Tables measured, that rank (GiB)",
    "ranks": "Ranks",
    "local_batch_size": "Local batch size",
    "global_batch_size": "Global batch size",
    "val_auroc": "AUROC over val set",
    "test_auroc": "AUROC over test set",
    "test_log_loss": "Test log loss",
    "model": "Model of these AUROCs",
    "records_per_sec": "Train records/second",
    "train_seconds": "Time to train (s)",
    "peak_memory_bytes": "Peak memory per rank (GiB)",
    "flags": "Unique flags",
}
# results.md ranks runs (and configurations) by this validation metric, higher first.
RANK_COLUMN = "val_auroc"
# The metrics a configuration repeated over seeds shows as mean ± standard deviation.
SEED_COLUMNS = ("val_auroc", "test_auroc", "test_log_loss")
FIGURE_INCHES = (12.0, 5.0)
FIGURE_DPI = 100


class ResultsError(BadInput):
    """A run's log is not one the trainer wrote; the message names the file and line."""


def read_log(path: str) -> list[dict[str, Any]]:
    """The records of the last attempt in a run's log (a restarted job appends a new
    ``run_id``); empty when there is no log yet."""
    if not os.path.exists(path):
        return []
    records = read_run_log(path, ResultsError, required=("event", "run_id"))
    configs = [r for r in records if r["event"] == "config"]
    if not configs:
        return []
    last = configs[-1]["run_id"]
    return [r for r in records if r["run_id"] == last]


def _last(records: list[dict[str, Any]], event: str, stage: str | None = None) -> dict[str, Any] | None:
    matching = [r for r in records if r["event"] == event and (stage is None or r.get("stage") == stage)]
    return matching[-1] if matching else None


def _flags_text(record: RunRecord) -> str:
    return shlex.join([part for name, value in record.grid_values.items() for part in (f"--{name}", value_text(value))])


def run_state(record: RunRecord) -> str:
    """The run's state, ``diverged`` for a run that failed by diverging."""
    return DIVERGED if record.state == FAILED and record.exit_code in _DIVERGED_CODES else record.state


def collect_row(record: RunRecord) -> dict[str, Any]:
    """One results row: what the run's log says (blank where it says nothing yet)."""
    records = read_log(record.log_path)
    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(run=record.name, state=run_state(record), ranks=record.ranks, flags=_flags_text(record))
    config = _last(records, "config")
    if config is not None:
        memory = table_memory(config, record.ranks_per_node, record.directory)
        row.update(
            table_gib=memory.weight_bytes / GIB,
            planner_gib=memory.planner_bytes / GIB,
            ranks=config["world_size"],
            local_batch_size=config["data"]["batch_size"],
            global_batch_size=config["data"]["batch_size"] * config["world_size"],
        )
    plan_memory = _last(records, "plan_memory")
    if plan_memory is not None and plan_memory.get("estimated_bytes"):
        # The rank the plan loads most, and what its tables took (training/plan_memory.py).
        estimated, built = plan_memory["estimated_bytes"], plan_memory["built_bytes"]
        largest = max(range(len(estimated)), key=estimated.__getitem__)
        row.update(planned_rank_gib=estimated[largest] / GIB, built_rank_gib=built[largest] / GIB)
    # The last test is of the model the run delivers (a run that kept a best model tests
    # it after its final weights); the validation AUROC is that model's too, so the row
    # ranks the model export takes, and "model" says which it is.
    test = _last(records, "eval", "test")
    tested = None if test is None else TestedModel.of_record(test, ResultsError, f"{record.log_path}: its last test")
    validations = [r for r in records if r["event"] == "eval" and r.get("stage") == "validation"]
    same_model = [r for r in validations if tested is not None and r.get("step") == tested.step]
    validation = (same_model or validations or [None])[-1]
    if validation is not None:
        row["val_auroc"] = validation.get("auroc")
    if test is not None:
        row.update(
            test_auroc=test.get("auroc"),
            test_log_loss=test.get("log_loss"),
            model=tested.text() if tested is not None else None,
        )
    summary = _last(records, "summary")
    if summary is not None:
        row.update(
            records_per_sec=summary.get("records_per_sec"),
            train_seconds=summary.get("train_seconds"),
            peak_memory_bytes=max(summary.get("peak_memory_bytes") or [0]) or None,
        )
    return row


def collect_rows(records: Sequence[RunRecord]) -> list[dict[str, Any]]:
    return [collect_row(r) for r in records]


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if column in ("table_gib", "planner_gib", "planned_rank_gib", "built_rank_gib"):
        return f"{value:.4g}"
    if column in ("val_auroc", "test_auroc", "test_log_loss"):
        return f"{value:.4f}"
    if column == "records_per_sec":
        return f"{value:,.0f}"
    if column == "train_seconds":
        return f"{value:.1f}"
    if column == "peak_memory_bytes":
        return f"{value / GIB:.2f}"
    if column == "flags":
        return f"`{value}`" if value else "-"
    return str(value)


def ranked(rows: Sequence[dict[str, Any]], column: str = RANK_COLUMN) -> list[dict[str, Any]]:
    """Rows by ``column``, highest first; rows without it (failed, unfinished) last, in
    run order."""
    return sorted(rows, key=lambda row: (row[column] is None, -(row[column] or 0.0)))


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def format_seed_table(rows: Sequence[dict[str, Any]], records: Sequence[RunRecord]) -> str:
    """One line per configuration repeated over seeds: how many of its runs have a
    result, and the mean ± sample standard deviation of each metric over them, ranked
    by the mean validation AUROC."""
    configs: dict[str, list[dict[str, Any]]] = {}
    for row, record in zip(rows, records):
        configs.setdefault(record.config or record.name, []).append(row)
    summaries = []
    for config, members in configs.items():
        values = {c: [row[c] for row in members if row[c] is not None] for c in SEED_COLUMNS}
        rank_values = values[RANK_COLUMN]
        summaries.append(
            {
                "config": config,
                "runs": f"{len(rank_values)}/{len(members)}",
                "rank": statistics.mean(rank_values) if rank_values else None,
                "cells": [_mean_std(values[c]) for c in SEED_COLUMNS],
            }
        )
    lines = [
        "| Configuration | Runs with results | "
        + " | ".join(_HEADINGS[c] + " (mean ± sd)" for c in SEED_COLUMNS)
        + " |",
        "|" + "|".join("---" for _ in range(2 + len(SEED_COLUMNS))) + "|",
    ]
    for summary in ranked(summaries, "rank"):
        lines.append("| " + " | ".join([summary["config"], summary["runs"], *summary["cells"]]) + " |")
    return "\n".join(lines) + "\n"


def format_markdown(rows: Sequence[dict[str, Any]], records: Sequence[RunRecord]) -> str:
    """With seeds, the configurations' mean and standard deviation first; then every
    run, ranked by validation AUROC; then one line per failed or diverged run (exit code
    and error)."""
    lines = []
    if any(r.config for r in records):
        lines += [format_seed_table(rows, records).rstrip("\n"), ""]
    lines += ["| " + " | ".join(_HEADINGS[c] for c in COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(_cell(c, row[c]).replace("|", "\\|") for c in COLUMNS) + " |" for row in ranked(rows)]
    failures = [r for r in records if r.state == FAILED]
    if failures:
        lines.append("")
        lines += [
            f"- {r.name} {'diverged' if run_state(r) == DIVERGED else 'failed'} "
            f"(exit code {r.exit_code if r.exit_code is not None else 'unknown'}): {r.error}"
            for r in failures
        ]
    return "\n".join(lines) + "\n"


def format_csv(rows: Sequence[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: "" if row[c] is None else row[c] for c in COLUMNS})
    return buffer.getvalue()


# Table sizes spanning less than this ratio are drawn on a linear axis: a log axis would
# show no labelled decade between them.
LOG_AXIS_MIN_RATIO = 10.0


def point_label(run_name: str) -> str:
    """A run's point label: its grid values (or the names the sweep file gives them)
    without the ``key=`` the axis title already says (``max_table_rows=100`` -> ``100``)."""
    return ", ".join(part.split("=", 1)[-1] for part in run_name.split(","))


def grid_keys(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The grid keys the runs' names are made of, in order (``max_table_rows``)."""
    keys: list[str] = []
    for row in rows:
        for part in row["run"].split(","):
            key = part.split("=", 1)[0]
            if "=" in part and key not in keys:
                keys.append(key)
    return keys


def draw_panels(axes: Sequence[Any], rows: Sequence[dict[str, Any]]) -> None:
    """Test AUROC and records/s against total table memory, one point per run that has
    both numbers, named by its grid values.

    The memory axis is logarithmic (decades labelled, no minor labels) when the sizes
    span `LOG_AXIS_MIN_RATIO` or more, linear otherwise; the records/s axis starts at 0,
    so the noise of a busy machine does not read as a trend.
    """
    import matplotlib.ticker as ticker

    sizes = [row["table_gib"] for row in rows if row["table_gib"]]
    log_axis = bool(sizes) and max(sizes) / min(sizes) >= LOG_AXIS_MIN_RATIO
    keys = grid_keys(rows)
    for ax, column, label in ((axes[0], "test_auroc", "test AUROC"), (axes[1], "records_per_sec", "train records/s")):
        points = [
            (row["table_gib"], row[column], point_label(row["run"]))
            for row in rows
            if row["table_gib"] and row[column] is not None
        ]
        ax.plot([p[0] for p in points], [p[1] for p in points], "o")
        for x, y, name in points:
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize="small")
        if log_axis:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.margins(x=0.25)  # room for the labels of the outermost points
        ax.set_xlabel("embedding tables, all ranks (GiB" + (", log scale)" if log_axis else ")"))
        ax.set_ylabel(label)
        if column == "records_per_sec":
            ax.set_ylim(bottom=0, top=1.15 * max([p[1] for p in points], default=1.0))
            ax.yaxis.set_major_formatter(ticker.StrMethodFormatter("{x:,.0f}"))
        if keys:
            ax.set_title(f"points named by {', '.join(keys)}", fontsize="medium")
        ax.grid(alpha=0.3, which="major")


def draw(rows: Sequence[dict[str, Any]], path: str, title: str) -> None:
    """Writes `draw_panels` side by side to ``path`` (PNG), titled ``title``."""
    with png_figure(path, 1, 2, figsize=FIGURE_INCHES, dpi=FIGURE_DPI) as (fig, axes):
        draw_panels(axes, rows)
        fig.suptitle(title)


def write_results(output_dir: str, records: Sequence[RunRecord], title: str = "") -> str:
    """Writes results.md, results.csv and results.png; returns the markdown table."""
    rows = collect_rows(records)
    markdown = format_markdown(rows, records)
    write_text(os.path.join(output_dir, "results.md"), markdown)
    write_text(os.path.join(output_dir, "results.csv"), format_csv(rows))
    draw(rows, os.path.join(output_dir, "results.png"), title or os.path.basename(output_dir.rstrip("/")))
    return markdown
