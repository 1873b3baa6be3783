"""The project's command lines, found from the tree (so a new one is checked without
being listed), and running one in this process as ``python -m`` would."""

import os
import re
import runpy
import sys

from harness.launch import REPO

CLI_PACKAGES = ("data", "serving", "sharding_plans", "sweeps", "training")


def cli_modules():
    """The project's CLIs: modules of the CLI packages with a ``__main__`` block (a
    package's ``__main__.py`` names the package) and the top-level entry points."""
    found = {name for name in os.listdir(REPO) if name.endswith("_main.py")}
    for package in CLI_PACKAGES:
        for name in sorted(os.listdir(os.path.join(REPO, package))):
            if os.path.isfile(os.path.join(REPO, package, name, "__main__.py")):  # a subpackage run with -m
                found.add(f"{package}.{name}")
            if not name.endswith(".py"):
                continue
            with open(os.path.join(REPO, package, name)) as f:
                text = f.read()
            if name == "__main__.py":
                found.add(package)
            elif re.search(r'^if __name__ == "__main__":', text, re.MULTILINE):
                found.add(f"{package}.{name[:-3]}")
    return sorted(found)


def main_modules(root: str = REPO) -> list[str]:
    """Every module of the project that runs as a program, found by its code, at any depth
    of any package (tests/ aside): a top-level script or package module with an
    ``if __name__ == "__main__":`` block, and each package with a ``__main__.py``."""
    found = set()
    for folder, subfolders, files in os.walk(root):
        relative = os.path.relpath(folder, root)
        if relative != "." and (
            relative.split(os.sep)[0] == "tests" or not os.path.isfile(os.path.join(folder, "__init__.py"))
        ):
            subfolders[:] = []
            continue
        subfolders[:] = sorted(s for s in subfolders if not s.startswith("."))
        package = [] if relative == "." else relative.split(os.sep)
        for name in files:
            if not name.endswith(".py") or name == "__init__.py":
                continue
            if name == "__main__.py":
                found.add(".".join(package))
                continue
            with open(os.path.join(folder, name)) as f:
                if re.search(r'^if __name__ == "__main__":', f.read(), re.MULTILINE):
                    found.add(".".join([*package, name[:-3]]))
    return sorted(found)


def run_as_main(target, argv, monkeypatch):
    """Runs ``python -m target`` (or ``python target``) in this process; returns the exit code."""
    monkeypatch.setattr(sys, "argv", [target, *argv])
    try:
        if target.endswith(".py"):
            runpy.run_path(os.path.join(REPO, target), run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return e.code
    return 0
