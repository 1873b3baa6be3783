"""common/cli.py is the one way a command line is built: every CLI's parser is a
OneLineParser, so bad flags are one line and exit 2, abbreviations are refused."""

import ast
import os
import subprocess
import sys

import pytest

from common.cli import OneLineParser

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SKIP_DIRS = {".git", ".venv", "tests", "node_modules", "__pycache__", "data_cache", "runs"}


def parsers_built_elsewhere() -> list[str]:
    """file:line of each ``argparse.ArgumentParser(...)`` or ``sys.argv`` parsed by hand
    outside common/cli.py (the torchrun pass-through of training/launch.py aside)."""
    found = []
    for root, dirs, files in os.walk(REPO):
        # Hidden folders aside: the other stacks' venvs (.venv-torch2.14) live in the checkout.
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.startswith(".")]
        for name in files:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, REPO)
            if not name.endswith(".py") or relative in ("common/cli.py", "training/launch.py"):
                continue
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                called = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                if (
                    called
                    and node.func.attr == "ArgumentParser"
                    or isinstance(node, ast.Attribute)
                    and node.attr == "argv"
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "sys"
                ):
                    found.append(f"{relative}:{node.lineno}")
    return found


def test_every_cli_builds_its_parser_with_one_line_parser():
    assert parsers_built_elsewhere() == []


def test_the_scan_finds_a_parser_built_by_hand(tmp_path, monkeypatch):
    """Positive control: a module with its own argparse parser is found."""
    monkeypatch.setattr(sys.modules[__name__], "REPO", str(tmp_path))
    (tmp_path / "tool.py").write_text("import argparse\n\nparser = argparse.ArgumentParser()\n")
    assert parsers_built_elsewhere() == ["tool.py:3"]


def test_a_bad_or_abbreviated_flag_is_one_line_and_exit_2(capsys):
    parser = OneLineParser(prog="tool")
    parser.add_argument("--learning_rate", type=float, default=0.1)
    for argv, message in (
        (["--learning_rat", "0.5"], "unrecognized arguments: --learning_rat 0.5"),
        (["--learning_rate", "x"], "argument --learning_rate: invalid float value: 'x'"),
    ):
        with pytest.raises(SystemExit) as done:
            parser.parse_args(argv)
        assert done.value.code == 2
        assert capsys.readouterr().err == f"tool: error: {message}\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, argv",
    [
        ("scripts/stack_names.py", ["imports"]),
        ("scripts/check_install.py", ["cpu"]),
        ("scripts/trim_fbgemm_wheel.py", ["some.whl"]),
        ("scripts/wheelhouse.py", ["show", "dir", "archive_sha256"]),
    ],
)
def test_a_script_run_by_path_refuses_a_bad_flag_in_one_line(script, argv):
    """Run as the install scripts and docs run them (by path, the repository not on
    sys.path): the builder still loads, and the refusal is one line, exit 2."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, script, *argv, "--no_such_flag"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"{os.path.basename(script)}: error: ") and "--no_such_flag" in line
