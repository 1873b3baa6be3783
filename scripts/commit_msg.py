"""Checks a commit message: a subject of at most 72 characters, then a blank line and a
body saying why (docs/tests.md, "Checks"). The commit-msg hook of
.pre-commit-config.yaml runs it on the message file git hands it::

    python -m scripts.commit_msg .git/COMMIT_EDITMSG

Exit 1 with one line per problem (the commit is refused), 0 when the message is fine.
Lines git strips (``#`` comments, everything below the ``--verbose`` scissors line) are
not part of the message. Merge commits and ``fixup!``/``squash!`` commits, which git
writes or folds away, need no body.
"""

import sys

from common.cli import OneLineParser

MAX_SUBJECT = 72
_SCISSORS = "# ------------------------ >8 ------------------------"
_NO_BODY_NEEDED = ("Merge ", "Revert ", "fixup! ", "squash! ", "amend! ")


def message_lines(text: str) -> list[str]:
    """The message as git records it: without comment lines, what follows the scissors
    line, and blank lines at either end."""
    lines = []
    for line in text.splitlines():
        if line == _SCISSORS:
            break
        if not line.startswith("#"):
            lines.append(line.rstrip())
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def problems(text: str) -> list[str]:
    """What is wrong with the commit message ``text`` (empty: nothing)."""
    lines = message_lines(text)
    if not lines:
        return ["the message is empty"]
    subject = lines[0]
    found = []
    if len(subject) > MAX_SUBJECT:
        found.append(
            f"the subject is {len(subject)} characters, at most {MAX_SUBJECT}: "
            "say the change in short, the details go in the body"
        )
    if len(lines) > 1 and lines[1]:
        found.append("the subject is followed by a second line: leave a blank line before the body")
    if len(lines) == 1 and not subject.startswith(_NO_BODY_NEEDED):
        found.append("no body: after a blank line, say why the change is made")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="commit_msg", description=__doc__.split("\n\n")[0])
    parser.add_argument("message_file", help="the file holding the commit message (git's COMMIT_EDITMSG)")
    args = parser.parse_args(argv)
    try:
        with open(args.message_file, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        print(f"commit_msg: error: {args.message_file}: cannot read the message: {e.strerror}", file=sys.stderr)
        return 2
    except UnicodeDecodeError:
        print(f"commit_msg: error: {args.message_file}: the message is not UTF-8 text", file=sys.stderr)
        return 2
    found = problems(text)
    for problem in found:
        print(f"commit_msg: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
