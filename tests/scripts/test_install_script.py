"""scripts/install.sh's refusals, its stack and CUDA build choice (STACK, CUDA_VARIANT,
the driver check against a stand-in nvidia-smi, printed by DRY_RUN) and scripts/check_install.py's
verdicts, run against fake venv directories, and one install into a new venv that
borrows this venv's dependencies (nothing is downloaded)."""

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
from venv import create as create_venv

import pytest

from common.version import VERSION
from harness.launch import REPO

INSTALL = os.path.join(REPO, "scripts", "install.sh")

pytestmark = pytest.mark.slow  # each test runs the install script or its check


def fake_venv(root, *dist_infos: str) -> str:
    """A venv directory whose site-packages holds only the named dist-info folders."""
    venv = os.path.join(root, "venv")
    site = os.path.join(venv, "lib", "python3.11", "site-packages")
    for name in dist_infos:
        os.makedirs(os.path.join(site, name))
    return venv


def stack_of_this_venv() -> str:
    """The folder of stacks/ whose torchrec pin is the torchrec this venv holds."""
    torchrec_pin = f"torchrec=={importlib.metadata.version('torchrec')}"
    stacks = os.path.join(REPO, "stacks")
    for stack in sorted(os.listdir(stacks)):
        pins = os.path.join(stacks, stack, "requirements-torchrec.txt")
        if os.path.isfile(pins):
            with open(pins) as f:
                if torchrec_pin in f.read().split():
                    return stack
    raise AssertionError(f"no folder of stacks/ pins {torchrec_pin}")


# install.sh's settings: a test gives the ones it means; none comes from the caller's
# environment (`make test STACK=...` exports STACK to the suite).
INSTALL_SETTINGS = ("STACK", "DEVICE", "CUDA_VARIANT", "TORCH_INDEX", "ALLOW_CUDA_TORCH", "DRY_RUN")


