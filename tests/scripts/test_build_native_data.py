"""scripts/build_native_data.sh (make native-data): the library it builds is the one the
loader loads (its version), and without a C compiler it says so and succeeds."""

import os
import shutil
import subprocess

import pytest

from data.parquet import kernel
from harness.launch import REPO

BUILD = os.path.join(REPO, "scripts", "build_native_data.sh")

pytestmark = pytest.mark.slow  # each test runs the script


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_builds_the_library_the_loader_loads(tmp_path):
    output = str(tmp_path / "libdlrm_columns.so")
    result = subprocess.run(["bash", BUILD, output], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"native-data: built {output}"
    assert kernel._load(output).dlrm_columns_version() == kernel.VERSION
    assert os.listdir(tmp_path) == ["libdlrm_columns.so"]


def test_without_a_compiler_it_says_so_and_succeeds(tmp_path):
    output = str(tmp_path / "libdlrm_columns.so")
    env = dict(os.environ, CC=str(tmp_path / "no-such-cc"))
    result = subprocess.run(["bash", BUILD, output], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0 and not os.path.exists(output)
    assert "no C compiler" in result.stderr and "converts with numpy" in result.stderr
