"""The torchx CLI for real: local launches that train, Slurm and Kubernetes dry runs."""

import os
import re

import pytest

from harness.launch import REPO, eval_record, read_log
from tests.support.doc_commands import commands_starting, replaced, with_flags
from tests.support.torchx_cli import (
    SMALL_TRAINING_FLAGS,
    install_components,
    kubernetes_job,
    option,
    sbatch_groups,
    scheduler_request,
    torchrun_argv,
    torchx,
)

pytestmark = pytest.mark.slow  # every test runs the torchx CLI

TRAINING_FLAGS = ["--batch_size", "2048", "--epochs", "1", "--learning_rate", "15.0"]


@pytest.fixture(scope="module")
def torchx_env(tmp_path_factory):
    return install_components(str(tmp_path_factory.mktemp("components")))


def _assert_trained(proc, log_path=None):
    """State SUCCEEDED and the test AUROC line in the streamed logs."""
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Job finished: SUCCEEDED" in proc.stderr, proc.stderr[-4000:]
    auroc = re.findall(r"test: AUROC (\d\.\d+) \| log loss", proc.stderr)
    assert len(auroc) == 1, proc.stderr[-4000:]  # printed by rank 0 only
    if log_path:
        test = eval_record(read_log(log_path), "test")
        assert test["num_samples"] == 2 * 2 * 256  # 2 ranks x 2 batches of 256
        assert f"{test['auroc']:.4f}" == auroc[0]


def test_builtins_lists_our_components_and_torchx_ones(torchx_env):
    proc = torchx(["builtins"], torchx_env)
    assert proc.returncode == 0, proc.stderr
    names = re.findall(r"^\s*\d+\. (\S+)$", proc.stdout, flags=re.M)
    assert {"dlrm", "dcnv2", "preprocess_criteo", "dist.ddp", "utils.echo"} <= set(names), proc.stdout


def test_dist_ddp_local_cwd_trains(torchx_env, synthetic_dir, tmp_path):
    """The users' command: torchx run -s local_cwd dist.ddp -j 1x2 --script dlrm_main.py -- ..."""
    proc = torchx(
        [
            "run",
            "-s",
            "local_cwd",
            "-cfg",
            f"log_dir={tmp_path}",
            "dist.ddp",
            "-j",
            "1x2",
            "--script",
            "dlrm_main.py",
            "--",
            "--in_memory_binary_criteo_path",
            synthetic_dir,
            *SMALL_TRAINING_FLAGS,
        ],
        torchx_env,
    )
    _assert_trained(proc)


def test_dlrm_component_local_cwd_trains(torchx_env, synthetic_dir, tmp_path):
    log_path = str(tmp_path / "run.jsonl")
    proc = torchx(
        [
            "run",
            "-s",
            "local_cwd",
            "-cfg",
            f"log_dir={tmp_path}",
            "dlrm",
            "-j",
            "1x2",
            "--data_dir",
            synthetic_dir,
            "--",
            *SMALL_TRAINING_FLAGS,
            "--log_path",
            log_path,
        ],
        torchx_env,
    )
    _assert_trained(proc, log_path)
    config = next(r for r in read_log(log_path) if r["event"] == "config")
    assert config["world_size"] == 2
    assert config["data"]["source_options"]["in_memory_binary_criteo_path"] == synthetic_dir  # from --data_dir


def test_documented_default_component_line_trains(torchx_env, synthetic_dir, tmp_path):
    """docs/launching.md's `torchx run -s local_cwd -- ... -- <flags>` (.torchxconfig's
    default component): torchx consumes the first `--`, so a single one handed the
    training flags to dlrm's own parser, which refused them."""
    (documented,) = commands_starting("docs/launching.md", "torchx", "run", "-s", "local_cwd", "--")
    argv = replaced(documented, {"data_cache/synthetic_criteo": synthetic_dir})
    log_path = str(tmp_path / "run.jsonl")
    argv = with_flags(argv, [*SMALL_TRAINING_FLAGS, "--log_path", log_path])
    proc = torchx([*argv[1:4], "-cfg", f"log_dir={tmp_path}", *argv[4:]], torchx_env)
    _assert_trained(proc, log_path)


def test_component_runs_from_outside_the_repository(torchx_env, synthetic_dir, tmp_path):
    """From another directory (no .torchxconfig, no dlrm_main.py there) the ranks find
    the installed entry point; they ran `dlrm_main.py` relative to the working
    directory and failed with "can't open file"."""
    env = dict(torchx_env)
    # The editable install of `make install` puts the repository on every process's path.
    env["PYTHONPATH"] = os.pathsep.join([torchx_env["PYTHONPATH"], REPO])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = torchx(
        [
            "run",
            "-s",
            "local_cwd",
            "-cfg",
            f"log_dir={tmp_path}",
            "dlrm",
            "-j",
            "1x2",
            "--data_dir",
            synthetic_dir,
            "--",
            *SMALL_TRAINING_FLAGS,
        ],
        env,
        cwd=str(elsewhere),
    )
    _assert_trained(proc)


