"""A host lost mid-run and replaced, on the cluster `make cluster-up` makes
(docs/multihost.md): under `torchrun --max_restarts 1`, with a checkpoint directory
both hosts see, every process of one compute host is killed; the survivor's agent
restarts its rank, an agent started again on the lost host (a replacement machine)
joins, and the job resumes from the newest complete checkpoint and ends with the
losses and test metrics of a run never interrupted. Killed mid-epoch, the replacement
comes back with another address; killed during a checkpoint save, the partial
checkpoint is passed over. (Without restarts the job fails in bounded time naming
the lost host: tests/system/test_multihost.py.)

The same on the cluster's Slurm (scripts/cluster_slurm.sh): a 2-node job of the dlrm
component loses a host, slurmd with it; Slurm marks the node down and requeues the job
(torchx's batch script asks `--requeue`), the host comes back at another address, and
the requeued job resumes on it from the newest complete checkpoint, ending as if never
interrupted. Submitted with SBATCH_NO_REQUEUE=1, the job fails instead, in bounded time,
naming the lost host.

Skipped, with the reason, when no cluster is up (tests/support/cluster.py).
"""

import contextlib
import glob
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from checkpoints.directory import COMPLETE_MARKER, complete_checkpoints
from harness.launch import REPO, eval_metrics, eval_record, free_port, read_log
from sweeps.launch import move_slurm_logs
from tests.support.cluster import (  # noqa: F401 (fixtures)
    ON_HOST,
    TINY_TRAINING_FLAGS,
    Host,
    cluster_hosts,
    compute_hosts,
    parse_sacct_states,
    read_hosts,
    sacct_states_argv,
    slurm_hosts,
    start,
)
from tests.system.test_multihost import RDZV_PORT, RUN_TIMEOUT, _torchrun
from tests.system.test_multihost_slurm import (
    NODE_REQUEST,
    _job_id,
    _torchx_on_controller,
    torchx_env,  # noqa: F401 (fixture)
)

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

