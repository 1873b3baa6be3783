"""The command lines the docs show, read from their ```bash blocks, so that tests run
what a reader copies (and fail when the docs drift from what works)."""

import os
import shlex
from typing import List

from tests.support.launch import REPO


def bash_commands(page: str) -> List[List[str]]:
    """Every command of the ```bash blocks of ``page`` (a path relative to the
    repository root), as argv lists (see `markdown_commands`)."""
    with open(os.path.join(REPO, page)) as f:
        return markdown_commands(f.read())


def markdown_commands(text: str) -> List[List[str]]:
    """Every command of the ```bash blocks of markdown ``text``, as argv lists:
    continuation lines joined, comments dropped, ``a && b`` split into two commands."""
    commands: List[List[str]] = []
    for block in text.split("```bash\n")[1:]:
        script = block.split("```", 1)[0].replace("\\\n", " ")
        for line in script.splitlines():
            words = shlex.split(line, comments=True)
            while "&&" in words:
                commands.append(words[:words.index("&&")])
                words = words[words.index("&&") + 1:]
            if words:
                commands.append(words)
    return commands


def commands_starting(page: str, *prefix: str) -> List[List[str]]:
    """The commands of ``page`` whose first words are ``prefix``."""
    return [argv for argv in bash_commands(page) if argv[:len(prefix)] == list(prefix)]


def replaced(argv: List[str], replacements: dict) -> List[str]:
    """``argv`` with whole words replaced (a documented path by a test's)."""
    return [replacements.get(word, word) for word in argv]


def with_flags(argv: List[str], flags: List[str]) -> List[str]:
    """``argv`` with ``flags`` (``--name value`` pairs) set: a flag it already has takes
    the new value in place, the others are appended (torchx refuses a repeated flag)."""
    result, extra = list(argv), []
    for name, value in zip(flags[::2], flags[1::2]):
        if name in result:
            result[result.index(name) + 1] = value
        else:
            extra += [name, value]
    return result + extra


def without_flags(argv: List[str], *names: str) -> List[str]:
    """``argv`` without the flags ``names`` and their values (what this machine lacks,
    such as a GPU's memory)."""
    kept: List[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word in names:
            skip = True
        else:
            kept.append(word)
    return kept
