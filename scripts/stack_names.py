"""Which of the torchrec and FBGEMM names the project imports each pinned release
defines, read from the releases' wheels without installing them.

    python scripts/stack_names.py record WHEEL... > tests/support/stack_names.json
    python scripts/stack_names.py imports          # the project's imports, one a line

The project runs on three stacks (stacks/): torchrec 1.6.1, 1.8.0 and 1.9.2 over
FBGEMM 1.6.0, 1.8.0 and 1.9.0; only one is installed at a time. `record` reads each
wheel's Python sources (a module defines a name by a def, class, assignment or import
at its top level, inside ``if``/``try`` blocks included, or as a submodule) and writes,
per release, the project's imports it defines. tests/scripts/test_stack_names.py checks every
import of the project against that table, and the table against the installed release.
"""

import ast
import json
import os
import re
import sys
import zipfile

# Run as a script: the repository, where common/ is, goes on the path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.cli import OneLineParser

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("torchrec", "fbgemm_gpu")
TABLE_VERSION = 1
_SKIP_DIRS = {".git", "node_modules", "__pycache__", "data_cache", "runs"}


def project_imports(repo: str = REPO) -> set[str]:
    """``module:name`` for each ``from module import name`` and ``module:`` for each
    ``import module`` of torchrec or fbgemm_gpu in the project's Python files."""
    found: set[str] = set()
    for root, dirs, files in os.walk(repo):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.startswith(".venv") and d != "wheelhouse"]
        for name in files:
            if not name.endswith(".py"):
                continue
            with open(os.path.join(root, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.ImportFrom)
                    and node.module
                    and node.level == 0
                    and node.module.split(".")[0] in PACKAGES
                ):
                    found.update(f"{node.module}:{alias.name}" for alias in node.names)
                elif isinstance(node, ast.Import):
                    found.update(f"{alias.name}:" for alias in node.names if alias.name.split(".")[0] in PACKAGES)
    return found


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()

    def visit(body) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Name):
                            names.add(sub.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    return names


def defined(sources: dict[str, str], entry: str) -> bool:
    """Whether the release whose ``{path: source}`` is given defines ``module:name``."""
    module, name = entry.split(":")
    path = module.replace(".", "/")
    source = sources.get(f"{path}.py", sources.get(f"{path}/__init__.py"))
    if source is None:
        return False
    if not name:
        return True
    if f"{path}/{name}.py" in sources or f"{path}/{name}/__init__.py" in sources:
        return True
    return name in _top_level_names(ast.parse(source))


def wheel_release(wheel: str) -> tuple[str, str]:
    """("torchrec", "1.6.1") or ("fbgemm_gpu", "1.6.0") from a wheel's file name."""
    match = re.match(r"(torchrec|fbgemm_gpu(?:_cpu)?)-([0-9.]+)", os.path.basename(wheel))
    if not match:
        raise SystemExit(f"stack_names: {wheel}: not a torchrec or FBGEMM wheel")
    return ("fbgemm_gpu" if match.group(1).startswith("fbgemm") else "torchrec"), match.group(2)


def record(wheels: list, imports: set[str]) -> dict:
    table: dict = {"version": TABLE_VERSION, **{package: {} for package in PACKAGES}}
    for wheel in wheels:
        package, release = wheel_release(wheel)
        with zipfile.ZipFile(wheel) as archive:
            sources = {
                name: archive.read(name).decode("utf-8")
                for name in archive.namelist()
                if name.startswith(package + "/") and name.endswith(".py")
            }
        table[package][release] = sorted(e for e in imports if e.startswith(package) and defined(sources, e))
    return table


def main(argv=None) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    recorder = commands.add_parser(
        "record",
        help="print, per release, the project's imports each wheel defines "
        "(the JSON of tests/support/stack_names.json)",
    )
    recorder.add_argument("wheels", nargs="+", metavar="WHEEL", help="a torchrec or FBGEMM wheel of a stack")
    commands.add_parser("imports", help="print the project's torchrec and FBGEMM imports, one a line")
    args = parser.parse_args(argv)
    if args.command == "imports":
        print("\n".join(sorted(project_imports())))
        return 0
    json.dump(record(args.wheels, project_imports()), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