STEPS, EVERY = 50, 10  # one epoch; a checkpoint every 10 steps
# What a job restarted across hosts needs (docs/multihost.md): the ranks' store per
# attempt, not the agents' shared one, which a replaced host cannot rejoin.
RESTART_ENV = {"GLOO_SOCKET_IFNAME": "eth0", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def _args(data: str, ckpt: str, log: str) -> list[str]:
    return [
        "--in_memory_binary_criteo_path",
        data,
        *TINY_TRAINING_FLAGS,
        "--batch_size",
        "64",
        "--limit_train_batches",
        str(STEPS),
        "--checkpoint_dir",
        ckpt,
        "--checkpoint_every_n_steps",
        str(EVERY),
        "--resume",
        "--log_path",
        log,
    ]


def _losses(records: list[dict]) -> dict[int, float]:
    """Step -> loss; a step trained again after the resume overwrites the first time's."""
    return {r["step"]: r["loss"] for r in records if r["event"] == "train"}


def _test_metrics(records: list[dict]) -> dict:
    return eval_metrics(eval_record(records, "test"))


@pytest.fixture(scope="module")
def uninterrupted(synthetic_dir, tmp_path_factory) -> list[dict]:
    """The same flags never interrupted, by two agents of one rank each meeting on
    this machine's loopback (no cluster needed). Not one agent with two ranks: the
    planner then sees one host of two ranks, not two hosts, and shards differently
    (2 tables data-parallel instead of 4): 11 of 80 steps' losses come out a last bit apart."""
    read_hosts()  # skips first when there is no cluster: a module fixture is set up before the tests' own
    tmp = tmp_path_factory.mktemp("uninterrupted")
    log = str(tmp / "log.jsonl")
    argv = _torchrun(2, 1, f"127.0.0.1:{free_port()}", uuid.uuid4().hex, _args(synthetic_dir, str(tmp / "ckpt"), log))
    agents = [
        subprocess.Popen(
            argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        for _ in range(2)
    ]
    try:
        for agent in agents:
            _, err = agent.communicate(timeout=RUN_TIMEOUT)
            assert agent.returncode == 0, err[-3000:]
    finally:
        for agent in agents:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGKILL)
    return read_log(log)


def _lose_and_replace(
    start, hosts: list[Host], args: list[str], lose_when: Callable[[], bool], while_down: Callable[[], None]
) -> list[tuple]:
    """Starts the job on both hosts (the rendezvous on the first), kills every process
    of the second once ``lose_when()``, runs ``while_down()``, starts the second host's
    agent again; returns (exit code, stdout, stderr) of the survivor and the replacement."""
    survivor, lost = hosts
    argv = _torchrun(2, 1, f"{survivor.name}:{RDZV_PORT}", uuid.uuid4().hex, args, restarts=1)
    agents = [start(host, argv, RESTART_ENV) for host in hosts]
    deadline = time.monotonic() + RUN_TIMEOUT
    while not lose_when():
        assert all(a.poll() is None for a in agents) and time.monotonic() < deadline, agents[0].communicate()
        time.sleep(0.05)
    for pid in lost.pids():  # its agent and its rank
        os.kill(pid, signal.SIGKILL)
    agents[1].communicate(timeout=30)
    while_down()
    replacement = start(lost, argv, RESTART_ENV)
    return [(proc.wait(timeout=RUN_TIMEOUT), *proc.communicate()) for proc in (agents[0], replacement)]


def _assert_resumed_as_uninterrupted(
    results: list[tuple], lost: Host, resumed_from: str, log: str, uninterrupted: list[dict]
) -> None:
    (code, out, err), (replacement_code, _, replacement_err) = results
    assert code == 0 and replacement_code == 0, (err[-3000:], replacement_err[-3000:])
    # The survivor's rank saw its peer go, named the host, and its agent restarted it.
    assert f"lost contact with the rank(s) on host {lost.name} ({lost.address})" in err, err[-3000:]
    # Rank 0 (on the survivor: the first host in the rendezvous's order) says where it resumed.
    assert out.count("resumed from ") == 1 and f"resumed from {resumed_from}: " in out, out[-3000:]
    records = read_log(log)
    assert _losses(records) == _losses(uninterrupted) and len(_losses(records)) == STEPS
    assert _test_metrics(records) == _test_metrics(uninterrupted)


@contextlib.contextmanager
def _address_moved(host: Host, address: str) -> Iterator[None]:
    """Gives ``host`` ``address`` on the bridge instead of its own, and /etc/hosts the
    line cluster_up.sh would write for it (in place: the file may be a bind mount);
    puts both back at the end."""
    length = (
        subprocess.run(
            ["ip", "-n", host.name, "-4", "-o", "addr", "show", "dev", "eth0"],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )
        .stdout.split()[3]
        .split("/")[1]
    )

    def move(old: str, new: str) -> None:
        subprocess.run(["ip", "-n", host.name, "addr", "del", f"{old}/{length}", "dev", "eth0"], check=True, timeout=30)
        subprocess.run(["ip", "-n", host.name, "addr", "add", f"{new}/{length}", "dev", "eth0"], check=True, timeout=30)
        with open("/etc/hosts", "r+") as f:
            lines = [f"{new} {host.name}\n" if line == f"{old} {host.name}\n" else line for line in f]
            f.seek(0)
            f.writelines(lines)
            f.truncate()

    move(host.address, address)
    try:
        yield
    finally:
        move(address, host.address)


def test_a_host_lost_mid_epoch_and_replaced_at_another_address_resumes_as_if_uninterrupted(
    cluster_hosts, compute_hosts, start, synthetic_dir, tmp_path, uninterrupted
):
    ckpt, log = str(tmp_path / "ckpt"), str(tmp_path / "log.jsonl")
    survivor, lost = compute_hosts
    moved_to = lost.address.rsplit(".", 1)[0] + ".200"  # cluster_up.sh gives hosts .10 to .109
    assert moved_to not in {host.address for host in cluster_hosts}
    newest: list[str] = []

    def past_step_25() -> bool:  # two checkpoints done (a third may complete before the kill lands)
        return os.path.exists(log) and max(_losses(read_log(log)), default=0) >= 25

    with contextlib.ExitStack() as moved:

        def come_back_elsewhere() -> None:
            newest.extend(complete_checkpoints(ckpt)[-1:])  # none completes without the lost rank
            moved.enter_context(_address_moved(lost, moved_to))

        results = _lose_and_replace(
            start, compute_hosts, _args(synthetic_dir, ckpt, log), past_step_25, come_back_elsewhere
        )
        assert open("/etc/hosts").read().count(f"{moved_to} {lost.name}\n") == 1
    assert newest and newest[0] < os.path.join(ckpt, f"step_{STEPS:09d}")
    _assert_resumed_as_uninterrupted(results, lost, newest[0], log, uninterrupted)
    assert f"{lost.address} {lost.name}\n" in open("/etc/hosts").read()


def test_a_host_lost_during_a_checkpoint_save_resumes_from_the_previous_one(
    compute_hosts, start, synthetic_dir, tmp_path, uninterrupted
):
    """The save of step 40 blocks on the lost host's rank: its RNG file's temporary
    name is a FIFO nobody reads (checkpoints/save.py writes rank_R.pt.tmp, then
    renames it), so the kill lands inside the save whatever the timing."""
    ckpt, log = str(tmp_path / "ckpt"), str(tmp_path / "log.jsonl")
    _, lost = compute_hosts
    partial = os.path.join(ckpt, f"step_{4 * EVERY:09d}")
    os.makedirs(partial)
    blocker = os.path.join(partial, "rank_1.pt.tmp")  # rank 1: the second host's, in the rendezvous's order
    os.mkfifo(blocker)

    def saving_step_40() -> bool:  # every rank's shards written (.metadata is DCP's last file)
        return os.path.exists(os.path.join(partial, ".metadata"))

    def unblock() -> None:
        assert not os.path.exists(os.path.join(partial, COMPLETE_MARKER))
        os.unlink(blocker)

    results = _lose_and_replace(start, compute_hosts, _args(synthetic_dir, ckpt, log), saving_step_40, unblock)
    _assert_resumed_as_uninterrupted(results, lost, os.path.join(ckpt, f"step_{3 * EVERY:09d}"), log, uninterrupted)


# From a host's loss to Slurm's verdict on its job: the cluster's SlurmdTimeout (30 s,
# scripts/cluster_slurm.sh) plus slurmctld's ping of the nodes (every 10 s) plus margin.
# Measured: 32-37 s.
NODE_FAIL_BOUND = 90


def _on_controller(hosts: list[Host], *argv: str) -> str:
    return subprocess.run(
        [ON_HOST, hosts[0].name, *argv], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def _job_parts(hosts: list[Host], job_id: str) -> list[dict[str, str]]:
    """`scontrol show job` of each part of a job (torchx submits one heterogeneous part per node)."""
    out = _on_controller(hosts, "scontrol", "show", "job", job_id)
    return [dict(re.findall(r"(\w+)=(\S*)", part)) for part in out.split("\n\n") if part.strip()]


def _sacct_states(hosts: list[Host], job_id: str) -> list[str]:
    return parse_sacct_states(_on_controller(hosts, *sacct_states_argv(job_id)))


def _node_state(hosts: list[Host], node: str) -> str:
    return _on_controller(hosts, "sinfo", "--noheader", "-N", "-n", node, "-o", "%t").strip()


def _wait_until(what: str, predicate: Callable[[], bool], timeout: float, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not after {timeout} s"
        time.sleep(every)


def _submit_and_lose_a_host(
    hosts: list[Host],
    torchx_env: dict[str, str],
    args: list[str],
    log: str,
    lose_after_step: int,
    max_retries: int,
    env: dict[str, str] | None = None,
) -> tuple[str, Host, float]:
    """Submits the dlrm component as a 2-node job (one rank per compute host) from the
    controller; once rank 0 logged ``lose_after_step``, kills every process of the host
    of the job's second part (its rank, its slurmstepd, its slurmd), which is not the
    host running the batch script. Returns (job id, lost host, time of the kill)."""
    proc = _torchx_on_controller(
        hosts,
        [
            "run",
            "-s",
            "slurm",
            "dlrm",
            "-j",
            "2x1",
            *NODE_REQUEST,
            "--socket_ifname",
            "eth0",
            "--max_retries",
            str(max_retries),
            "--",
            *args,
        ],
        {**torchx_env, **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    job_id = _job_id(proc.stdout.strip().splitlines()[-1])

    def past(step: int) -> bool:
        return os.path.exists(log) and max(_losses(read_log(log)), default=0) >= step

    _wait_until(f"job {job_id} training", lambda: past(1), RUN_TIMEOUT)
    parts = _job_parts(hosts, job_id)
    assert [part["JobState"] for part in parts] == ["RUNNING", "RUNNING"], parts
    (lost,) = [host for host in hosts if host.name == parts[1]["NodeList"]]
    assert lost.name != parts[0]["BatchHost"]
    # Polled often: a step takes a tenth of a second, and the kill must land before the next checkpoint.
    _wait_until(f"step {lose_after_step} of job {job_id}", lambda: past(lose_after_step), RUN_TIMEOUT, every=0.05)
    for pid in lost.pids():
        os.kill(pid, signal.SIGKILL)
    return job_id, lost, time.monotonic()


def _slurm_output(directory: str, job_id: str, suffix: str) -> str:
    """The batch script's output (``slurm-ID.out``) or its nodes' (``slurm-ID-*.out``/``.err``)."""
    return "".join(open(path).read() for path in sorted(glob.glob(os.path.join(directory, f"slurm-{job_id}{suffix}"))))


def test_a_host_lost_under_slurm_requeues_the_job_which_resumes_on_it_back_at_another_address(
    slurm_hosts, torchx_env, synthetic_dir, tmp_path, uninterrupted
):
    """Slurm marks the silent node down and requeues the job (its `--requeue`); the
    host comes back at another address (its address and /etc/hosts line moved, as in
    the torchrun case above): its slurmd registers, the node returns by itself
    (ReturnToService=2), and slurmctld and srun reach it at its new address (nodes
    addressed by name, NoAddrCache). The requeued job runs a rank there and resumes
    from the newest checkpoint the first run completed (step 10 or later: the kill
    lands some steps after rank 0 logged step 15, as the test polls the log)."""
    ckpt, log = str(tmp_path / "ckpt"), str(tmp_path / "log.jsonl")
    job_id, lost, _ = _submit_and_lose_a_host(
        slurm_hosts, torchx_env, _args(synthetic_dir, ckpt, log), log, lose_after_step=15, max_retries=1
    )
    moved_to = lost.address.rsplit(".", 1)[0] + ".200"  # cluster_up.sh gives hosts .10 to .109
    try:

        def requeued() -> bool:
            parts = _job_parts(slurm_hosts, job_id)
            return all(part["JobState"] == "PENDING" and part["Restarts"] == "1" for part in parts)

        _wait_until("the job requeued", requeued, NODE_FAIL_BOUND)
        requeued_at = time.monotonic()
        assert _node_state(slurm_hosts, lost.name) == "down*"
        # Every rank of the first run is gone: its newest complete checkpoint is final.
        newest = complete_checkpoints(ckpt)[-1]
        assert os.path.join(ckpt, f"step_{EVERY:09d}") <= newest < os.path.join(ckpt, f"step_{STEPS:09d}")
        with _address_moved(lost, moved_to):
            # The host is back: its slurmd starts (and daemonizes) as at its boot.
            subprocess.run(
                [ON_HOST, lost.name, "/usr/sbin/slurmd"],
                check=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            _wait_until(f"{lost.name} idle again", lambda: _node_state(slurm_hosts, lost.name) == "idle", 60)
            before = lost.bridge_bytes()
            # Slurm holds a requeued job for its credentials' lifetime (120 s): released at
            # once, but not in the second of the requeue, which slurmd compares with the launch
            # credential's to the second ("Job credential revoked": the job ends FAILED unrun).
            time.sleep(max(0.0, requeued_at + 2 - time.monotonic()))
            _on_controller(slurm_hosts, "scontrol", "update", f"JobId={job_id}", "StartTime=now")
            _wait_until(
                "the requeued job's end",
                lambda: _sacct_states(slurm_hosts, job_id)[-1] in ("COMPLETED", "FAILED"),
                RUN_TIMEOUT,
            )
            # Its rank's collectives crossed the host's bridge port, the host having no address but moved_to.
            assert lost.bridge_bytes() - before > 1_000_000
    finally:
        subprocess.run([ON_HOST, slurm_hosts[0].name, "scancel", job_id], timeout=60)
        move_slurm_logs(job_id, str(tmp_path), submit_dir=REPO)
    assert _sacct_states(slurm_hosts, job_id) == ["NODE_FAIL", "NODE_FAIL", "COMPLETED", "COMPLETED"]
    assert (
        lost.name
        in _on_controller(
            slurm_hosts, "sacct", "--noheader", "-X", "--parsable2", "--format=NodeList", "-j", job_id
        ).split()
    )
    assert f"{lost.address} {lost.name}\n" in open("/etc/hosts").read()
    out = _slurm_output(str(tmp_path), job_id, "-*.out")
    assert out.count("resumed from ") == 1 and f"resumed from {newest}: " in out, out[-3000:]
    records = read_log(log)
    assert _losses(records) == _losses(uninterrupted) and len(_losses(records)) == STEPS
    assert _test_metrics(records) == _test_metrics(uninterrupted)


def test_a_host_lost_under_slurm_without_requeue_fails_the_job_in_bounded_time_naming_it(
    slurm_hosts, torchx_env, synthetic_dir, tmp_path
):
    """SBATCH_NO_REQUEUE=1 overrides the `--requeue` of torchx's batch script: the job
    ends NODE_FAIL within NODE_FAIL_BOUND of the loss, srun names the node and the
    surviving rank names the host and its address."""
    ckpt, log = str(tmp_path / "ckpt"), str(tmp_path / "log.jsonl")
    job_id, lost, killed_at = _submit_and_lose_a_host(
        slurm_hosts,
        torchx_env,
        _args(synthetic_dir, ckpt, log),
        log,
        lose_after_step=5,
        max_retries=0,
        env={"SBATCH_NO_REQUEUE": "1"},
    )
    try:
        _wait_until(
            "the job's end", lambda: _sacct_states(slurm_hosts, job_id) == ["NODE_FAIL", "NODE_FAIL"], NODE_FAIL_BOUND
        )
        assert time.monotonic() - killed_at < NODE_FAIL_BOUND
        assert [part["Restarts"] for part in _job_parts(slurm_hosts, job_id)] == ["0", "0"]
    finally:
        subprocess.run([ON_HOST, slurm_hosts[0].name, "scancel", job_id], timeout=60)
        move_slurm_logs(job_id, str(tmp_path), submit_dir=REPO)
    assert f"srun: error: Node failure on {lost.name}" in _slurm_output(str(tmp_path), job_id, ".out")
    errors = _slurm_output(str(tmp_path), job_id, "-*.err")
    assert f"lost contact with the rank(s) on host {lost.name} ({lost.address})" in errors, errors[-3000:]
