"""The torchx components' parameters, errors and docs/launching.md tables (in-process, no launch)."""

import inspect
import os
import subprocess
import sys
import tomllib

import pytest
from torchx.specs.builders import parse_args
from torchx.specs.finder import CustomComponentsFinder, ModuleComponentsFinder

import aws_component
from harness.launch import REPO
from scripts import component_docs
from torchx_components.daily import daily
from torchx_components.machines import machine_resource
from torchx_components.preprocess import preprocess_criteo
from torchx_components.training import dcnv2, dlrm


def _torchrun_args(app):
    (role,) = app.roles
    assert role.entrypoint == "bash" and role.args[0] == "-c"
    return role.args[1].split()


@pytest.mark.parametrize("num_trainers, nodes, per_node", [(1, 1, 1), (4, 1, 4), (8, 1, 8), (16, 2, 8), (24, 3, 8)])
def test_aws_component_spreads_trainers_over_nodes_of_8(num_trainers, nodes, per_node):
    app = aws_component.run_dlrm_main(num_trainers, "--batch_size", "2048")
    (role,) = app.roles
    assert role.num_replicas == nodes
    args = _torchrun_args(app)
    assert args[args.index("--nproc_per_node") + 1] == str(per_node)
    assert args[-4:] == ["-m", "dlrm_main", "--batch_size", "2048"]
    assert (role.resource.gpu, role.resource.cpu) == (8, 96)  # default machine: aws_p4d


@pytest.mark.parametrize(
    "num_trainers, message",
    [
        (12, "--num_trainers 12: more than 8 trainers span nodes of 8 and must be a multiple of 8 (e.g. 8 or 16)"),
        (9, "--num_trainers 9: more than 8 trainers span nodes of 8 and must be a multiple of 8 (e.g. 8 or 16)"),
        (0, "--num_trainers 0: must be at least 1"),
        (-8, "--num_trainers -8: must be at least 1"),
    ],
)
def test_aws_component_rejects_bad_trainer_counts(num_trainers, message):
    with pytest.raises(ValueError) as error:
        aws_component.run_dlrm_main(num_trainers)
    assert str(error.value) == message


def test_aws_component_machine_is_a_parameter():
    app = aws_component.run_dlrm_main(16, h="aws_p5")
    assert app.roles[0].resource.capabilities == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    with pytest.raises(ValueError, match=r"^-j 1x8: 8 processes per node but machine a100x1 has 1 GPUs"):
        aws_component.run_dlrm_main(8, h="a100x1")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"j": "2:4x8"}, r"^-j 2:4x8: expected NODESxPROCS, e\.g\. 1x2 or 2x8 \(elastic ranges are not supported"),
        ({"j": "8"}, r"^-j 8: expected NODESxPROCS"),
        ({"j": "0x2"}, r"^-j 0x2: nodes and processes per node must be at least 1$"),
        ({"j": "1x16", "h": "a100x8"}, r"^-j 1x16: 16 processes per node but machine a100x8 has 8 GPUs"),
        ({"h": "dgx"}, r"^-h dgx: unknown machine; use one of cpu, cpu_large, a100x1, a100x8, h100x8, aws_p4d"),
        ({"cpu": "many"}, r"^--cpu many: not an integer$"),
        ({"gpu": "-1"}, r"^--gpu -1: must be at least 0$"),
        ({"memMB": 0}, r"^--memMB 0: must be at least 1$"),
        ({"max_retries": -1}, r"^--max_retries -1: must be >= 0$"),
        (
            {"socket_ifname": "eth0 eth1"},
            r"^--socket_ifname 'eth0 eth1': expected one network interface name, e\.g\. eth0$",
        ),
        (
            {"j": "2x1", "socket_ifname": "lo"},
            r"^--socket_ifname lo: the loopback interface does not reach the other "
            r"nodes of a 2x1 job; name the interface of the network between the nodes, e\.g\. eth0$",
        ),
        ({"j": "2x1", "env": {"NCCL_SOCKET_IFNAME": "=lo"}}, r"^--env NCCL_SOCKET_IFNAME==lo: the loopback interface"),
        ({"j": "2x1", "env": {"GLOO_SOCKET_IFNAME": "lo,lo"}}, r"^--env GLOO_SOCKET_IFNAME=lo,lo: the loopback"),
        (
            {"env": {"MASTER_ADDR": "10.0.0.1"}},
            r"^--env MASTER_ADDR=10\.0\.0\.1: torchrun sets MASTER_ADDR of every rank "
            r"from the rendezvous on the first node \(on Slurm the first host of SLURM_JOB_NODELIST\), so this value "
            r"would be ignored; remove it \(--rdzv_port sets the rendezvous' port\)$",
        ),
        ({"j": "2x1", "env": {"MASTER_PORT": "29501"}}, r"^--env MASTER_PORT=29501: torchrun sets MASTER_PORT"),
    ],
)
def test_training_component_errors_name_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dlrm("--batch_size", "64", **kwargs)


