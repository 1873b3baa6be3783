"""The release number: one source (common/version.py, which pyproject.toml reads),
printed by every CLI's ``--version``, and named by CHANGELOG.md's newest entry."""

import os
import re
import tomllib

import pytest

from common.version import VERSION
from harness.launch import REPO
from tests.support.cli_modules import cli_modules, run_as_main


def test_pyproject_reads_the_version_from_its_one_source():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "common.version.VERSION"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION)


def test_the_changelog_starts_with_this_version():
    with open(os.path.join(REPO, "CHANGELOG.md")) as f:
        headings = [line for line in f if line.startswith("## ")]
    assert re.fullmatch(rf"## {re.escape(VERSION)} \(\d{{4}}-\d{{2}}-\d{{2}}\)\n", headings[0]), headings[0]


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # runpy re-runs imported modules
@pytest.mark.parametrize("target", cli_modules())
def test_every_cli_prints_the_version(target, monkeypatch, capsys):
    assert run_as_main(target, ["--version"], monkeypatch) == 0
    out = capsys.readouterr().out
    assert out.endswith(f" {VERSION}\n") and len(out.splitlines()) == 1, out
