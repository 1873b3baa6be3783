"""Release tags: each release X.Y.Z is the commit tagged ``vX.Y.Z`` (docs/tests.md,
"Releases"), where common/version.py says X.Y.Z and CHANGELOG.md's newest heading is
``## X.Y.Z (date)``.

    python -m scripts.release_tag check   # every v* tag against the files it tags
    python -m scripts.release_tag tag     # tags HEAD with its version (make release-tag)

``check`` exits 1 with one line per tag that disagrees; ``tag`` refuses (exit 2, one
line) a tree with uncommitted changes, a changelog whose newest heading is another
version (or "Unreleased"), or a version already tagged.
"""

import ast
import re
import subprocess
import sys

from common.cli import OneLineParser

TAG_PATTERN = re.compile(r"v(\d+\.\d+\.\d+)")
VERSION_FILE = "common/version.py"
CHANGELOG = "CHANGELOG.md"


class ReleaseError(Exception):
    pass


def _git(repo: str, *args: str) -> str:
    proc = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)}: {proc.stderr.strip() or f'exit code {proc.returncode}'}")
    return proc.stdout


def version_in(source: str) -> str | None:
    """The string assigned to ``VERSION`` in a version.py's text, read without running it."""
    for node in ast.parse(source).body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["VERSION"]
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    return None


def changelog_version(text: str) -> str | None:
    """The version of CHANGELOG.md's newest ``## `` heading (None: "Unreleased" or none)."""
    for line in text.splitlines():
        if line.startswith("## "):
            match = re.fullmatch(r"## (\d+\.\d+\.\d+) \(\d{4}-\d{2}-\d{2}\)", line)
            return match.group(1) if match else None
    return None


def tag_problems(repo: str) -> list[str]:
    """One line for each ``v*`` tag that is not ``vX.Y.Z`` or whose commit's
    version.py or changelog says another version."""
    found = []
    for tag in _git(repo, "tag", "--list", "v*").split():
        match = TAG_PATTERN.fullmatch(tag)
        if match is None:
            found.append(f"{tag}: not a release tag (vX.Y.Z)")
            continue
        try:
            version = version_in(_git(repo, "show", f"{tag}:{VERSION_FILE}"))
            newest = changelog_version(_git(repo, "show", f"{tag}:{CHANGELOG}"))
        except ReleaseError as e:
            found.append(f"{tag}: {e}")
            continue
        if version != match.group(1):
            found.append(f"{tag}: {VERSION_FILE} there says {version}")
        if newest != match.group(1):
            found.append(f"{tag}: {CHANGELOG}'s newest heading there is {newest or 'not a release'}")
    return found


def tag_head(repo: str) -> str:
    """Tags HEAD ``vX.Y.Z`` (annotated) with the version its files give; the tag's name."""
    if _git(repo, "status", "--porcelain", "--untracked-files=no").strip():
        raise ReleaseError("the tree has uncommitted changes: commit them first")
    version = version_in(_git(repo, "show", f"HEAD:{VERSION_FILE}"))
    newest = changelog_version(_git(repo, "show", f"HEAD:{CHANGELOG}"))
    if version is None or newest != version:
        raise ReleaseError(
            f"{VERSION_FILE} says {version} but {CHANGELOG}'s newest heading is "
            f"{newest or 'not a release'}: give the release its heading, ## {version} (date)"
        )
    tag = f"v{version}"
    if _git(repo, "tag", "--list", tag).strip():
        raise ReleaseError(f"{tag} exists already: a new release takes a new version (common/version.py)")
    _git(repo, "tag", "--annotate", tag, "--message", f"Release {version}")
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="release_tag", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["check", "tag"])
    parser.add_argument("--repo", default=".", help="the repository (default: the current directory)")
    args = parser.parse_args(argv)
    try:
        if args.command == "tag":
            print(f"tagged {tag_head(args.repo)}")
            return 0
        found = tag_problems(args.repo)
    except ReleaseError as e:
        print(f"release_tag: error: {e}", file=sys.stderr)
        return 2
    for problem in found:
        print(f"release_tag: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