def install(venv: str, device: str, timeout: float = 60, **settings: str) -> subprocess.CompletedProcess:
    inherited = {name: value for name, value in os.environ.items() if name not in INSTALL_SETTINGS}
    env = {**inherited, "DEVICE": device, **settings}
    return subprocess.run(["bash", INSTALL, venv], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def path_with_gpu(root, driver: str) -> str:
    """PATH with an `nvidia-smi` first that lists one GPU on the given driver version
    (the two queries install.sh makes)."""
    bin_dir = os.path.join(root, "bin")
    os.makedirs(bin_dir)
    script = os.path.join(bin_dir, "nvidia-smi")
    with open(script, "w") as f:
        f.write(
            '#!/bin/sh\ncase "$*" in\n  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-0)" ;;\n'
            f'  *driver_version*) echo "{driver}" ;;\n  *) exit 9 ;;\nesac\n'
        )
    os.chmod(script, 0o755)
    return bin_dir + os.pathsep + os.environ["PATH"]


@pytest.mark.parametrize(
    "variant, pins",
    [
        (None, "torch==2.13.0+cu130 fbgemm-gpu==1.8.0+cu130 from https://download.pytorch.org/whl/cu130"),
        ("cu126", "torch==2.13.0+cu126 fbgemm-gpu==1.8.0+cu126 from https://download.pytorch.org/whl/cu126"),
    ],
)
def test_cuda_variant_switches_torch_and_fbgemm_together(tmp_path, variant, pins):
    settings = {"DRY_RUN": "1", **({"CUDA_VARIANT": variant} if variant else {})}
    result = install(str(tmp_path / "venv"), "cuda", **settings)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"install: dry run: torch2.13 stack, cuda build: {pins}\n"
    assert not os.path.exists(tmp_path / "venv")


@pytest.mark.parametrize(
    "device, pins",
    [
        ("cpu", "torch==2.14.1 fbgemm-gpu-cpu==1.9.0 from https://download.pytorch.org/whl/cpu"),
        ("cuda", "torch==2.14.1+cu130 fbgemm-gpu==1.9.0+cu130 from https://download.pytorch.org/whl/cu130"),
    ],
)
def test_stack_picks_its_own_pins(tmp_path, device, pins):
    """STACK=torch2.14 takes torch, FBGEMM and their CUDA builds from its own folder."""
    result = install(str(tmp_path / "venv"), device, STACK="torch2.14", DRY_RUN="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"install: dry run: torch2.14 stack, {device} build: {pins}\n"


def test_default_stack_is_the_one_stacks_default_names():
    """The Makefile and install.sh read the default from stacks/default (one place); every
    stack folder holds the files install.sh reads."""
    with open(os.path.join(REPO, "stacks", "default")) as f:
        default = f.read().strip()
    stacks = sorted(entry.name for entry in os.scandir(os.path.join(REPO, "stacks")) if entry.is_dir())
    assert default in stacks and len(stacks) >= 2
    for stack in stacks:
        files = set(os.listdir(os.path.join(REPO, "stacks", stack))) - {"trimmed-wheels"}  # optional pins
        assert sorted(files) == [
            "cuda-variants",
            "requirements-cpu.txt",
            "requirements-cuda.txt",
            "requirements-torchrec.txt",
        ]


@pytest.mark.parametrize(
    "stack, variant, refusal",
    [
        (
            None,
            "cu128",
            "install: CUDA_VARIANT must be cu130 or cu126 (the CUDA builds of torch 2.13.0 and "
            "fbgemm-gpu 1.8.0), not 'cu128'\n",
        ),
        (
            "torch2.14",
            "cu126",
            "install: CUDA_VARIANT must be cu130 (the CUDA builds of torch 2.14.1 and fbgemm-gpu 1.9.0), not 'cu126'\n",
        ),
    ],
)
def test_install_refuses_a_cuda_variant_torch_does_not_publish(tmp_path, stack, variant, refusal):
    result = install(str(tmp_path / "venv"), "cuda", CUDA_VARIANT=variant, **({"STACK": stack} if stack else {}))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == refusal
    assert not os.path.exists(tmp_path / "venv")


def test_install_refuses_an_unknown_stack(tmp_path):
    result = install(str(tmp_path / "venv"), "cpu", STACK="torch9.99")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "install: STACK must be one of the folders of stacks/ (torch2.11 torch2.13 torch2.14), not 'torch9.99'\n"
    )
    assert not os.path.exists(tmp_path / "venv")


@pytest.mark.parametrize(
    "driver, variant, refusal",
    [
        (
            "570.86.15",
            "cu130",
            "install: PyTorch's +cu130 builds need an NVIDIA driver R580 or newer; this host's is "
            "570.86.15: upgrade the driver or install with CUDA_VARIANT=cu126 (R525 or newer)\n",
        ),
        ("570.86.15", "cu126", None),
        ("580.65.06", "cu130", None),
        (
            "470.256.02",
            "cu126",
            "install: PyTorch's +cu126 builds need an NVIDIA driver R525 or newer; this host's is "
            "470.256.02: upgrade the driver\n",
        ),
    ],
)
def test_install_refuses_a_driver_too_old_for_the_cuda_build(tmp_path, driver, variant, refusal):
    """With a GPU visible (DEVICE auto picks cuda), the driver nvidia-smi reports is
    checked against the build before anything is installed."""
    result = install(
        str(tmp_path / "venv"), "auto", CUDA_VARIANT=variant, DRY_RUN="1", PATH=path_with_gpu(str(tmp_path), driver)
    )
    if refusal is None:
        assert result.returncode == 0 and result.stdout.startswith(
            "install: dry run: torch2.13 stack, cuda build (GPU visible): "
        )
    else:
        assert result.returncode == 2 and result.stdout == "" and result.stderr == refusal


@pytest.mark.parametrize(
    "held, dist_infos, device",
    [
        ("cpu", ["torch-2.13.0+cpu.dist-info", "fbgemm_gpu_cpu-1.8.0.dist-info"], "cuda"),
        ("cpu", ["fbgemm_gpu_cpu-1.8.0.dist-info"], "cuda"),
        ("cuda", ["torch-2.13.0+cu130.dist-info", "fbgemm_gpu-1.8.0.dist-info"], "cpu"),
    ],
)
def test_install_refuses_to_switch_a_venv_between_cpu_and_cuda_builds(tmp_path, held, dist_infos, device):
    venv = fake_venv(str(tmp_path), *dist_infos)
    result = install(venv, device)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"install: {venv} holds the {held} build of torch/FBGEMM; installing the {device} "
        f"build over it would mix the two: remove it first (rm -r {venv}) or give another "
        "venv directory\n"
    )
    assert not os.path.exists(os.path.join(venv, "bin"))  # nothing was created or installed


