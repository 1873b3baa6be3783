"""Runs the real torchx CLI from the repository root, as a user would, and reads what
it prints (sbatch scripts, Kubernetes jobs, torchrun command lines)."""

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from harness.launch import REPO

BIN = os.path.dirname(sys.executable)

# Small, fast training flags (the data directory is added by each test).
SMALL_TRAINING_FLAGS = [
    "--batch_size",
    "256",
    "--embedding_dim",
    "16",
    "--dense_arch_layer_sizes",
    "64,16",
    "--over_arch_layer_sizes",
    "64,1",
    "--optimizer",
    "adagrad",
    "--learning_rate",
    "0.05",
    "--limit_train_batches",
    "20",
    "--limit_val_batches",
    "2",
    "--limit_test_batches",
    "2",
]


def install_components(target: str) -> dict[str, str]:
    """Installs this checkout's torchx components (pyproject.toml: the package and its
    `torchx.components` entry point) into ``target``, as `make install` does into the
    venv; returns the environment under which the torchx CLI finds them. Builds from a
    copy of the packaged files: setuptools writes build/ beside the sources."""
    source = os.path.join(target, "source")
    shutil.copytree(
        os.path.join(REPO, "torchx_components"),
        os.path.join(source, "torchx_components"),
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for name in ("pyproject.toml", "aws_component.py"):
        shutil.copy(os.path.join(REPO, name), source)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--target",
            os.path.join(target, "site"),
            source,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(target, "site")
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")  # torchrun and python of this venv
    return env


def torchx(
    args: Sequence[str], env: dict[str, str], timeout: float = 600, cwd: str = REPO
) -> subprocess.CompletedProcess:
    """`torchx ARGS` from the repository root (where .torchxconfig is), or from ``cwd``."""
    return subprocess.run(
        [os.path.join(BIN, "torchx"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def scheduler_request(stdout: str) -> str:
    """What `torchx run --dryrun` would submit (the text after its marker)."""
    marker = "=== SCHEDULER REQUEST ===\n"
    assert marker in stdout, stdout[-3000:]
    return stdout.split(marker, 1)[1]


def sbatch_groups(request: str) -> list[dict[str, Any]]:
    """One entry per Slurm heterogeneous-job group (torchx gives each node its own):
    its #SBATCH options and the argv of the torchrun command its srun starts."""
    script = request.split("# SBATCH_SCRIPT\n#----------------\n", 1)[1]
    options = [
        line[len("#SBATCH ") :]
        for line in script.splitlines()
        if line.startswith("#SBATCH ") and line != "#SBATCH hetjob"
    ]
    srun = script[script.index("\nsrun ") + 1 : script.index("\nexitcode=")]
    commands = [shlex.split(part) for part in srun.split(" :\\\n")]
    return [{"options": shlex.split(opts), "torchrun": torchrun_argv(cmd)} for opts, cmd in zip(options, commands)]


def torchrun_argv(command: list[str]) -> list[str]:
    """The torchrun argv inside `... bash -c 'torchrun ...'`."""
    payload = command[command.index("-c") + 1]
    return shlex.split(payload)


def kubernetes_job(request: str) -> dict[str, Any]:
    return yaml.safe_load(request)


def option(argv: list[str], name: str) -> str:
    """The value after ``name`` in ``argv``."""
    return argv[argv.index(name) + 1]
