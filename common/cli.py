"""Command-line helpers shared by every CLI of the project (data, training, plans).

Every CLI's main goes through ``run_cli`` (or its decorator form ``cli_main``): bad
input (``common.errors.BadInput``) becomes one line ``PROG: error: MESSAGE`` on
stderr and exit code 2; any other exception keeps its traceback (exit 1).
Bad flags are one line on stderr and exit code 2 too, never a usage dump; ``--version``
prints the release:

    parser = OneLineParser(prog="python -m data.transcode")
    parser.add_argument("--chunk_size", type=positive_int, default=65536)
    parser.add_argument("--sizes", type=int_list)
    # --chunk_size 0 -> "python -m data.transcode: error: argument --chunk_size: must be positive, got 0"
"""

import argparse
import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol

from common.errors import EXIT_BAD_INPUT, BadInput
from common.url_paths import redacted_text
from common.version import VERSION

# Reports bad input of program PROG with MESSAGE; returns the exit code.
BadInputReporter = Callable[[str, str], int]


class MainFn(Protocol):
    """A CLI's ``main(argv=None)``: None reads sys.argv."""

    def __call__(self, argv: Sequence[str] | None = None) -> int: ...


def print_bad_input(prog: str, message: str) -> int:
    """Prints ``PROG: error: MESSAGE`` (a URL in it without credentials) on stderr;
    returns EXIT_BAD_INPUT."""
    print(f"{prog}: error: {redacted_text(message)}", file=sys.stderr, flush=True)
    return EXIT_BAD_INPUT


def run_cli(body: Callable[[], int], prog: str, report: BadInputReporter = print_bad_input) -> int:
    """Runs a CLI's ``body``, returning its exit code; ``BadInput`` from it becomes
    ``report(prog, message)`` (by default one line on stderr and exit code 2).

    Args:
        body: the command's work; returns its exit code.
        prog: the program name the line starts with.
        report: how to say it (the training entry points print on rank 0 only).

    Example::

        return run_cli(lambda: command(args), "python -m sweeps run")
    """
    try:
        return body()
    except BadInput as e:
        return report(prog, str(e))


def cli_main(prog: str, report: BadInputReporter = print_bad_input) -> Callable[[MainFn], MainFn]:
    """Decorates a CLI's ``main(argv)`` so that it goes through ``run_cli``.

    Example::

        @cli_main("python -m data.transcode")
        def main(argv=None) -> int: ...
    """

    def decorate(main: MainFn) -> MainFn:
        @functools.wraps(main)
        def wrapped(argv: Sequence[str] | None = None) -> int:
            return run_cli(lambda: main(argv), prog, report)

        return wrapped

    return decorate


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """--help shows each flag's default, ``(default: 8080)``, unless it has none (None,
    a required flag, an on/off switch) or its help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            action.default in (None, argparse.SUPPRESS)
            or action.required
            or action.nargs == 0
            or "default" in text
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


class OneLineParser(argparse.ArgumentParser):
    """Reports bad flags as one line (no usage dump) and exits with 2; ``--version``
    prints the program's name and the project's release (its subcommands' parsers are
    OneLineParsers too, so theirs does as well). A flag is taken by its whole name only:
    argparse's prefixes would read ``--learning_rat 0.5`` as ``--learning_rate 0.5``
    (a typo trains), and a new flag would change what an old prefix means."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")

    def error(self, message: str) -> NoReturn:
        raise SystemExit(print_bad_input(self.prog, message))


def int_list(text: str) -> list[int]:
    """Parses "512,256,64"; rejects empty items and non-integers."""
    items = text.split(",")
    if any(not item.strip() for item in items):
        raise argparse.ArgumentTypeError(f"malformed list {text!r}: empty item")
    try:
        return [int(item) for item in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"malformed list {text!r}: expected comma-separated integers") from None


def float_list(text: str) -> list[float]:
    """Parses "0.5,1,2"."""
    try:
        return [float(item) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"malformed list {text!r}: expected comma-separated numbers") from None


def positive_int(text: str) -> int:
    """An integer above 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value
