"""The parser of every serving command.

Example::

    parser = serving_parser("export", __doc__)  # python -m serving.export
"""

from common.cli import DefaultsHelpFormatter, OneLineParser


def serving_parser(command: str, doc: str) -> OneLineParser:
    """A one-line-error parser for ``python -m serving.<command>`` described by the
    first paragraph of ``doc``."""
    return OneLineParser(prog=f"python -m serving.{command}", description=doc.split("\n\n")[0],
                         formatter_class=DefaultsHelpFormatter)
