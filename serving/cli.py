"""The parser of every serving command, under its home name or its old one.

``python -m training.export`` (and predict, quality_gate, serve) ran these commands
before serving had its own package; those names stay for one release as aliases
whose ``--help`` says where the command moved.

Example::

    parser = serving_parser("export", __doc__)              # python -m serving.export
    parser = serving_parser("export", __doc__, alias=True)  # python -m training.export
"""

from common.cli import DefaultsHelpFormatter, OneLineParser

ALIAS_PACKAGE = "training"


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
