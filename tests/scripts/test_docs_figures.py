"""Every image docs/ shows comes from a command the repository runs: listed in
scripts/docs_figures.py, run by `make docs-figures`, dated beside the image."""

import os
import re

from scripts import docs_figures
from scripts.docs_figures import FIGURES, caption, image_references, with_captions

DATE = r"\d{4}-\d{2}-\d{2}"


def _pages():
    for name in sorted(os.listdir("docs")):
        if name.endswith(".md"):
            with open(os.path.join("docs", name)) as f:
                yield name, f.read()


def test_every_docs_image_is_drawn_by_a_listed_command_and_dated():
    shown = set()
    for name, text in _pages():
        lines = text.splitlines()
        for index, image in image_references(text):
            assert image in FIGURES, f"docs/{name}: {image} is drawn by no command of scripts/docs_figures.py"
            below = lines[index + 1] if index + 1 < len(lines) else ""
            date = re.search(DATE, below)
            assert date and below == caption(image, date.group()), f"docs/{name}: {image} has no caption line"
            assert os.path.exists(os.path.join("docs", image))
            shown.add(image)
    assert shown == set(FIGURES)  # and nothing listed that the docs do not show


def test_make_docs_figures_runs_the_list():
    with open("Makefile") as f:
        makefile = f.read()
    target = re.search(r"^docs-figures:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert target and "-m scripts.docs_figures" in target.group(1)


def test_captions_are_written_then_replaced():
    text = "intro\n![chart](plan_memory.png)\nmore\n"
    once = with_captions(text, ["plan_memory.png"], "2026-01-02")
    assert once.splitlines()[2] == caption("plan_memory.png", "2026-01-02")
    twice = with_captions(once, ["plan_memory.png"], "2026-03-04")
    assert twice.splitlines()[1:4] == ["![chart](plan_memory.png)", caption("plan_memory.png", "2026-03-04"), "more"]
    assert "drawn 2026-03-04 by `make docs-figures`: `python -m sharding_plans plan --preset mlperf" in twice


def test_an_unknown_figure_is_refused(capsys):
    assert docs_figures.main(["nosuch.png"]) == 2
    assert capsys.readouterr().err.startswith("unknown figure nosuch.png (known: sweep_table_sizes.png")
