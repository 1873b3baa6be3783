"""Jobs across hosts, on the cluster `make cluster-up` makes on this machine (network
namespaces on a private bridge, a hostname each: docs/multihost.md): torchrun started
by hand on two hosts trains exactly as one host with two ranks, over the bridge; a
network setting that cannot work is refused in one line; a host lost mid-epoch fails
the job within a bound, naming that host.

Skipped, with the reason, when no cluster is up or when `.ci/run` could not start one
(``CLUSTER_UP_FAILED``). Every process a test starts runs in a session of its own,
killed at the test's end whatever happened.
"""

import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

from harness.launch import REPO, read_log, step_losses
from tests.support.cluster import ON_HOST, Host, cluster_hosts, compute_hosts, start, training_results  # noqa: F401 (fixtures)
from tests.support.cluster import TINY_TRAINING_FLAGS as FLAGS
from tests.support.torchx_cli import BIN

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

RDZV_PORT = 29400
# Seconds a run of these tests may take (they train for seconds).
RUN_TIMEOUT = 300


def _torchrun(nnodes: int, nproc: int, endpoint: str, rdzv_id: str, args: list[str], restarts: int = 0) -> list[str]:
    return [
        os.path.join(BIN, "torchrun"),
        "--nnodes",
        str(nnodes),
        "--nproc_per_node",
        str(nproc),
        "--max_restarts",
        str(restarts),
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        endpoint,
        "--rdzv_id",
        rdzv_id,
        "dlrm_main.py",
        *args,
    ]


def _two_hosts(start, hosts: list[Host], args: list[str], env: dict[str, str]) -> list[subprocess.Popen]:
    """One torchrun agent (one rank) on each host, meeting at the first host's endpoint."""
    endpoint, rdzv_id = f"{hosts[0].name}:{RDZV_PORT}", uuid.uuid4().hex
    return [start(host, _torchrun(2, 1, endpoint, rdzv_id, args), env) for host in hosts]


def _results(procs: list[subprocess.Popen]) -> list[tuple]:
    return [(proc.wait(timeout=RUN_TIMEOUT), *proc.communicate()) for proc in procs]


def test_torchrun_on_two_hosts_trains_exactly_as_one_host_with_two_ranks(compute_hosts, start, synthetic_dir, tmp_path):
    """Bit-identical losses and test metrics (gloo on CPU: the same sums in the same
    order), and the collectives went over the bridge: megabytes through each host's
    port, where the one-host run sends nothing through it."""
    args = [
        "--in_memory_binary_criteo_path",
        synthetic_dir,
        *FLAGS,
        "--batch_size",
        "256",
        "--limit_train_batches",
        "10",
    ]
    two_hosts, one_host = str(tmp_path / "two_hosts.jsonl"), str(tmp_path / "one_host.jsonl")
    before = [host.bridge_bytes() for host in compute_hosts]
    results = _results(
        _two_hosts(start, compute_hosts, [*args, "--log_path", two_hosts], {"GLOO_SOCKET_IFNAME": "eth0"})
    )
    for code, _, err in results:
        assert code == 0, err[-3000:]
    crossed = [host.bridge_bytes() - b for host, b in zip(compute_hosts, before)]

    first = compute_hosts[0]
    before_one = first.bridge_bytes()
    ((code, _, err),) = _results(
        [start(first, _torchrun(1, 2, f"127.0.0.1:{RDZV_PORT}", uuid.uuid4().hex, [*args, "--log_path", one_host]))]
    )
    assert code == 0, err[-3000:]
    one_host_bytes = first.bridge_bytes() - before_one

    records, reference = read_log(two_hosts), read_log(one_host)
    assert records[0]["world_size"] == reference[0]["world_size"] == 2
    assert len(step_losses(records)) == 10 and training_results(records) == training_results(reference)
    # Ten steps of embedding all-to-alls and gradient all-reduces move megabytes between
    # the ranks; the rendezvous alone a few kilobytes.
    assert all(n > 1_000_000 for n in crossed), crossed
    assert one_host_bytes < 50_000, one_host_bytes