def test_training_component_resources_and_overrides():
    app = dcnv2("--batch_size", "64", j="1x16", h="a100x8", gpu="0", cpu="32", memMB="100000")
    resource = app.roles[0].resource
    # gpu=0: CPU ranks on the box, so any number of them per node.
    assert (resource.cpu, resource.gpu, resource.memMB) == (32, 0, 100000)
    assert machine_resource("aws_p4d").devices == {"vpc.amazonaws.com/efa": 4}
    assert machine_resource("aws_g5.48xlarge").gpu == 8  # any torchx named resource


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], ["--in_memory_binary_criteo_path", "/data", "--batch_size", "64"]),
        (
            ["--in_memory_binary_criteo_path", "/other"],
            ["--in_memory_binary_criteo_path", "/other", "--batch_size", "64"],
        ),
        (["--synthetic_multi_hot_criteo_path=/mh"], ["--synthetic_multi_hot_criteo_path=/mh", "--batch_size", "64"]),
    ],
)
def test_data_dir_is_mounted_and_passed_unless_flags_give_a_path(flags, expected):
    app = dlrm(*flags, "--batch_size", "64", data_dir="/data", checkpoint_dir="/ckpt", max_retries=2)
    (role,) = app.roles
    args = _torchrun_args(app)
    # checkpoint_dir also makes a restarted job resume from its newest checkpoint
    assert args[args.index("dlrm_main") + 1 :] == ["--checkpoint_dir", "/ckpt", "--resume", *expected]
    assert [(m.src_path, m.dst_path, m.read_only) for m in role.mounts] == [
        ("/data", "/data", True),
        ("/ckpt", "/ckpt", False),
    ]
    assert role.max_retries == 2


def test_preprocess_component():
    app = preprocess_criteo("--frequency_threshold", "3", input_dir="/raw", output_dir="/out", h="cpu")
    (role,) = app.roles
    assert role.entrypoint == "python"
    assert role.args == [
        "-m",
        "data.preprocess_criteo",
        "--input_dir",
        "/raw",
        "--output_dir",
        "/out",
        "--dataset_name",
        "criteo_1t",
        "--workers",
        "4",
        "--frequency_threshold",
        "3",
    ]
    assert [(m.src_path, m.read_only) for m in role.mounts] == [("/raw", True), ("/out", False)]
    with pytest.raises(ValueError, match=r"^--workers 0: must be at least 1$"):
        preprocess_criteo(input_dir="/raw", output_dir="/out", workers="0")


def test_daily_component():
    app = daily("--sparse_columns", "C*", state_dir="/state", parquet_path="/lake", nproc_per_node="2", max_retries=3)
    (role,) = app.roles
    assert role.entrypoint == "python" and role.max_retries == 3
    assert role.args == [
        "-m",
        "training.daily",
        "--state_dir",
        "/state",
        "--parquet_path",
        "/lake",
        "--time_column",
        "date",
        "--nproc_per_node",
        "2",
        "--sparse_columns",
        "C*",
    ]
    assert [(m.src_path, m.read_only) for m in role.mounts] == [("/lake", True), ("/state", False)]
    with pytest.raises(ValueError, match=r"^--nproc_per_node 0: must be at least 1$"):
        daily(state_dir="/state", parquet_path="/lake", nproc_per_node="0")


