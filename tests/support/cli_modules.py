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