@pytest.mark.parametrize(
    "component",
    [
        [
            "dlrm",
            "-j",
            "2x8",
            "-h",
            "a100x8",
            "--data_dir",
            "/fsx/criteo",
            "--checkpoint_dir",
            "/fsx/ckpt",
            "--max_retries",
            "3",
        ],
        [
            "aws_component.py:run_dlrm_main",
            "--num_trainers=16",
            "-h",
            "a100x8",
            "--data_dir",
            "/fsx/criteo",
            "--max_retries",
            "3",
        ],
    ],
)
def test_slurm_dryrun(torchx_env, component):
    proc = torchx(
        ["run", "--dryrun", "-s", "slurm", "-cfg", "partition=train,time=5:00:00", *component, "--", *TRAINING_FLAGS],
        torchx_env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    request = scheduler_request(proc.stdout)
    assert "export TORCHX_MAX_RETRIES=3" in request  # requeued up to 3 times
    groups = sbatch_groups(request)
    assert len(groups) == 2  # one heterogeneous-job group per node
    for group in groups:
        # One torchrun agent per node, which starts 8 ranks; a100x8: 96 CPUs, 8 GPUs,
        # 96% of 1024 GiB.
        assert {
            "--partition=train",
            "--time=5:00:00",
            "--ntasks-per-node=1",
            "--cpus-per-task=96",
            "--gpus-per-task=8",
            f"--mem={int(1024 * 1024 * 0.96)}",
        } <= set(group["options"]), group
        argv = group["torchrun"]
        assert option(argv, "--nnodes") == "2" and option(argv, "--nproc_per_node") == "8"
        assert option(argv, "--rdzv_backend") == "c10d"
        assert option(argv, "--rdzv_endpoint") == "${SLURM_JOB_NODELIST_HET_GROUP_0:=localhost}:29500"
        script = argv.index("dlrm_main")
        resume = ["--checkpoint_dir", "/fsx/ckpt", "--resume"] if "--checkpoint_dir" in component else []
        assert argv[script + 1 :] == [*resume, "--in_memory_binary_criteo_path", "/fsx/criteo", *TRAINING_FLAGS]


def test_kubernetes_dryrun(torchx_env):
    proc = torchx(
        [
            "run",
            "--dryrun",
            "--workspace",
            "",
            "-s",
            "kubernetes",
            "-cfg",
            "namespace=recsys",
            "dcnv2",
            "-j",
            "2x8",
            "-h",
            "aws_p4d",
            "--image",
            "registry.example/dlrm:1",
            "--data_dir",
            "/fsx/criteo",
            "--checkpoint_dir",
            "/fsx/ckpt",
            "--mounts",
            "type=volume,src=logs-claim,dst=/logs",
            "--env",
            "NCCL_DEBUG=INFO",
            "--max_retries",
            "2",
            "--",
            *TRAINING_FLAGS,
        ],
        torchx_env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = kubernetes_job(scheduler_request(proc.stdout))
    assert job["kind"] == "Job" and job["spec"]["queue"] == "default"  # from .torchxconfig
    assert job["spec"]["maxRetry"] == 2
    tasks = job["spec"]["tasks"]
    assert len(tasks) == 2 and all(t["replicas"] == 1 for t in tasks)  # one pod per node
    for task in tasks:
        pod = task["template"]["spec"]
        assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p4d.24xlarge"}
        (container,) = pod["containers"]
        assert container["image"] == "registry.example/dlrm:1"
        limits = container["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "8" and limits["vpc.amazonaws.com/efa"] == "4"
        assert limits["cpu"] == "96000m"
        assert {"name": "NCCL_DEBUG", "value": "INFO"} in container["env"]
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert mounts["/fsx/criteo"]["readOnly"] is True
        assert mounts["/fsx/ckpt"]["readOnly"] is False
        assert volumes[mounts["/fsx/criteo"]["name"]]["hostPath"] == {"path": "/fsx/criteo"}
        assert volumes[mounts["/logs"]["name"]]["persistentVolumeClaim"] == {"claimName": "logs-claim"}
        argv = torchrun_argv(container["command"])
        assert option(argv, "--nnodes") == "2" and option(argv, "--nproc_per_node") == "8"
        script = argv.index("dcnv2_main")
        assert argv[script + 1 :] == [
            "--checkpoint_dir",
            "/fsx/ckpt",
            "--resume",
            "--in_memory_binary_criteo_path",
            "/fsx/criteo",
            *TRAINING_FLAGS,
        ]


def test_aws_component_rejects_bad_trainer_counts(torchx_env):
    proc = torchx(
        [
            "run",
            "--dryrun",
            "-s",
            "slurm",
            "aws_component.py:run_dlrm_main",
            "--num_trainers=12",
            "--",
            *TRAINING_FLAGS,
        ],
        torchx_env,
    )
    assert proc.returncode != 0
    # torchx prints the parameter's one line, with no traceback.
    last_line = proc.stderr.strip().splitlines()[-1]
    assert last_line.strip() == (
        "--num_trainers 12: more than 8 trainers span nodes of 8 and must be a multiple of 8 (e.g. 8 or 16)"
    ), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_preprocess_component_dryrun(torchx_env):
    proc = torchx(
        [
            "run",
            "--dryrun",
            "-s",
            "slurm",
            "preprocess_criteo",
            "--input_dir",
            "/fsx/raw",
            "--output_dir",
            "/fsx/criteo",
            "--",
            "--frequency_threshold",
            "3",
        ],
        torchx_env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    request = scheduler_request(proc.stdout)
    (group,) = [line for line in request.splitlines() if line.startswith("#SBATCH")]
    assert "--cpus-per-task=64" in group  # cpu_large
    assert (
        "python -m data.preprocess_criteo --input_dir /fsx/raw --output_dir /fsx/criteo "
        "--dataset_name criteo_1t --workers 24 --frequency_threshold 3"
    ) in request
