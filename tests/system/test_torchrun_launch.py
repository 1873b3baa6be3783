"""torchrun as users call it: two nodes on localhost through c10d rendezvous, a node
that cannot take part, a rank stopped mid-training (which rank, which step, exit
codes), and the project's launcher stopped."""

import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from harness.launch import REPO, eval_record, free_port, read_log, step_losses
from tests.support.doc_commands import commands_starting, replaced, with_flags
from tests.support.torchx_cli import BIN
from training.recipes import STABLE_OPTIMIZER

pytestmark = pytest.mark.slow  # every test starts torchrun

FLAGS = [
    "--batch_size",
    "256",
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
]


def _torchrun(
    nnodes: int, nproc: int, port: int, rdzv_id: str, args: list[str], env: dict[str, str] | None = None
) -> subprocess.Popen:
    """The users' torchrun command line (with a free port instead of the default)."""
    cmd = [
        os.path.join(BIN, "torchrun"),
        "--nnodes",
        str(nnodes),
        "--nproc_per_node",
        str(nproc),
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"localhost:{port}",
        "--rdzv_id",
        rdzv_id,
        "--role",
        "trainer",
        "dlrm_main.py",
        *args,
    ]
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else {**os.environ, **env},
    )


def test_two_nodes_one_process_each_match_one_node_with_two(synthetic_dir, tmp_path):
    """Two torchrun agents (--nnodes 2, one process each) meet through c10d rendezvous,
    train and finish; their losses are those of one node with two processes (the
    tables start from the same weights whatever the placement)."""
    limits = ["--limit_train_batches", "20", "--limit_val_batches", "0", "--limit_test_batches", "2"]
    two_nodes, one_node = str(tmp_path / "two_nodes.jsonl"), str(tmp_path / "one_node.jsonl")
    port, rdzv_id = free_port(), uuid.uuid4().hex
    nodes = [
        _torchrun(
            2,
            1,
            port,
            rdzv_id,
            ["--in_memory_binary_criteo_path", synthetic_dir, *FLAGS, *limits, "--log_path", two_nodes],
        )
        for _ in range(2)
    ]
    outputs = [node.communicate(timeout=600) for node in nodes]
    for node, (_, err) in zip(nodes, outputs):
        assert node.returncode == 0, err[-3000:]
    # Rank 0 prints, whichever agent got it.
    assert sum("test: AUROC" in out for out, _ in outputs) == 1
    records = read_log(two_nodes)
    assert records[0]["world_size"] == 2

    reference = _torchrun(
        1,
        2,
        free_port(),
        "54321",
        ["--in_memory_binary_criteo_path", synthetic_dir, *FLAGS, *limits, "--log_path", one_node],
    )
    _, err = reference.communicate(timeout=600)
    assert reference.returncode == 0, err[-3000:]
    losses_two_nodes, losses_one_node = step_losses(records), step_losses(read_log(one_node))
    assert len(losses_two_nodes) == len(losses_one_node) == 20
    assert losses_two_nodes[-1] < losses_two_nodes[0]
    for a, b in zip(losses_two_nodes, losses_one_node):
        assert math.isclose(a, b, rel_tol=0, abs_tol=1e-5), (losses_two_nodes, losses_one_node)
    assert math.isclose(
        eval_record(records, "test")["auroc"], eval_record(read_log(one_node), "test")["auroc"], abs_tol=1e-4
    )


@pytest.mark.parametrize("failing", ["first", "second"])
def test_a_node_that_cannot_take_part_stops_every_node_with_its_line(synthetic_dir, failing):
    """Two agents (--nnodes 2 on localhost); one node's GLOO_SOCKET_IFNAME names an
    interface it lacks. That rank refuses, and the other node's rank, told through the
    rendezvous store, stops too with the same line (exit 2 on both). Before, the other
    node's rank waited at its first collective for the 30-minute timeout when its agent
    served the rendezvous store (the agent started first does), or, when the failing
    node's agent did, died with that store's connection error and a traceback. (The
    bound below is what the test waits, not a speed it asserts.)"""
    port, rdzv_id = free_port(), uuid.uuid4().hex
    args = ["--in_memory_binary_criteo_path", synthetic_dir, *FLAGS, "--limit_train_batches", "5"]
    envs = [{"GLOO_SOCKET_IFNAME": "nope0"}, None] if failing == "first" else [None, {"GLOO_SOCKET_IFNAME": "nope0"}]
    nodes = []
    for env in envs:
        nodes.append(_torchrun(2, 1, port, rdzv_id, args, env=env))
        time.sleep(5)  # the first agent serves the rendezvous store
    try:
        outputs = [node.communicate(timeout=300) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    interfaces = ", ".join(name for _, name in socket.if_nameindex())
    line = (
        f"dlrm_main.py: error: GLOO_SOCKET_IFNAME=nope0: host {socket.gethostname()} has no network interface "
        f"named nope0 (it has {interfaces})"
    )
    for node, (_, err) in zip(nodes, outputs):
        assert node.returncode == 1, err[-3000:]  # torchrun's code for a failed rank
        assert [l for l in err.splitlines() if ": error: " in l] == [line], err[-3000:]
        assert re.search(r"exitcode\s+: 2 ", err), err[-3000:]  # the rank's


def test_documented_torchrun_lines_train(synthetic_dir, tmp_path):
    """docs/launching.md's "torchrun by hand" line and the two "nodes on localhost" lines
    (run together), as written but for the data, the port and a small model: each
    carries the stable optimizer flags and trains to finite, falling losses. Without
    those flags (the public example's SGD at 15) they went to NaN."""
    documented = [argv for argv in commands_starting("docs/launching.md", "torchrun") if "dlrm_main.py" in argv]
    by_hand, two_nodes = documented[0], documented[1]
    for argv in documented:
        for option, value in STABLE_OPTIMIZER.options().items():
            assert argv[argv.index(option) + 1] == str(value), argv
    small = [
        "--embedding_dim",
        "16",
        "--dense_arch_layer_sizes",
        "64,16",
        "--over_arch_layer_sizes",
        "64,32,1",
        "--limit_train_batches",
        "20",
        "--limit_val_batches",
        "0",
        "--limit_test_batches",
        "2",
        "--log_every_n_steps",
        "1",
    ]

    def start(argv: list[str], endpoint: str, port: int, log: str) -> subprocess.Popen:
        """``argv`` with this test's data, ``endpoint`` on a free ``port`` and the small run."""
        argv = replaced(argv, {"data_cache/synthetic_criteo": synthetic_dir, endpoint: f"localhost:{port}"})
        argv = with_flags([os.path.join(BIN, "torchrun"), *argv[1:]], [*small, "--log_path", log])
        return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    by_hand_log, two_nodes_log = str(tmp_path / "by_hand.jsonl"), str(tmp_path / "two_nodes.jsonl")
    port = free_port()
    runs = [
        start(by_hand, "localhost", free_port(), by_hand_log),
        *[start(two_nodes, "localhost:29600", port, two_nodes_log) for _ in range(2)],
    ]
    for proc in runs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    for log in (by_hand_log, two_nodes_log):
        losses = step_losses(read_log(log))
        assert len(losses) == 20 and all(math.isfinite(loss) for loss in losses), losses
        assert losses[-1] < losses[0], losses
        assert eval_record(read_log(log), "test")["auroc"] > 0.55


def _worker_with_rank(agent_pid: int, rank: int) -> int:
    children = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(agent_pid)], capture_output=True, text=True, check=True
    ).stdout.split()
    for pid in map(int, children):
        with open(f"/proc/{pid}/environ", "rb") as f:
            if f"RANK={rank}".encode() in f.read().split(b"\0"):
                return pid
    raise AssertionError(f"no worker with RANK={rank} among {children}")


