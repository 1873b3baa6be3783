"""Helpers that run the real entry points: in-process elastic launches and subprocesses."""

import json
import os
import socket
import subprocess
import sys
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

from torch.distributed.launcher.api import LaunchConfig, elastic_launch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(entrypoint: Callable[..., int], argv: List[str], nproc: int = 2) -> Dict[int, Any]:
    """Runs ``entrypoint(argv)`` on ``nproc`` local ranks through torch elastic; returns
    {rank: return value}. Raises ChildFailedError when a rank fails."""
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        max_restarts=0,
        monitor_interval=0.2,
    )
    return elastic_launch(config, entrypoint)(argv)


def run_script(args: Sequence[str], torchrun_nproc: Optional[int] = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """Runs `python ARGS` (or `torchrun --nproc_per_node N ARGS`) from the repo root."""
    if torchrun_nproc is None:
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
               "--nproc_per_node", str(torchrun_nproc), "--rdzv_backend", "c10d",
               "--rdzv_endpoint", f"127.0.0.1:{free_port()}", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def read_log(path: str) -> List[Dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def step_losses(records: List[Dict[str, Any]]) -> List[float]:
    return [loss for r in records if r["event"] == "train" for loss in r["step_losses"]]


def eval_record(records: List[Dict[str, Any]], stage: str) -> Dict[str, Any]:
    return [r for r in records if r["event"] == "eval" and r["stage"] == stage][-1]