def test_install_refuses_an_unknown_device(tmp_path):
    result = install(str(tmp_path / "venv"), "tpu")
    assert result.returncode == 2
    assert result.stderr == "install: DEVICE must be auto, cpu or cuda, not 'tpu'\n"
    assert not os.path.exists(tmp_path / "venv")


def test_install_check_verifies_the_build_asked_for():
    """On this CPU host a CPU build of torch passes, and a CUDA install check fails with
    one line instead of letting --device auto train on the CPU. A venv holding PyPI's
    CUDA build of torch (the torch 2.14 stack here) fails the CPU check unless
    --allow-cuda-torch says so, and then runs FBGEMM's CPU kernels."""
    import torch

    check = [sys.executable, os.path.join(REPO, "scripts", "check_install.py")]
    cpu = subprocess.run(check + ["cpu"], capture_output=True, text=True, timeout=120)
    if torch.version.cuda is not None:
        assert cpu.returncode == 1
        assert cpu.stderr == (
            f"install: check failed: DEVICE=cpu installed a CUDA build of torch ({torch.__version__}): "
            "it should come from PyTorch's CPU index (TORCH_INDEX), or set ALLOW_CUDA_TORCH=1 to run "
            "it on the CPU\n"
        )
        allowed = subprocess.run(check + ["cpu", "--allow-cuda-torch"], capture_output=True, text=True, timeout=120)
        assert allowed.returncode == 0 and allowed.stdout.startswith(f"install: torch {torch.__version__} ")
        assert (
            f"(CUDA {torch.version.cuda} build of torch on the CPU, ALLOW_CUDA_TORCH; FBGEMM lookup and update checked)"
        ) in allowed.stdout
        return
    assert cpu.returncode == 0 and cpu.stdout.startswith(f"install: torch {torch.__version__} ")
    assert "(CPU build; FBGEMM lookup and update checked)" in cpu.stdout
    cuda = subprocess.run(check + ["cuda", "--gpu-visible"], capture_output=True, text=True, timeout=120)
    assert cuda.returncode == 1
    assert cuda.stderr == f"install: check failed: DEVICE=cuda installed a CPU build of torch ({torch.__version__})\n"