def test_stopped_rank_says_which_rank_and_step(synthetic_dir, tmp_path):
    """SIGTERM to rank 1 mid-training (a preemption): it reports its rank and step and
    exits 143; torchrun stops the other rank, exits non-zero and shows the message."""
    log_path = str(tmp_path / "log.jsonl")
    agent = _torchrun(
        1,
        2,
        free_port(),
        uuid.uuid4().hex,
        ["--in_memory_binary_criteo_path", synthetic_dir, *FLAGS, "--batch_size", "64", "--log_path", log_path],
    )  # 384 steps: far longer than the test waits
    deadline = time.monotonic() + 300
    while not (os.path.exists(log_path) and len(step_losses(read_log(log_path))) >= 3):
        assert agent.poll() is None and time.monotonic() < deadline, agent.communicate()[1][-3000:]
        time.sleep(0.1)
    os.kill(_worker_with_rank(agent.pid, 1), signal.SIGTERM)
    _, err = agent.communicate(timeout=300)
    assert agent.returncode == 1, err[-3000:]  # torchrun's code for any failed rank
    stopped = re.findall(
        r"dlrm_main\.py: error: rank 1 of 2 stopped at step (\d+) \(epoch 0, training\): "
        r"received SIGTERM\n",
        err,
    )
    assert len(stopped) == 1, err[-3000:]
    assert 3 <= int(stopped[0]) < 384
    # torchrun's failure summary: rank 1's exit code and its message from the error file.
    assert re.search(r"rank\s+: 1 \(local_rank: 1\)\n\s+exitcode\s+: 143 ", err), err[-3000:]
    assert (
        f"traceback : dlrm_main.py: rank 1 of 2 stopped at step {stopped[0]} (epoch 0, training): "
        "received SIGTERM (exit code 143)"
    ) in err


def test_the_project_launcher_ends_with_the_ranks_lines_when_its_agent_is_stopped(synthetic_dir, tmp_path):
    """SIGTERM to the agent of python -m training.launch (torchrun's arguments, as
    make train runs it): the ranks say where they stopped, and that is the end of the
    output: no SignalException traceback of torchrun's after it, exit 143."""
    log_path = str(tmp_path / "log.jsonl")
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "training.launch",
            "--standalone",
            "--nproc_per_node",
            "2",
            "dlrm_main.py",
            "--in_memory_binary_criteo_path",
            synthetic_dir,
            *FLAGS,
            "--batch_size",
            "64",
            "--log_path",
            log_path,
        ],  # 384 steps: longer than the wait
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (os.path.exists(log_path) and len(step_losses(read_log(log_path))) >= 3):
            assert agent.poll() is None and time.monotonic() < deadline, agent.communicate()[1][-3000:]
            time.sleep(0.1)
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=300)
    finally:
        agent.kill()
    assert agent.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "SignalException" not in err, err[-3000:]
    # After the agent's own lines (it stops the ranks), only the ranks' lines: each says
    # where it stopped (a rank whose peer went first may say it lost it instead).
    after_agent = err.rstrip("\n").split("closing signal SIGTERM\n")[-1].splitlines()
    assert len(after_agent) == 2 and all(
        re.fullmatch(
            r"dlrm_main\.py: error: rank [01] of 2 (stopped|failed) at step "
            r"\d+ \(epoch 0, training\): .*",
            line,
        )
        for line in after_agent
    ), err[-3000:]
    assert "received SIGTERM" in after_agent[0] + after_agent[1]
