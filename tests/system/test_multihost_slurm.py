"""Slurm jobs across hosts, on the Slurm cluster `make cluster-up` starts across its
network namespaces (scripts/cluster_slurm.sh: slurmctld on dlrm-ctl, a slurmd in each
compute host): torchx's `dist.ddp` and the project's `dlrm` component with `-j 2x1`
run one rank on each compute host and train exactly as two ranks on one host, over
the bridge; a sweep with `scheduler: slurm` runs its configurations across the nodes.

Every command that talks to this Slurm runs on the controller host (on_host.sh sets
SLURM_CONF): the machine's own network does not reach the cluster's. Skipped, with
the reason, when no cluster is up (``CLUSTER_UP_FAILED``) or its Slurm cannot start.
"""

import os
import subprocess

import pytest

from harness.launch import REPO, read_log, run_script
from sweeps.launch import move_slurm_logs
from sweeps.run_state import RunRecord
from tests.support.cluster import ON_HOST, TINY_TRAINING_FLAGS, Host, cluster_hosts, slurm_hosts, training_results  # noqa: F401 (fixtures)
from tests.support.sweeps import TINY_FLAGS, assert_row_matches_log, read_results, sweeps, write_sweep
from tests.support.torchx_cli import BIN, install_components

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

# Seconds a job of these tests may take from submission to its end (they train for seconds).
JOB_TIMEOUT = 300
STEPS = 10
# What each node asks: the cluster's compute hosts have 1 CPU and about 11 GB each (this
# machine's 2 CPUs and 24 GB, shared), less than the dlrm component's default preset.
NODE_CPUS, NODE_MEMORY_MB = 1, 4000
NODE_REQUEST = ["--cpu", str(NODE_CPUS), "--memMB", str(NODE_MEMORY_MB)]


def _args(synthetic_dir: str, log_path: str) -> list[str]:
    return [
        "--in_memory_binary_criteo_path",
        synthetic_dir,
        *TINY_TRAINING_FLAGS,
        "--batch_size",
        "256",
        "--limit_train_batches",
        str(STEPS),
        "--log_path",
        log_path,
    ]


@pytest.fixture(scope="module")
def one_host_results(synthetic_dir, tmp_path_factory):
    """Losses and test metrics of the same training on one host with two ranks."""
    log_path = str(tmp_path_factory.mktemp("one_host") / "log.jsonl")
    proc = run_script(["dlrm_main.py", *_args(synthetic_dir, log_path)], torchrun_nproc=2, timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return training_results(read_log(log_path))


@pytest.fixture(scope="module")
def torchx_env(tmp_path_factory):
    return install_components(str(tmp_path_factory.mktemp("components")))


def _torchx_on_controller(hosts: list[Host], args: list[str], env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [ON_HOST, hosts[0].name, os.path.join(BIN, "torchx"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
    )


def _job_nodes(hosts: list[Host], job_id: str) -> list[str]:
    """The node of each part of a job (torchx submits one heterogeneous component per node)."""
    out = subprocess.run(
        [ON_HOST, hosts[0].name, "sacct", "--noheader", "-X", "--parsable2", "--format=NodeList", "-j", job_id],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return sorted(out.split())


def _job_id(handle: str) -> str:
    assert handle.startswith("slurm://"), handle
    return handle.rsplit("/", 1)[1]


def _assert_across_both_hosts(hosts: list[Host], job_id: str, bytes_before: list[int]) -> None:
    """One part of the job on each compute host, and megabytes of collectives through
    each one's bridge port (a job that fell back to one host sends kilobytes of Slurm
    messages through them)."""
    compute = hosts[1:3]
    assert _job_nodes(hosts, job_id) == [host.name for host in compute]
    crossed = [host.bridge_bytes() - before for host, before in zip(compute, bytes_before)]
    assert all(n > 1_000_000 for n in crossed), crossed


@pytest.mark.parametrize("component", ["dist.ddp", "dlrm"])
def test_a_job_on_two_slurm_nodes_trains_exactly_as_one_host_with_two_ranks(
    component, slurm_hosts, one_host_results, torchx_env, synthetic_dir, tmp_path
):
    """`torchx run -s slurm dist.ddp -j 2x1 --script dlrm_main.py` (the interface set
    through --env) and `dlrm -j 2x1 --socket_ifname eth0`: bit-identical losses and test
    metrics to two ranks on one host (gloo on CPU: the same sums in the same order)."""
    log_path = str(tmp_path / "log.jsonl")
    if component == "dist.ddp":
        launch = [
            "dist.ddp",
            "-j",
            "2x1",
            *NODE_REQUEST,
            "--env",
            "GLOO_SOCKET_IFNAME=eth0",
            "--script",
            "dlrm_main.py",
        ]
    else:
        launch = ["dlrm", "-j", "2x1", *NODE_REQUEST, "--socket_ifname", "eth0"]
    before = [host.bridge_bytes() for host in slurm_hosts[1:3]]
    proc = _torchx_on_controller(
        slurm_hosts, ["run", "--wait", "-s", "slurm", *launch, "--", *_args(synthetic_dir, log_path)], torchx_env
    )
    job_id = _job_id(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else None
    if job_id:
        move_slurm_logs(job_id, str(tmp_path), submit_dir=REPO)
    assert proc.returncode == 0 and "Job finished: SUCCEEDED" in proc.stderr, proc.stderr[-4000:]
    records = read_log(log_path)
    assert records[0]["world_size"] == 2
    losses, test_metrics = training_results(records)
    assert len(losses) == STEPS and (losses, test_metrics) == one_host_results
    _assert_across_both_hosts(slurm_hosts, job_id, before)


def test_a_sweep_on_slurm_runs_each_configuration_across_the_nodes(slurm_hosts, synthetic_dir, tmp_path):
    sweep = write_sweep(
        tmp_path / "sweep.yaml",
        scheduler="slurm",
        nnodes=2,
        nproc_per_node=1,
        component_args={"cpu": NODE_CPUS, "memMB": NODE_MEMORY_MB, "socket_ifname": "eth0"},
        flags={**TINY_FLAGS, "in_memory_binary_criteo_path": synthetic_dir},
        grid={"learning_rate": [0.05, 0.1]},
    )
    out = str(tmp_path / "out")
    before = [host.bridge_bytes() for host in slurm_hosts[1:3]]
    proc = sweeps(["run", sweep], timeout=2 * JOB_TIMEOUT, on_host=[ON_HOST, slurm_hosts[0].name])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_results(out)
    assert list(rows) == ["learning_rate=0.05", "learning_rate=0.1"]
    for name, row in rows.items():
        run_dir = os.path.join(out, name)
        assert_row_matches_log(row, os.path.join(run_dir, "log.jsonl"))
        job_id = _job_id(RunRecord.read(run_dir).app_handle)
        assert _job_nodes(slurm_hosts, job_id) == [host.name for host in slurm_hosts[1:3]]
    # Both runs' collectives crossed the bridge (each moves megabytes; Slurm's messages kilobytes).
    crossed = [host.bridge_bytes() - b for host, b in zip(slurm_hosts[1:3], before)]
    assert all(n > 2_000_000 for n in crossed), crossed
