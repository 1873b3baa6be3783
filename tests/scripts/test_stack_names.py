"""Every torchrec and FBGEMM name the project imports exists in every release the
stacks pin (torchrec 1.6.1, 1.8.0, 1.9.2; FBGEMM 1.6.0, 1.8.0, 1.9.0), from a table
read off the releases' wheels (scripts/stack_names.py), itself checked against the
release installed here."""

import importlib
import importlib.metadata
import importlib.util
import json
import os
import re

import pytest

from harness.launch import REPO
from scripts.stack_names import PACKAGES, project_imports

with open(os.path.join(REPO, "tests", "support", "stack_names.json")) as f:
    TABLE = json.load(f)
RECORD = (
    "python scripts/stack_names.py record WHEEL... > tests/support/stack_names.json "
    "(the torchrec and FBGEMM wheels of every stack)"
)


def pinned_releases() -> dict[str, set[str]]:
    """{"torchrec": {"1.6.1", ...}, "fbgemm_gpu": {...}} from every folder of stacks/."""
    releases: dict[str, set[str]] = {package: set() for package in PACKAGES}
    stacks = os.path.join(REPO, "stacks")
    for stack in os.listdir(stacks):
        for name in ("requirements-cpu.txt", "requirements-torchrec.txt"):
            path = os.path.join(stacks, stack, name)
            if os.path.isfile(path):
                with open(path) as f:
                    for match in re.finditer(r"^(torchrec|fbgemm-gpu-cpu)==([0-9.]+)", f.read(), re.M):
                        releases["torchrec" if match.group(1) == "torchrec" else "fbgemm_gpu"].add(match.group(2))
    return releases


def test_the_table_covers_every_pinned_release():
    assert {package: set(TABLE[package]) for package in PACKAGES} == pinned_releases(), RECORD


@pytest.mark.parametrize("package", PACKAGES)
def test_every_imported_name_exists_in_every_pinned_release(package):
    imports = {entry for entry in project_imports() if entry.startswith(package)}
    assert len(imports) >= 5  # the scan found the project's imports
    for release, names in TABLE[package].items():
        missing = sorted(imports - set(names))
        assert not missing, f"{package} {release} lacks {missing}, or the table predates them: {RECORD}"


@pytest.mark.parametrize("package, distribution", [("torchrec", "torchrec"), ("fbgemm_gpu", None)])
def test_the_table_agrees_with_the_installed_release(package, distribution):
    """The table's entry for the release installed here: each name imports for real."""
    if distribution is None:
        import fbgemm_gpu

        release = fbgemm_gpu.__version__.split("+")[0]
    else:
        release = importlib.metadata.version(distribution).split("+")[0]
    assert release in TABLE[package], RECORD
    for entry in TABLE[package][release]:
        module, name = entry.split(":")
        imported = importlib.import_module(module)
        if name:
            assert hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}") is not None, entry
