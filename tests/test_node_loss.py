"""A host lost mid-run and replaced, on the cluster `make cluster-up` makes
(docs/multihost.md): under `torchrun --max_restarts 1`, with a checkpoint directory
both hosts see, every process of one compute host is killed; the survivor's agent
restarts its rank, an agent started again on the lost host (a replacement machine)
joins, and the job resumes from the newest complete checkpoint and ends with the
losses and test metrics of a run never interrupted. Killed mid-epoch, the replacement
comes back with another address; killed during a checkpoint save, the partial
checkpoint is passed over. (Without restarts the job fails in bounded time naming
the lost host: tests/test_multihost.py.)

Skipped, with the reason, when no cluster is up (tests/support/cluster.py).
"""

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from tests.support.cluster import Host, cluster_hosts, compute_hosts, start  # noqa: F401 (fixtures)
from tests.support.cluster import TINY_TRAINING_FLAGS, read_hosts
from harness.launch import REPO, eval_metrics, eval_record, free_port, read_log
from tests.test_multihost import RDZV_PORT, RUN_TIMEOUT, _torchrun
from training.checkpoint import COMPLETE_MARKER, complete_checkpoints

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

STEPS, EVERY = 50, 10  # one epoch; a checkpoint every 10 steps
# What a job restarted across hosts needs (docs/multihost.md): the ranks' store per
# attempt, not the agents' shared one, which a replaced host cannot rejoin.
RESTART_ENV = {"GLOO_SOCKET_IFNAME": "eth0", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def _args(data: str, ckpt: str, log: str) -> list[str]:
    return ["--in_memory_binary_criteo_path", data, *TINY_TRAINING_FLAGS, "--batch_size", "64", "--limit_train_batches",
            str(STEPS), "--checkpoint_dir", ckpt, "--checkpoint_every_n_steps", str(EVERY), "--resume",
            "--log_path", log]


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
    agents = [subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True) for _ in range(2)]
    try:
        for agent in agents:
            _, err = agent.communicate(timeout=RUN_TIMEOUT)
            assert agent.returncode == 0, err[-3000:]
    finally:
        for agent in agents:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGKILL)
    return read_log(log)


def _lose_and_replace(start, hosts: list[Host], args: list[str], lose_when: Callable[[], bool],
                      while_down: Callable[[], None]) -> list[tuple]:
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


def _assert_resumed_as_uninterrupted(results: list[tuple], lost: Host, resumed_from: str, log: str,
                                     uninterrupted: list[dict]) -> None:
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
    length = subprocess.run(["ip", "-n", host.name, "-4", "-o", "addr", "show", "dev", "eth0"], check=True,
                            capture_output=True, text=True, timeout=30).stdout.split()[3].split("/")[1]

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
        cluster_hosts, compute_hosts, start, synthetic_dir, tmp_path, uninterrupted):
    ckpt, log = str(tmp_path / "ckpt"), str(tmp_path / "log.jsonl")
    survivor, lost = compute_hosts
    moved_to = lost.address.rsplit(".", 1)[0] + ".200"  # cluster_up.sh gives hosts .10 to .109
    assert moved_to not in {host.address for host in cluster_hosts}
    newest: list[str] = []

    def past_step_25() -> bool:  # two checkpoints done, the third not begun
        return os.path.exists(log) and max(_losses(read_log(log)), default=0) >= 25

    with contextlib.ExitStack() as moved:
        def come_back_elsewhere() -> None:
            newest.extend(complete_checkpoints(ckpt)[-1:])  # none completes without the lost rank
            moved.enter_context(_address_moved(lost, moved_to))

        results = _lose_and_replace(start, compute_hosts, _args(synthetic_dir, ckpt, log), past_step_25,
                                    come_back_elsewhere)
        assert open("/etc/hosts").read().count(f"{moved_to} {lost.name}\n") == 1
    assert newest and newest[0] < os.path.join(ckpt, f"step_{STEPS:09d}")
    _assert_resumed_as_uninterrupted(results, lost, newest[0], log, uninterrupted)
    assert f"{lost.address} {lost.name}\n" in open("/etc/hosts").read()


def test_a_host_lost_during_a_checkpoint_save_resumes_from_the_previous_one(compute_hosts, start, synthetic_dir,
                                                                            tmp_path, uninterrupted):
    """The save of step 40 blocks on the lost host's rank: its RNG file's temporary
    name is a FIFO nobody reads (training/checkpoint.py writes rank_R.pt.tmp, then
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
