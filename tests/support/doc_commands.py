"""The command lines the docs show, read from their ```bash blocks, so that tests run
what a reader copies (and fail when the docs drift from what works)."""

import os
import shlex

from harness.launch import REPO


def bash_commands(page: str) -> list[list[str]]:
    """Every command of the ```bash blocks of ``page`` (a path relative to the
    repository root), as argv lists (see `markdown_commands`)."""
    with open(os.path.join(REPO, page)) as f:
        return markdown_commands(f.read())


def markdown_commands(text: str) -> list[list[str]]:
    """Every command of the ```bash blocks of markdown ``text``, as argv lists:
    continuation lines joined, comments dropped, ``a && b`` split into two commands."""
    commands: list[list[str]] = []
    for block in text.split("```bash\n")[1:]:
        script = block.split("```", 1)[0].replace("\\\n", " ")
        for line in script.splitlines():
            words = shlex.split(line, comments=True)
            while "&&" in words:
                commands.append(words[: words.index("&&")])
                words = words[words.index("&&") + 1 :]
            if words:
                commands.append(words)
    return commands


def commands_starting(page: str, *prefix: str) -> list[list[str]]:
    """The commands of ``page`` whose first words are ``prefix``."""
    return [argv for argv in bash_commands(page) if argv[: len(prefix)] == list(prefix)]


def replaced(argv: list[str], replacements: dict) -> list[str]:
    """``argv`` with whole words replaced (a documented path by a test's)."""
    return [replacements.get(word, word) for word in argv]


def with_flags(argv: list[str], flags: list[str]) -> list[str]:
    """``argv`` with ``flags`` (``--name value`` pairs) set: a flag it already has takes
    the new value in place, the others are appended (torchx refuses a repeated flag)."""
    result, extra = list(argv), []
    for name, value in zip(flags[::2], flags[1::2]):
        if name in result:
            result[result.index(name) + 1] = value
        else:
            extra += [name, value]
    return result + extra


def without_flags(argv: list[str], *names: str) -> list[str]:
    """``argv`` without the flags ``names`` and their values (what this machine lacks,
    such as a GPU's memory)."""
    kept: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word in names:
            skip = True
        else:
            kept.append(word)
    return kept