@pytest.mark.slow
def test_components_import_no_torch():
    """The torchx CLI imports the components on the submitting machine, which need not
    have torch or numpy (the data-path flags come from data/sources/'s registry)."""
    code = (
        "import sys, aws_component, torchx_components.training, torchx_components.preprocess, "
        "torchx_components.daily; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_launching_page_component_tables_match_the_docstrings():
    with open(component_docs.PAGE) as f:
        page = f.read()
    assert component_docs.page_with_tables(page) == page, (
        "docs/launching.md is out of date: run python scripts/component_docs.py --write"
    )


def _repository_components():
    """The components as torchx finds them: the modules of this repository that
    pyproject.toml registers under `torchx.components` (listed the way `torchx builtins`
    lists them), and aws_component.py's by file."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        registered = tomllib.load(f)["project"]["entry-points"]["torchx.components"]
    components = [
        component
        for group, module in registered.items()
        if module.startswith("torchx_components")
        for component in ModuleComponentsFinder(module, "" if group.startswith("_") else group).find()
        if not component.validation_errors
    ]
    components += CustomComponentsFinder(os.path.join(REPO, "aws_component.py"), "run_dlrm_main").find()
    return components


def test_every_component_renders_its_help(capsys):
    """`torchx run COMPONENT --help` as torchx renders it: argparse formats each
    parameter's docstring with %, so a literal % in one crashed the help."""
    components = _repository_components()
    assert {"dlrm", "dcnv2", "preprocess_criteo", "daily"} <= {c.name for c in components}
    for component in components:
        with pytest.raises(SystemExit) as exit_:
            parse_args(component.fn, ["--help"])
        assert exit_.value.code == 0, component.name
        shown = capsys.readouterr().out
        assert shown.startswith(f"usage: torchx run <run args...> {component.fn_name}"), component.name
        for parameter in inspect.signature(component.fn).parameters.values():
            if parameter.kind is not inspect.Parameter.VAR_POSITIONAL:
                assert f"--{parameter.name}" in shown, (component.name, parameter.name)


@pytest.mark.parametrize(
    "component, params, starts",
    [
        (dlrm, {"j": "2:4x2"}, "-j 2:4x2: "),
        (dlrm, {"h": "nosuch"}, "-h nosuch: "),
        (dcnv2, {"rdzv_port": 0}, "--rdzv_port 0: "),
        (preprocess_criteo, {"max_retries": -1, "input_dir": "in", "output_dir": "out"}, "--max_retries -1: "),
        (aws_component.run_dlrm_main, {"num_trainers": 9}, "--num_trainers 9: "),
    ],
)
def test_parameter_errors_are_what_torchx_prints_as_one_line(component, params, starts):
    """torchx prints a ComponentValidationException's message alone, any other exception
    with its traceback."""
    from torchx.specs.finder import ComponentValidationException

    with pytest.raises(ComponentValidationException) as error:
        component(**params)
    assert str(error.value).startswith(starts) and "\n" not in str(error.value)


def test_socket_ifname_sets_both_backends_interface_unless_env_does():
    (role,) = dlrm("--batch_size", "64", j="2x1", socket_ifname="eth0").roles
    assert role.env["GLOO_SOCKET_IFNAME"] == role.env["NCCL_SOCKET_IFNAME"] == "eth0"
    (role,) = dlrm("--batch_size", "64", j="2x1", socket_ifname="eth0", env={"NCCL_SOCKET_IFNAME": "ib"}).roles
    assert (role.env["GLOO_SOCKET_IFNAME"], role.env["NCCL_SOCKET_IFNAME"]) == ("eth0", "ib")
    (role,) = dlrm("--batch_size", "64").roles
    assert "GLOO_SOCKET_IFNAME" not in role.env and "NCCL_SOCKET_IFNAME" not in role.env


def test_loopback_interface_is_kept_where_it_can_work():
    """One node (every rank on it), an exclusion list or another interface beside it."""
    assert dlrm("--batch_size", "64", j="1x2", socket_ifname="lo").roles[0].env["GLOO_SOCKET_IFNAME"] == "lo"
    for value in ("^lo", "lo,eth0"):
        (role,) = dlrm("--batch_size", "64", j="2x1", env={"NCCL_SOCKET_IFNAME": value}).roles
        assert role.env["NCCL_SOCKET_IFNAME"] == value
