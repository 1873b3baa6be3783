"""Running the real entry points (in-process elastic launches and subprocesses) and reading their JSON logs."""

import contextlib
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from common.run_log_file import read_run_log

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The ports `free_port` reserved for the running test (`release_test_ports` frees them).
_test_ports = contextlib.ExitStack()


@contextlib.contextmanager
def reserved_port() -> Iterator[int]:
    """A local TCP port that no other process is handed while the block runs.

    A socket holds it bound (SO_REUSEADDR, never listening): the kernel skips a bound
    port when it picks one for another bind to port 0 or an outgoing connection, while
    the server started inside the block (the c10d rendezvous store, a test's HTTP
    server: both set SO_REUSEADDR) still listens on it. A port only checked free and
    closed could go to the other pytest-xdist worker's launch before our store bound
    it: the agent that comes second finds the port taken and joins the first one's
    store as a client (torch 2.13's c10d rendezvous), and the two jobs' ranks, whose
    process-group keys are the same in a fresh worker, wait on each other's peers.
    """
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]


def free_port() -> int:
    """A port reserved (`reserved_port`) until the running test ends."""
    return _test_ports.enter_context(reserved_port())


def release_test_ports() -> None:
    """Frees the ports `free_port` reserved (tests/conftest.py, after each test)."""
    _test_ports.close()


def launch(entrypoint: Callable[..., int], argv: list[str], nproc: int = 2) -> dict[int, Any]:
    """Runs ``entrypoint(argv)`` on ``nproc`` local ranks through torch elastic; returns
    {rank: return value}. Raises ChildFailedError when a rank fails."""
    with reserved_port() as port:
        config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=nproc,
            run_id=uuid.uuid4().hex,
            rdzv_backend="c10d",
            rdzv_endpoint=f"127.0.0.1:{port}",
            max_restarts=0,
            monitor_interval=0.2,
        )
        return elastic_launch(config, entrypoint)(argv)


def run_script(
    args: Sequence[str], torchrun_nproc: int | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Runs `python ARGS` (or `torchrun --nproc_per_node N ARGS`) from the repo root."""
    with contextlib.ExitStack() as reservation:
        cmd = [sys.executable, *args]
        if torchrun_nproc is not None:
            port = reservation.enter_context(reserved_port())
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "1",
                "--nproc_per_node",
                str(torchrun_nproc),
                "--rdzv_backend",
                "c10d",
                "--rdzv_endpoint",
                f"127.0.0.1:{port}",
                *args,
            ]
        return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


# The run log's one reader (common/run_log_file.py), by the name the tests and benchmarks use.
read_log = read_run_log


def step_losses(records: list[dict[str, Any]]) -> list[float]:
    return [loss for r in records if r["event"] == "train" for loss in r["step_losses"]]


def eval_record(records: list[dict[str, Any]], stage: str) -> dict[str, Any]:
    return [r for r in records if r["event"] == "eval" and r["stage"] == stage][-1]


# What an eval record holds that differs between two identical runs: the run, the clock
# and the evaluation's speed.
RUN_SPECIFIC_EVAL_FIELDS = ("run_id", "time", "records_per_sec", "seconds")


def eval_metrics(record: dict[str, Any]) -> dict[str, Any]:
    """An eval record less RUN_SPECIFIC_EVAL_FIELDS: what two runs meant to be equal
    must agree on."""
    return {k: v for k, v in record.items() if k not in RUN_SPECIFIC_EVAL_FIELDS}
