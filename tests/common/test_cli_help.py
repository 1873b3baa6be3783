"""Every command-line tool a user runs answers --help with a meaning for each of its flags."""

import re

import pytest

from tests.support.cli_modules import main_modules, run_as_main

# Every module that runs as a program, found from its code (a `__main__` block or a
# package's __main__.py), so a new command line is checked without being listed here.
PROGRAMS = main_modules()


def help_of(target: str, argv: list[str], monkeypatch, capsys) -> str:
    """The --help text of ``python -m target *argv --help``, which must exit 0."""
    capsys.readouterr()
    assert run_as_main(target, [*argv, "--help"], monkeypatch) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:"), out
    return out


def subcommands(help_text: str) -> list[str]:
    """The subcommands an argparse --help lists: the choices of a positional written
    `{a,b}` in its "positional arguments" section (an option's choices are in "options")."""
    section = re.search(r"^positional arguments:\n((?:  .*\n?)*)", help_text, re.MULTILINE)
    found = re.findall(r"^  \{([\w,-]+)\}", section.group(1), re.MULTILINE) if section else []
    return [name for choices in found for name in choices.split(",")]


def options_without_help(help_text: str) -> list[str]:
    """The options of an argparse --help whose line has no text after them and whose next
    line is no continuation (argparse indents help text well past the options' 2 spaces)."""
    lines = help_text.splitlines()
    missing = []
    for i, line in enumerate(lines):
        if not line.startswith("  -"):
            continue
        spec, _, rest = line.strip().partition("  ")
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if not rest.strip() and not following.startswith(" " * 6):
            missing.append(spec)
    return missing


def test_options_without_help_finds_them():
    text = "options:\n  -h, --help  show this\n  --seed SEED\n  --rows ROWS\n                        rows per day\n"
    assert options_without_help(text) == ["--seed SEED"]


def test_subcommands_are_found():
    text = (
        "usage: x [-h] {plan,sweep} ...\n\npositional arguments:\n  {plan,sweep}\n    plan      one\n\n"
        "options:\n  --format {fp32,aoti}\n"
    )
    assert subcommands(text) == ["plan", "sweep"]
    assert subcommands("usage: x [-h] [--format {a,b}]\n\noptions:\n  --format {a,b}\n") == []


def test_the_programs_are_found():
    """Positive control of the search: the entry points, each package's programs (the
    one a hand-written list once missed among them) and the `python -m PACKAGE` ones."""
    assert {
        "dlrm_main",
        "dcnv2_main",
        "training.lr_finder",
        "serving.export",
        "data.transcode",
        "sharding_plans",
        "sweeps",
        "scripts.wheelhouse",
        "bench.gpu_check",
        "harness.matrix",
    } <= set(PROGRAMS)
    assert not any(name.startswith("tests") or name.endswith("__init__") for name in PROGRAMS)


def test_the_subcommands_of_the_tree_are_found(monkeypatch, capsys):
    """Positive control on the real programs: the subcommands the old list named by hand."""
    assert {"plan"} <= set(subcommands(help_of("sharding_plans", [], monkeypatch, capsys)))
    assert {"run"} <= set(subcommands(help_of("sweeps", [], monkeypatch, capsys)))
    assert {"build"} <= set(subcommands(help_of("scripts.wheelhouse", [], monkeypatch, capsys)))


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # runpy re-runs imported modules
@pytest.mark.parametrize("target", PROGRAMS)
def test_every_flag_has_help(target, monkeypatch, capsys):
    """`python -m TARGET --help` (and `TARGET SUB --help` for each of its subcommands)
    exits 0 with a usage and a meaning for every option, and no default shown as None."""
    texts = {"": help_of(target, [], monkeypatch, capsys)}
    texts.update((sub, help_of(target, [sub], monkeypatch, capsys)) for sub in subcommands(texts[""]))
    for sub, text in texts.items():
        assert options_without_help(text) == [], sub
        # an option with no default says what happens without it (tests/serving/test_serve_help.py: serve's)
        assert "(default: None)" not in " ".join(text.split()), sub