def test_an_interface_the_hosts_lack_is_refused_in_one_line_on_each(compute_hosts, start, synthetic_dir):
    results = _results(
        _two_hosts(
            start,
            compute_hosts,
            ["--in_memory_binary_criteo_path", synthetic_dir, *FLAGS],
            {"GLOO_SOCKET_IFNAME": "ib0"},
        )
    )
    for host, (code, _, err) in zip(compute_hosts, results):
        assert code == 1, err[-3000:]  # torchrun's code for a failed rank (the rank's: 2)
        assert (
            f"dlrm_main.py: error: GLOO_SOCKET_IFNAME=ib0: host {host.name} has no network interface "
            "named ib0 (it has lo, eth0)\n"
        ) in err, err[-3000:]


def test_a_hostname_resolving_to_loopback_is_refused_in_a_job_across_hosts(compute_hosts, synthetic_dir):
    """The classic first multi-host failure (Debian maps the hostname to 127.0.1.1):
    a rank on a host renamed `localhost` refuses to start instead of handing the other
    hosts a loopback address."""
    first, second = compute_hosts
    env = {
        **os.environ,
        "WORLD_SIZE": "2",
        "RANK": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": first.name,
        "MASTER_PORT": str(RDZV_PORT),
    }
    env.pop("GLOO_SOCKET_IFNAME", None)
    proc = subprocess.run(
        [
            ON_HOST,
            second.name,
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname localhost && exec "$@"',
            "sh",
            sys.executable,
            "dlrm_main.py",
            "--in_memory_binary_criteo_path",
            synthetic_dir,
            *FLAGS,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.startswith(
        f"dlrm_main.py: error: this job spans hosts (MASTER_ADDR={first.name}) but this host's name localhost "
        "resolves to 127.0.0.1, which gloo would give the other hosts to reach this rank: set GLOO_SOCKET_IFNAME "
        "to the interface of the network between the hosts (this host has lo, eth0) or map localhost to that "
        "address in /etc/hosts\n"
    ), proc.stderr[-3000:]


# A host lost mid-epoch fails the job within this many seconds: its processes' sockets
# close with them, so the surviving rank's next collective fails at once ("Connection
# closed by peer") and its torchrun agent, with no restarts left, stops (measured: 1-2 s).
LOST_HOST_BOUND = 30


def test_a_host_lost_mid_epoch_fails_the_job_in_bounded_time_naming_it(compute_hosts, start, synthetic_dir, tmp_path):
    log_path = str(tmp_path / "log.jsonl")
    survivor, lost = compute_hosts
    agents = _two_hosts(
        start,
        compute_hosts,
        [
            "--in_memory_binary_criteo_path",
            synthetic_dir,
            *FLAGS,
            "--batch_size",
            "64",
            "--log_path",
            log_path,
        ],  # 768 steps
        {"GLOO_SOCKET_IFNAME": "eth0"},
    )
    deadline = time.monotonic() + RUN_TIMEOUT
    while not (os.path.exists(log_path) and len(step_losses(read_log(log_path))) >= 3):
        assert all(a.poll() is None for a in agents) and time.monotonic() < deadline, agents[0].communicate()
        time.sleep(0.1)
    for pid in lost.pids():  # every process of the host: its agent and its rank
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    code = agents[0].wait(timeout=LOST_HOST_BOUND)
    elapsed = time.monotonic() - killed
    _, err = agents[0].communicate()
    assert code == 1 and elapsed < LOST_HOST_BOUND, err[-3000:]
    failed = re.findall(
        r"dlrm_main\.py: error: rank (\d) of 2 failed at step (\d+) \(epoch 0, training\): lost "
        r"contact with the rank\(s\) on host (\S+) \((\S+)\), which probably stopped first",
        err,
    )
    assert len(failed) == 1, err[-3000:]
    assert failed[0][2:] == (lost.name, lost.address)  # gloo's connection went to the lost host's address
    assert 3 <= int(failed[0][1]) < 768
