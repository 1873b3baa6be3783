"""The benchmarks' flags, declared on config dataclasses (common/config_flags.py): every
bench's --help (and the matrix's) offers exactly its config classes' flags, and every
flag parses into its field and nothing else. The benches and their classes are found,
not listed: a new bench is checked as it lands."""

import contextlib
import dataclasses
import importlib
import io
import os
import re

import pytest

from common.cli import OneLineParser
from common.config_flags import add_flags, config_values, flags_of
from harness import matrix
from tests.support.flag_values import other_value

BENCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
BENCHES = sorted(
    f"bench.{name[:-3]}" for name in os.listdir(BENCH_DIR) if name.endswith(".py") and name != "__init__.py"
)
# Flag classes a CLI takes from another module, and parsers that are not one of
# `parse_flags`' (the matrix's give every flag a parser default, --strength its own).
BORROWED = {"bench.gpu_check": [matrix.MatrixFlags]}
PARSERS = {
    "bench.gpu_check": lambda: importlib.import_module("bench.gpu_check").parser(),
    "harness.matrix.command": lambda: matrix.matrix_parser("python -m harness.matrix", "The matrix.", strength=3),
}
_OPTION = re.compile(r"^  (-[-\w]+)")


def flag_classes(module_name: str) -> list[type]:
    """The config classes whose flags the CLI takes: those it declares (dataclasses
    with flag fields), then those it borrows."""
    module = importlib.import_module(module_name)
    own = [
        c
        for c in vars(module).values()
        if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == module_name and flags_of(c)
    ]
    return own + BORROWED.get(module_name, [])


def parse(module_name: str, argv: list[str]) -> list:
    """The CLI's configs of a command line, one per flag class."""
    classes = flag_classes(module_name)
    if module_name in PARSERS:
        parser = PARSERS[module_name]()
    else:
        parser = OneLineParser(prog=module_name)
        for config_class in classes:
            add_flags(parser, config_class)
    args = parser.parse_args(argv)
    return [c(**config_values(c, args)) for c in classes]


def _required(classes: list[type]) -> list[str]:
    return [
        text for c in classes for item in flags_of(c) if item.required for text in (item.option, f"/some/{item.name}")
    ]


# The matrix CLI: `python -m harness.matrix` runs the main (and flags) of its command module.
CLIS = BENCHES + ["harness.matrix.command"]


def test_every_bench_declares_its_flags():
    assert "bench.train_throughput" in BENCHES
    assert [c.__name__ for c in flag_classes("bench.gpu_check")] == ["GpuCheckFlags", "MatrixFlags"]
    assert all(flag_classes(name) for name in CLIS)


@pytest.mark.parametrize("module_name", CLIS)
def test_help_offers_exactly_the_config_classes_flags(module_name):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        importlib.import_module(module_name).main(["--help"])
    assert done.value.code == 0
    offered = {m.group(1) for line in out.getvalue().splitlines() for m in [_OPTION.match(line)] if m}
    declared = {item.option for c in flag_classes(module_name) for item in flags_of(c)}
    assert offered - {"-h", "--version"} == declared


@pytest.mark.parametrize(
    "module_name, config_class, item",
    [(name, c, item) for name in CLIS for c in flag_classes(name) for item in flags_of(c) if not item.required],
    ids=lambda v: getattr(v, "option", getattr(v, "__name__", v)),
)
def test_every_bench_flag_parses_into_its_field_and_nothing_else(module_name, config_class, item):
    classes = flag_classes(module_name)
    required = _required(classes)
    defaults = parse(module_name, required)
    index = classes.index(config_class)
    value, text = other_value(item, getattr(defaults[index], item.field.name))
    if item.is_repeated:  # each --name VALUE adds an item
        value = [text[0]]
    expected = list(defaults)
    expected[index] = dataclasses.replace(defaults[index], **{item.field.name: value})
    assert parse(module_name, [*required, item.option, *text]) == expected


@pytest.mark.parametrize("module_name", ["bench.gpu_check", "harness.matrix.command"])
def test_the_matrix_default_strength_is_the_cli_s(module_name):
    classes = flag_classes(module_name)
    config = parse(module_name, [])[classes.index(matrix.MatrixFlags)]
    assert config == matrix.MatrixFlags(strength=2 if module_name == "bench.gpu_check" else 3)
