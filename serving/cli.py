"""The parser of every serving command, under its home name or its old one.

``python -m training.export`` (and predict, quality_gate, serve) ran these commands
before serving had its own package; those names stay for one release as aliases
whose ``--help`` says where the command moved.

Their flags are the fields of config dataclasses (`common.config_flags`), as training's are.

Example::

    parser = serving_parser("export", __doc__)              # python -m serving.export
    parser = serving_parser("export", __doc__, alias=True)  # python -m training.export
    config, = parse_config(parser, [ExportConfig], argv)
"""

from typing import Any, Optional
from collections.abc import Sequence

from common.cli import DefaultsHelpFormatter, OneLineParser
from common.config_flags import add_flags, config_values

ALIAS_PACKAGE = "training"
# The --model flag of every command that loads a model directory.
MODEL_DIR_HELP = "a directory written by python -m serving.export"


def moved_note(command: str) -> str:
    """What an alias's ``--help`` says about ``python -m training.<command>``."""
    return f"moved to python -m serving.{command}; this alias goes away in the next release"


def serving_parser(command: str, doc: str, alias: bool = False) -> OneLineParser:
    """A one-line-error parser for ``python -m serving.<command>`` described by the
    first paragraph of ``doc``; with ``alias``, named ``python -m training.<command>``
    and with the move note first in its help."""
    summary = doc.split("\n\n")[0]
    if not alias:
        return OneLineParser(prog=f"python -m serving.{command}", description=summary,
                             formatter_class=DefaultsHelpFormatter)
    return OneLineParser(prog=f"python -m {ALIAS_PACKAGE}.{command}",
                         description=f"{moved_note(command)}. {summary}", formatter_class=DefaultsHelpFormatter)


def parse_config(parser: OneLineParser, config_classes: Sequence[type[Any]],
                 argv: Optional[Sequence[str]]) -> list[Any]:
    """Adds the flags of ``config_classes`` (`common.config_flags`, their defaults shown
    by the parser's help), parses ``argv`` and gives back one config a class."""
    for config_class in config_classes:
        add_flags(parser, config_class, parser_defaults=True)
    args = parser.parse_args(argv)
    return [config_class(**config_values(config_class, args)) for config_class in config_classes]
