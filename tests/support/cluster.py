"""The multi-host cluster of network namespaces (scripts/cluster_up.sh) as tests use it.

Every test that runs something on the cluster's hosts takes the `cluster_hosts`
fixture: it skips with the reason when no cluster is up, and it holds an exclusive lock
on the cluster for the test's duration. The hosts are one machine's shared state: a
test that kills a host's processes, or moves its address, must not run beside another
test's job on that host (pytest-xdist puts different files on different workers, and
several people may run tests at once).
"""

import fcntl
import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest

from harness.launch import REPO, eval_metrics, eval_record, step_losses

STATE = "/run/dlrm_cluster"  # scripts/cluster_up.sh's state directory
HOSTS_FILE = os.path.join(STATE, "hosts")
LOCK_FILE = os.path.join(STATE, "test.lock")
ON_HOST = os.path.join(REPO, "scripts", "on_host.sh")
CLUSTER_SLURM = os.path.join(REPO, "scripts", "cluster_slurm.sh")

# Training flags of a tiny model for the jobs across hosts (the data path and the
# steps are each test's): seconds of training, megabytes of collectives. Every table
# table_wise: the planner, told of two hosts of one rank, makes the small tables
# data_parallel (a collective across hosts costs it more), where one host of two ranks
# gets every table table_wise; the two plans train the same model with sums in other
# orders (test metrics 1.5e-8 apart, measured), and these tests compare the job, not the plans.
TINY_TRAINING_FLAGS = [
    "--embedding_dim",
    "16",
    "--dense_arch_layer_sizes",
    "64,16",
    "--over_arch_layer_sizes",
    "64,32,1",
    "--optimizer",
    "sgd",
    "--learning_rate",
    "0.5",
    "--seed",
    "3",
    "--log_every_n_steps",
    "1",
    "--limit_val_batches",
    "0",
    "--limit_test_batches",
    "2",
    "--sharding_type",
    "table_wise",
]


class Host(NamedTuple):
    name: str
    address: str
    bridge_port: str  # its veth on the bridge

    def bridge_bytes(self) -> int:
        """Bytes this host sent and received over the bridge so far."""
        stats = f"/sys/class/net/{self.bridge_port}/statistics"
        return sum(int(open(f"{stats}/{kind}_bytes").read()) for kind in ("rx", "tx"))

    def pids(self) -> list[int]:
        out = subprocess.run(
            ["ip", "netns", "pids", self.name], capture_output=True, text=True, check=True, timeout=30
        ).stdout
        return [int(pid) for pid in out.split()]


def read_hosts() -> list[Host]:
    """The cluster's hosts, the controller first; skips the test when there is none."""
    failed = os.environ.get("CLUSTER_UP_FAILED")
    if failed:
        pytest.skip(f"no multi-host cluster: {failed}")
    if os.geteuid() != 0:
        pytest.skip("entering the cluster's hosts needs root")
    if not os.path.exists(HOSTS_FILE):
        pytest.skip("no multi-host cluster: sudo make cluster-up starts one")
    with open(HOSTS_FILE) as f:
        hosts = [Host(*line.split()) for line in f if line.strip()]
    if len(hosts) < 3:
        pytest.skip(f"the cluster has {len(hosts)} hosts; these tests need a controller and 2 compute hosts")
    return hosts


@pytest.fixture
def cluster_hosts() -> Iterator[list[Host]]:
    """All hosts (the controller first), held exclusively while the test runs."""
    hosts = read_hosts()
    with open(LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield hosts


@pytest.fixture
def compute_hosts(cluster_hosts: list[Host]) -> list[Host]:
    """The first two compute hosts, held exclusively while the test runs."""
    return cluster_hosts[1:3]


@pytest.fixture
def slurm_hosts(cluster_hosts: list[Host]) -> list[Host]:
    """All hosts, held exclusively, with the cluster's Slurm answering: started again by
    scripts/cluster_slurm.sh (idempotent, seconds when all is up), since a test that
    killed a host's processes killed its slurmd. Skips with the script's line when
    Slurm cannot start (e.g. its packages cannot be installed)."""
    proc = subprocess.run(["bash", CLUSTER_SLURM], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        pytest.skip(f"no Slurm across the hosts: {lines[-1] if lines else f'exit code {proc.returncode}'}")
    return cluster_hosts


def sacct_states_argv(job_id: str) -> list[str]:
    """sacct listing every state each part of a job had (``-D``: the requeued runs too), in order."""
    return ["sacct", "--noheader", "-X", "-D", "--parsable2", "--format=State", "-j", job_id]


def parse_sacct_states(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines() if line.strip()]  # "CANCELLED by 0": CANCELLED


def training_results(records: list[dict[str, Any]]) -> tuple[list[float], dict[str, Any]]:
    """A run's step losses and test metrics (less its run id and time), to compare runs."""
    test = eval_metrics(eval_record(records, "test"))
    return step_losses(records), test


@pytest.fixture
def start():
    """Starts a command on a host (scripts/on_host.sh); kills what is left at the end."""
    started: list[subprocess.Popen] = []

    def on_host(host: Host, argv: list[str], env: dict[str, str] = None) -> subprocess.Popen:
        proc = subprocess.Popen(
            [ON_HOST, host.name, *argv],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        started.append(proc)
        return proc

    yield on_host
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
