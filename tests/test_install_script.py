"""scripts/install.sh's refusals and scripts/check_install.py's verdicts, run against
fake venv directories, and one install into a new venv that borrows this venv's
dependencies (nothing is downloaded)."""

import os
import subprocess
import sys
import sysconfig
from venv import create as create_venv

import pytest

from tests.support.launch import REPO

INSTALL = os.path.join(REPO, "scripts", "install.sh")

pytestmark = pytest.mark.slow  # each test runs the install script or its check


def fake_venv(root, *dist_infos: str) -> str:
    """A venv directory whose site-packages holds only the named dist-info folders."""
    venv = os.path.join(root, "venv")
    site = os.path.join(venv, "lib", "python3.11", "site-packages")
    for name in dist_infos:
        os.makedirs(os.path.join(site, name))
    return venv


def install(venv: str, device: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEVICE": device}
    return subprocess.run(["bash", INSTALL, venv], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("held, dist_infos, device", [
    ("cpu", ["torch-2.13.0+cpu.dist-info", "fbgemm_gpu_cpu-1.8.0.dist-info"], "cuda"),
    ("cpu", ["fbgemm_gpu_cpu-1.8.0.dist-info"], "cuda"),
    ("cuda", ["torch-2.13.0+cu130.dist-info", "fbgemm_gpu-1.8.0.dist-info"], "cpu"),
])
def test_install_refuses_to_switch_a_venv_between_cpu_and_cuda_builds(tmp_path, held, dist_infos, device):
    venv = fake_venv(str(tmp_path), *dist_infos)
    result = install(venv, device)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (f"install: {venv} holds the {held} build of torch/FBGEMM; installing the {device} "
                             f"build over it would mix the two: remove it first (rm -r {venv}) or give another "
                             "venv directory\n")
    assert not os.path.exists(os.path.join(venv, "bin"))  # nothing was created or installed


def test_install_refuses_an_unknown_device(tmp_path):
    result = install(str(tmp_path / "venv"), "tpu")
    assert result.returncode == 2
    assert result.stderr == "install: DEVICE must be auto, cpu or cuda, not 'tpu'\n"
    assert not os.path.exists(tmp_path / "venv")


def test_install_check_verifies_the_build_asked_for():
    """On this CPU host the CPU build passes, and a CUDA install check fails with one
    line instead of letting --device auto train on the CPU."""
    check = [sys.executable, os.path.join(REPO, "scripts", "check_install.py")]
    cpu = subprocess.run(check + ["cpu"], capture_output=True, text=True, timeout=120)
    assert cpu.returncode == 0 and cpu.stdout.startswith("install: torch 2.13.0") and "(CPU build)" in cpu.stdout
    cuda = subprocess.run(check + ["cuda", "--gpu-visible"], capture_output=True, text=True, timeout=120)
    assert cuda.returncode == 1
    assert cuda.stderr == "install: check failed: DEVICE=cuda installed a CPU build of torch (2.13.0+cpu)\n"


def test_a_new_venv_imports_the_packages_from_any_directory(tmp_path):
    """The install is editable and holds every package: from outside the repository the
    new venv imports this checkout's packages, entry points and the test helpers the
    benchmarks use. Its dependencies are this venv's (a .pth line), which pip finds
    installed, so the script installs only the project itself."""
    target = str(tmp_path / "venv")
    create_venv(target)  # pip too is borrowed
    site = sysconfig.get_path("purelib", vars={"base": target, "platbase": target})
    with open(os.path.join(site, "borrowed_dependencies.pth"), "w") as f:
        f.write(sysconfig.get_path("purelib") + "\n")
    result = subprocess.run(["bash", INSTALL, target], cwd=REPO, env={**os.environ, "DEVICE": "cpu"},
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "install: torch 2.13.0" in result.stdout and "(CPU build)" in result.stdout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # The packages whose __init__ imports no torch, and where the entry-point modules are.
    code = ("import importlib.util, bench, common, data, sweeps, tests.support, torchx_components, training\n"
            "for name in ('training', 'dlrm_main', 'dcnv2_main', 'aws_component', 'models', 'sharding_plans'):\n"
            "    print(importlib.util.find_spec(name).origin)")
    imported = subprocess.run([os.path.join(target, "bin", "python"), "-c", code], cwd=elsewhere,
                              capture_output=True, text=True, timeout=300)
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert imported.stdout.splitlines() == [
        os.path.join(REPO, "training", "__init__.py"), os.path.join(REPO, "dlrm_main.py"),
        os.path.join(REPO, "dcnv2_main.py"), os.path.join(REPO, "aws_component.py"),
        os.path.join(REPO, "models", "__init__.py"), os.path.join(REPO, "sharding_plans", "__init__.py")]
