"""Generated blocks in documentation files: text between two marker lines that a
script writes and a test checks.

    text = replace_block(text, BEGIN, END, tables())
    sys.exit(main("docs tables", path, BEGIN, END, tables, "python scripts/x.py --write"))
"""

import os
import sys
from collections.abc import Callable

from common.atomic import write_text
from common.cli import OneLineParser
from common.errors import BadInput


def replace_block(text: str, begin: str, end: str, content: str) -> str:
    """``text`` with what lies between the markers replaced by ``content``.

    Raises ValueError when a marker is missing.
    """
    if begin not in text or end not in text:
        raise BadInput(f"the markers {begin!r} ... {end!r} are missing")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{content}\n{end}{tail}"


def update_file(path: str, begin: str, end: str, content: str, check: bool, command: str = "") -> int:
    """Writes the block into ``path`` (through a temporary file), or with ``check``
    only compares; returns 1 when the file is out of date under ``check``, else 0."""
    with open(path) as f:
        current = f.read()
    updated = replace_block(current, begin, end, content)
    if check:
        if updated != current:
            print(f"{path} is out of date: run {command}", file=sys.stderr)
            return 1
        return 0
    write_text(path, updated)
    return 0


def main(description: str, path: str, begin: str, end: str, generate: Callable[[], str], command: str) -> int:
    """The generators' command line: print the block, ``--write`` it into ``path`` or
    ``--check`` it (exit 1 when out of date)."""
    parser = OneLineParser(description=description)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"update {os.path.basename(path)}")
    mode.add_argument("--check", action="store_true", help=f"exit 1 if {os.path.basename(path)} is out of date")
    args = parser.parse_args()
    if not (args.write or args.check):
        print(generate())
        return 0
    return update_file(path, begin, end, generate(), check=args.check, command=command)