def test_a_new_venv_imports_the_packages_from_any_directory(tmp_path):
    """The install is editable and holds every package: from outside the repository the
    new venv imports this checkout's packages, entry points and the harness the
    benchmarks share with the tests. Its dependencies are this venv's (a .pth line), which pip finds
    installed, so the script installs only the project itself: the stack asked for is
    this venv's (found by its torchrec), and a CUDA build of torch is what this venv
    holds where it holds one (ALLOW_CUDA_TORCH)."""
    import torch

    target = str(tmp_path / "venv")
    create_venv(target)  # pip too is borrowed
    site = sysconfig.get_path("purelib", vars={"base": target, "platbase": target})
    with open(os.path.join(site, "borrowed_dependencies.pth"), "w") as f:
        f.write(sysconfig.get_path("purelib") + "\n")
    result = install(
        target,
        "cpu",
        timeout=900,
        STACK=stack_of_this_venv(),
        TORCH_INDEX="",
        ALLOW_CUDA_TORCH="1" if torch.version.cuda else "0",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"install: torch {torch.__version__} " in result.stdout
    # pip's conflict with torchrec's declared CUDA fbgemm-gpu is neither an ERROR nor explained away
    assert "requires fbgemm-gpu" not in result.stdout + result.stderr and "ERROR" not in result.stderr
    build = (
        f"CUDA {torch.version.cuda} build of torch on the CPU, ALLOW_CUDA_TORCH" if torch.version.cuda else "CPU build"
    )
    assert f"({build}; FBGEMM lookup and update checked)" in result.stdout
    # The Parquet column kernels, built into this checkout (a C compiler is here)
    assert (
        f"native-data: built {os.path.join(REPO, 'data', 'parquet', 'native', 'libdlrm_columns.so')}" in result.stdout
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # The packages whose __init__ imports no torch, and where the entry-point modules are.
    code = (
        "import importlib.metadata, importlib.util, bench, common, data, harness, recipes, sweeps, torchx_components, "
        "training\n"
        "for name in ('training', 'dlrm_main', 'dcnv2_main', 'aws_component', 'models', 'sharding_plans', "
        "'checkpoints'):\n"
        "    print(importlib.util.find_spec(name).origin)\n"
        "print(importlib.metadata.version('dlrm-torchrec-launch'))"
    )
    imported = subprocess.run(
        [os.path.join(target, "bin", "python"), "-c", code], cwd=elsewhere, capture_output=True, text=True, timeout=300
    )
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert imported.stdout.splitlines() == [
        os.path.join(REPO, "training", "__init__.py"),
        os.path.join(REPO, "dlrm_main.py"),
        os.path.join(REPO, "dcnv2_main.py"),
        os.path.join(REPO, "aws_component.py"),
        os.path.join(REPO, "models", "__init__.py"),
        os.path.join(REPO, "sharding_plans", "__init__.py"),
        os.path.join(REPO, "checkpoints", "__init__.py"),
        VERSION,
    ]  # the version pyproject.toml reads from its source


def test_pip_check_keeps_every_conflict_but_the_cpu_builds_fbgemm():
    """What pip printed during a CPU install (its conflict check after torchrec's
    dependencies were installed, torchrec itself --no-deps): the fbgemm-gpu line is
    expected on CPU (fbgemm-gpu-cpu provides the module) and dropped; every other
    conflict is kept, and on CUDA the fbgemm-gpu one too."""
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    try:
        from check_install import unexpected_conflicts
    finally:
        sys.path.pop(0)
    printed = (
        "torchrec 1.8.0 requires fbgemm-gpu, which is not installed.\n"
        "torchrec 1.8.0 requires torchmetrics==1.0.3, which is not installed.\n"
    )
    assert unexpected_conflicts(printed, "cpu") == [
        "torchrec 1.8.0 requires torchmetrics==1.0.3, which is not installed."
    ]
    assert unexpected_conflicts(printed, "cuda") == printed.splitlines()
    assert unexpected_conflicts("No broken requirements found.\n", "cpu") == []
    assert unexpected_conflicts("torchrec 1.8.0 requires fbgemm-gpu, which is not installed.\n", "cpu") == []


def write_manifest(directory, **fields) -> str:
    """A wheelhouse.json (no archive) for the refusals that come before unpacking."""
    manifest = {
        "version": 1,
        "stack": "torch2.11",
        "device": "cuda",
        "cuda_variant": "cu130",
        "gpu_arch": "sm_90",
        "python": "{}.{}".format(*sys.version_info[:2]),
        "torch": "2.11.0+cu130",
        "fbgemm": "fbgemm-gpu==1.6.0",
        "torchrec": "torchrec==1.6.1",
        "requirements": ["numpy==2.4.6"],
        "archive_sha256": "0" * 64,
        **fields,
    }
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "wheelhouse.json"), "w") as f:
        json.dump({k: v for k, v in manifest.items() if v is not None}, f)
    return str(directory)


