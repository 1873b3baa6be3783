"""Regenerates every figure in docs/ from the repository's own commands (`make docs-figures`).

    python -m scripts.docs_figures                  # every figure
    python -m scripts.docs_figures plan_memory.png  # one

`FIGURES` is the one place that says which command draws which image: the commands run
from the repository root, the PNG lands in docs/, and the line under each image's
reference in docs/*.md is rewritten to say the date and the command
(`caption`). A figure's results table, where it has one, replaces the generated block
beside it. tests/scripts/test_docs_figures.py checks that every image docs/ shows is listed here
with its caption, and that the Makefile target runs this script.

The sweep reuses the runs a previous `make sweep-example` finished (delete
runs/sweeps/table_sizes for a fresh one); the training report's log is written anew.
"""

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from common.atomic import write_text
from common.cli import OneLineParser
from common.png_figure import drawn_date
from scripts.generated_docs import replace_block

DOCS = "docs"
DATA = "data_cache/synthetic_criteo"
REPORT_LOG = "runs/docs_figures/dlrm_and_dcnv2.jsonl"
# Two short single-process runs on the default data (`make data`) written to one log.
_REPORT_RUN_FLAGS = (
    "--in_memory_binary_criteo_path",
    DATA,
    "--batch_size",
    "512",
    "--learning_rate",
    "0.05",
    "--optimizer",
    "adagrad",
    "--seed",
    "0",
    "--limit_train_batches",
    "200",
    "--validation_freq_within_epoch",
    "50",
    "--limit_val_batches",
    "20",
    "--limit_test_batches",
    "20",
    "--log_every_n_steps",
    "20",
    "--log_path",
    REPORT_LOG,
)


@dataclass(frozen=True)
class Figure:
    """One image of docs/.

    Args:
        commands: what draws it, in order (argv lists; "python" is this interpreter).
        drawn: the PNG the last command writes (copied to docs/IMAGE when elsewhere).
        table: a markdown table the commands write, copied into the page's generated
            block ``<!-- docs-figures IMAGE begin/end -->`` (None: no table).
        fresh: files removed before the commands run (a log they would append to).
    """

    commands: tuple[tuple[str, ...], ...]
    drawn: str
    table: str | None = None
    fresh: tuple[str, ...] = ()


FIGURES: dict[str, Figure] = {
    "sweep_table_sizes.png": Figure(
        commands=(("python", "-m", "sweeps", "run", "examples/sweeps/table_sizes.yaml"),),
        drawn="runs/sweeps/table_sizes/results.png",
        table="runs/sweeps/table_sizes/results.md",
    ),
    "plan_memory.png": Figure(
        commands=(("python", "-m", "sharding_plans", "plan", "--preset", "mlperf", "--chart", "docs/plan_memory.png"),),
        drawn="docs/plan_memory.png",
    ),
    "training_report.png": Figure(
        commands=(
            ("python", "dlrm_main.py") + _REPORT_RUN_FLAGS,
            ("python", "dcnv2_main.py") + _REPORT_RUN_FLAGS,
            ("python", "-m", "training.report", REPORT_LOG, "--output", "docs/training_report.png"),
        ),
        drawn="docs/training_report.png",
        fresh=(REPORT_LOG,),
    ),
    "lr_range_test.png": Figure(
        commands=(
            (
                "python",
                "-m",
                "training.lr_finder",
                "--in_memory_binary_criteo_path",
                DATA,
                "--batch_size",
                "512",
                "--optimizer",
                "adagrad",
                "--seed",
                "0",
                "--lr_min",
                "1e-4",
                "--lr_max",
                "10",
                "--lr_steps",
                "100",
                "--lr_range_output",
                "runs/lr_range_test",
            ),
        ),
        drawn="runs/lr_range_test.png",
    ),
}


def command_text(figure: Figure) -> str:
    """The figure's commands as the docs show them."""
    return " && ".join(shlex.join(command) for command in figure.commands)


def caption(image: str, date: str) -> str:
    """The line under an image's reference in the docs."""
    return f"_{image}, drawn {date} by `make docs-figures`: `{command_text(FIGURES[image])}`_"


def block_markers(image: str) -> tuple[str, str]:
    return f"<!-- docs-figures {image} begin -->", f"<!-- docs-figures {image} end -->"


def image_references(text: str) -> list[tuple[int, str]]:
    """(line index, image file name) of each markdown image in ``text``."""
    references = []
    for index, line in enumerate(text.splitlines()):
        start = line.find("](")
        if line.lstrip().startswith("![") and start != -1 and line.rstrip().endswith(")"):
            references.append((index, line.rstrip()[start + 2 : -1]))
    return references


def with_captions(text: str, images: Sequence[str], date: str) -> str:
    """``text`` with the caption line of each of ``images`` (re)written under its reference."""
    lines = text.splitlines()
    for index, image in reversed(image_references(text)):
        if image not in images:
            continue
        below = index + 1
        if below < len(lines) and lines[below].startswith(f"_{image}, drawn "):
            lines[below] = caption(image, date)
        else:
            lines.insert(below, caption(image, date))
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def draw(image: str) -> None:
    figure = FIGURES[image]
    for path in figure.fresh:
        if os.path.exists(path):
            os.remove(path)
    for command in figure.commands:
        argv = [sys.executable if part == "python" else part for part in command]
        print("+", shlex.join(command), flush=True)
        subprocess.run(argv, check=True)
    target = os.path.join(DOCS, image)
    if os.path.abspath(figure.drawn) != os.path.abspath(target):
        shutil.copyfile(figure.drawn, target)


def update_pages(images: Sequence[str], date: str) -> None:
    """Rewrites the captions (and generated tables) of ``images`` in every docs page."""
    for name in sorted(os.listdir(DOCS)):
        if not name.endswith(".md"):
            continue
        path = os.path.join(DOCS, name)
        with open(path) as f:
            text = f.read()
        updated = with_captions(text, images, date)
        for image in images:
            begin, end = block_markers(image)
            table = FIGURES[image].table
            if table is not None and begin in updated:
                with open(table) as f:
                    updated = replace_block(updated, begin, end, f.read().rstrip("\n"))
        if updated != text:
            write_text(path, updated)


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m scripts.docs_figures", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "figures",
        nargs="*",
        metavar="FIGURE",
        help=f"the figures to draw, by file name (default: all: {', '.join(FIGURES)})",
    )
    images = parser.parse_args(argv).figures or list(FIGURES)
    unknown = [image for image in images if image not in FIGURES]
    if unknown:
        print(f"unknown figure {unknown[0]} (known: {', '.join(FIGURES)})", file=sys.stderr)
        return 2
    for image in images:
        draw(image)
    update_pages(images, drawn_date())
    print(f"drew {', '.join(os.path.join(DOCS, image) for image in images)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
