"""The standard checks (docs/tests.md, "Checks"): ruff and mypy pass on the tree with the
versions requirements-dev.txt pins, they report what they are configured to (positive
controls on files written here), and `make check`, `.ci/run` and the pre-commit hooks
run the same commands. The tools' runs skip, with the reason, where the venv lacks them
(a venv installed before they were pinned: make install adds them)."""

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import version

import pytest
import yaml
from setuptools.config.pyprojecttoml import read_configuration

from harness.launch import REPO

PYPROJECT = os.path.join(REPO, "pyproject.toml")


def _pins(path: str) -> dict[str, str]:
    """``name==version`` lines of a requirements file, by lower-case name (extras cut)."""
    pins = {}
    with open(os.path.join(REPO, path)) as f:
        for line in f:
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?==(\S+)", line.strip())
            if match:
                pins[match.group(1).lower()] = match.group(3)
    return pins


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed in this venv (make install puts requirements-dev.txt's pin there)")


def _tool(*argv: str, cwd: str = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("tool", ["ruff", "mypy"])
def test_the_installed_tools_are_the_pinned_ones(tool):
    _needs(tool)
    assert version(tool) == _pins("requirements-dev.txt")[tool]


@pytest.mark.slow
def test_ruff_finds_nothing():
    _needs("ruff")
    proc = _tool("ruff", "check", "--no-cache", ".")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


@pytest.mark.slow
def test_the_tree_is_formatted():
    _needs("ruff")
    proc = _tool("ruff", "format", "--check", "--no-cache", ".")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


@pytest.mark.slow
def test_mypy_finds_nothing():
    _needs("mypy")
    proc = _tool("mypy")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


@pytest.mark.slow
def test_ruff_reports_unsorted_imports_unused_names_and_needless_noqa(tmp_path):
    """Positive control: the project's configuration selects these rules."""
    _needs("ruff")
    (tmp_path / "bad.py").write_text("import sys\nimport os\n\nx = 1  # noqa: E501\n")
    proc = _tool(
        "ruff", "check", "--no-cache", "--config", PYPROJECT, "--output-format", "concise", "bad.py", cwd=str(tmp_path)
    )
    codes = set(re.findall(r"^bad\.py:\d+:\d+: ([A-Z]+\d+)", proc.stdout, re.MULTILINE))
    assert proc.returncode == 1 and codes == {"I001", "F401", "RUF100"}, proc.stdout


@pytest.mark.slow
def test_mypy_reports_type_errors_and_needless_ignores(tmp_path):
    """Positive control: a wrong return type, and a `# type: ignore` with nothing to ignore."""
    _needs("mypy")
    (tmp_path / "bad.py").write_text(
        "def f(x: int) -> str:\n    return x\n\n\ny: int = 1  # type: ignore[assignment]\n"
    )
    proc = _tool("mypy", "--config-file", PYPROJECT, "--no-incremental", "bad.py", cwd=str(tmp_path))
    assert proc.returncode == 1, proc.stdout
    assert re.search(r"^bad\.py:2: error: .*\[return-value\]$", proc.stdout, re.MULTILINE), proc.stdout
    assert re.search(
        r'^bad\.py:5: error: Unused "type: ignore" comment\s+\[unused-ignore\]$', proc.stdout, re.MULTILINE
    ), proc.stdout


def _make_check_commands() -> list[str]:
    with open(os.path.join(REPO, "Makefile")) as f:
        recipe = re.search(r"^check: install\n((?:\t.*\n)+)", f.read(), re.MULTILINE)
    assert recipe, "the Makefile has no `check: install` target"
    return [line.strip().removeprefix("$(PYTHON) -m ") for line in recipe.group(1).splitlines()]


def test_make_check_runs_ruff_format_and_mypy():
    """Then the house's tests, which make test leaves to it."""
    assert _make_check_commands() == [
        "ruff check .",
        "ruff format --check .",
        "mypy",
        "pytest -q -n $(TEST_WORKERS) $(HOUSE_TESTS)",
    ]


def test_ci_runs_make_check_before_anything_else():
    with open(os.path.join(REPO, ".ci", "run")) as f:
        commands = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    first_step = next(line for line in commands if not line.startswith(("set ", "cd ")))
    assert first_step == "make check"


def test_pre_commit_runs_make_checks_tools_and_the_message_check():
    with open(os.path.join(REPO, ".pre-commit-config.yaml")) as f:
        hooks = {hook["id"]: hook for repo in yaml.safe_load(f)["repos"] for hook in repo["hooks"]}
    entries = {hook["entry"].removeprefix(".venv/bin/python -m ") for hook in hooks.values()}
    # the same commands, on the files of the commit (--force-exclude keeps pyproject's excludes)
    assert entries == {
        "ruff check --force-exclude",
        "ruff format --check --force-exclude",
        "mypy",
        "scripts.commit_msg",
    }
    tools = {" ".join(c.split()[:2]) for c in _make_check_commands() if not c.startswith("pytest")}
    assert tools == {"ruff check", "ruff format", "mypy"}
    assert hooks["mypy"]["pass_filenames"] is False  # the whole tree, as make check
    assert hooks["commit-msg"]["stages"] == ["commit-msg"]


@pytest.mark.filterwarnings("ignore:Support for `\\[tool.setuptools\\]` in `pyproject.toml` is still \\*beta\\*")
def test_pyproject_declares_requirements_txt_as_the_dependencies():
    project = read_configuration(PYPROJECT, expand=True)["project"]
    with open(os.path.join(REPO, "requirements.txt")) as f:
        lines = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    assert project["dependencies"] == lines
    assert {
        re.split(r"[\[=]", r)[0].lower(): r.split("==")[1] for r in project["optional_dependencies"]["dev"]
    } == _pins("requirements-dev.txt")


@pytest.mark.slow
def test_every_module_on_mypys_ignore_list_still_has_findings(tmp_path):
    """The list of modules with older type errors only shrinks: run without it, mypy
    reports in each listed module and nowhere else."""
    _needs("mypy")
    with open(PYPROJECT) as f:
        text = f.read()
    blocks = text.split("[[tool.mypy.overrides]]")
    listed_block = [b for b in blocks if "ignore_errors = true" in b]
    assert len(listed_block) == 1
    listed = set(tomllib.loads(listed_block[0])["module"])
    config = tmp_path / "pyproject.toml"
    config.write_text(text.replace("[[tool.mypy.overrides]]" + listed_block[0], ""))
    proc = _tool("mypy", "--config-file", str(config))
    reporting = {
        re.sub(r"(/__init__)?\.py$", "", line.split(":")[0]).replace("/", ".")
        for line in proc.stdout.splitlines()
        if ": error: " in line
    }
    assert reporting == listed, (sorted(listed - reporting), sorted(reporting - listed))
