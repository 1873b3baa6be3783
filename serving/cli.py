"""The parser of every serving command.

Their flags are the fields of config dataclasses (`common.config_flags`), as training's are.

Example::

    parser = serving_parser("export", __doc__)  # python -m serving.export
    config, = parse_config(parser, [ExportConfig], argv)
"""

from collections.abc import Sequence
from typing import Any

from common.cli import DefaultsHelpFormatter, OneLineParser
from common.config_flags import add_flags, config_values

# The --model flag of every command that loads a model directory.
MODEL_DIR_HELP = "a directory written by python -m serving.export"


def serving_parser(command: str, doc: str) -> OneLineParser:
    """A one-line-error parser for ``python -m serving.<command>`` described by the
    first paragraph of ``doc``."""
    return OneLineParser(
        prog=f"python -m serving.{command}", description=doc.split("\n\n")[0], formatter_class=DefaultsHelpFormatter
    )


def parse_config(parser: OneLineParser, config_classes: Sequence[type[Any]], argv: Sequence[str] | None) -> list[Any]:
    """Adds the flags of ``config_classes`` (`common.config_flags`, their defaults shown
    by the parser's help), parses ``argv`` and gives back one config a class."""
    for config_class in config_classes:
        add_flags(parser, config_class, parser_defaults=True)
    args = parser.parse_args(argv)
    return [config_class(**config_values(config_class, args)) for config_class in config_classes]