def install_offline(wheelhouse: str, *args: str, timeout: float = 60, **settings) -> subprocess.CompletedProcess:
    inherited = {name: value for name, value in os.environ.items() if name not in INSTALL_SETTINGS}
    return subprocess.run(
        ["bash", INSTALL, "--wheelhouse", wheelhouse, *args],
        cwd=REPO,
        env={**inherited, "PYTHON": sys.executable, **settings},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_wheelhouse_and_system_torch_go_together(tmp_path):
    for args in (["--wheelhouse", str(tmp_path)], ["--system-torch"]):
        result = subprocess.run(["bash", INSTALL, *args], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr == (
            "install: --wheelhouse and --system-torch go together: the wheelhouse holds "
            "everything but torch, which the environment must already have\n"
        )


@pytest.mark.parametrize(
    "fields, refusal",
    [
        (
            {},
            "install: {dir} was built for torch 2.11.0+cu130 (torch2.11 stack); {python} has torch {torch}: build a "
            "wheelhouse for it (make wheelhouse STACK=...)\n",
        ),
        (
            {"python": "3.9"},
            "install: {dir} holds wheels for Python 3.9; {python} is Python {ours}: build one with "
            "PYTHON_VERSION={ours}\n",
        ),
        ({"torchrec": None}, "wheelhouse: {dir}/wheelhouse.json: torchrec is missing\n"),
    ],
)
def test_wheelhouse_install_refuses_another_torch_or_python(tmp_path, fields, refusal):
    """Before unpacking anything: the environment's torch and Python are the ones the
    wheelhouse was built for, and its manifest is read field by field."""
    import torch

    directory = write_manifest(tmp_path / "wheelhouse", **fields)
    result = install_offline(directory, "--system-torch")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == refusal.format(
        dir=directory, python=sys.executable, torch=torch.__version__, ours="{}.{}".format(*sys.version_info[:2])
    )


def image_environment(root) -> str:
    """A directory standing in for an image's site-packages: torch, the packages torch
    requires and pip, linked from this venv, nothing else (no FBGEMM, no torchrec)."""
    import re

    site = os.path.join(root, "image-site-packages")
    os.makedirs(site)
    wanted, seen = ["torch", "pip"], set()
    while wanted:
        name = re.sub(r"[-_.]+", "-", wanted.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional extra's, or a marker for another platform
        for requirement in dist.requires or ():
            if "extra ==" not in requirement:
                wanted.append(re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0])
        for top in {str(path).split("/")[0] for path in dist.files or ()}:
            source = os.path.join(str(dist.locate_file("")), top)
            target = os.path.join(site, top)
            if top != ".." and os.path.exists(source) and not os.path.exists(target):
                os.symlink(source, target)
    return site


@pytest.mark.gpu_host
def test_wheelhouse_installs_offline_over_the_environment_torch(tmp_path):
    """make wheelhouse's CPU leg end to end: a wheelhouse of this venv's stack (the CPU
    FBGEMM, torchrec and the packages torchrec imports, downloaded for this Python),
    installed with --system-torch and no index into a venv whose only packages are an
    'image's': torch (with its own requirements) and pip, seen through a .pth line as
    --system-site-packages would show them. pip leaves what lies outside the venv alone."""
    import torch

    stack = stack_of_this_venv()
    wheelhouse = str(tmp_path / "wheelhouse")
    python_version = "{}.{}".format(*sys.version_info[:2])
    built = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "scripts", "wheelhouse.py"),
            "build",
            "--stack",
            stack,
            "--device",
            "cpu",
            "--python-version",
            python_version,
            "--output",
            wheelhouse,
            "--packages",
            "torchmetrics,tensordict,pyre-extensions,tqdm,iopath,numpy",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if built.returncode != 0 and "pip download failed" in built.stderr and "connection" in built.stderr.lower():
        pytest.skip(f"PyPI cannot be reached: {built.stderr.strip()}")
    assert built.returncode == 0, built.stderr[-3000:]
    assert sorted(os.listdir(wheelhouse)) == ["wheelhouse.json", "wheels.tar.xz"]
    with open(os.path.join(wheelhouse, "wheelhouse.json")) as f:
        manifest = json.load(f)
    assert manifest["torch"] == torch.__version__ and manifest["device"] == "cpu" and manifest["stack"] == stack
    target = str(tmp_path / "venv")
    create_venv(target)
    site = sysconfig.get_path("purelib", vars={"base": target, "platbase": target})
    with open(os.path.join(site, "image.pth"), "w") as f:
        f.write(image_environment(str(tmp_path)) + "\n")
    result = install_offline(
        wheelhouse,
        "--system-torch",
        target,
        timeout=900,
        PIP_CONFIG_FILE=os.devnull,
        ALLOW_CUDA_TORCH="1" if torch.version.cuda else "0",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"install: {stack} stack from {wheelhouse} over torch {torch.__version__}" in result.stdout
    assert "FBGEMM lookup and update checked)" in result.stdout
    code = (
        "import importlib.metadata, torch, torchrec, fbgemm_gpu, training\n"
        "print(torchrec.__file__, fbgemm_gpu.__file__, torch.__file__, training.__file__)"
    )
    imported = subprocess.run(
        [os.path.join(target, "bin", "python"), "-c", code],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert imported.returncode == 0, imported.stderr[-3000:]
    torchrec_file, fbgemm_file, torch_file, training_file = imported.stdout.split()
    assert torchrec_file.startswith(target) and fbgemm_file.startswith(target)  # installed from the wheelhouse
    assert torch_file.startswith(str(tmp_path / "image-site-packages"))  # the 'image's' torch, untouched
    assert training_file == os.path.join(REPO, "training", "__init__.py")  # the project, editable
