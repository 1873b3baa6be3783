"""How a rank reports that it stops: one line on stderr, torchrun's error file, exit code.

Exit codes (what Slurm, Kubernetes and AWS Batch retry policies can test):

- 0: finished.
- 1: this rank failed during setup or training: a bug, out of memory, or a
  collective that failed because another rank stopped first. A retry may succeed.
- 2: bad flags or input data (reported before any collective). A retry will not help.
- 3: the training loss became NaN or infinite. A retry with the same flags will not help.
- 4: the run diverged without a NaN: it ended no better than a constant predictor, or
  its training loss grew 100-fold (training/divergence.py). Its checkpoints and logs
  are kept; ``--allow_divergence`` makes it exit 0 with a warning. A retry will not help.
- 143 (128 + SIGTERM): the rank was asked to stop (preemption, a cancelled job,
  torchrun stopping the ranks left after another failed). It says where it was.

torchrun itself exits 1 whenever a rank fails; its failure summary lists each
rank's exit code and, read from the error file written here, the rank's message.
A rank killed by a signal (e.g. the OOM killer) writes nothing: the summary names
the rank and the signal, and the ranks left behind report the step they were at.
"""

import os
import re
import signal
import socket
import sys
import time
import traceback

from common.atomic import write_json
from common.errors import EXIT_BAD_INPUT, BadInput, RankError
from common.sigterm import Terminated
from common.url_paths import redacted_text

EXIT_FAILED = 1
EXIT_NON_FINITE_LOSS = 3
EXIT_DIVERGED = 4
EXIT_TERMINATED = 128 + signal.SIGTERM


def print_whole(text: str) -> None:
    """Writes ``text`` (whole lines) to stderr in one write, flushed: the ranks of a
    torchrun job share its stderr, and a line written in pieces is cut by another's. A URL
    in it (a traceback's included) is shown without credentials."""
    text = redacted_text(text)
    sys.stderr.write(text if text.endswith("\n") else text + "\n")
    sys.stderr.flush()


def speaks_for_the_job() -> bool:
    """Whether this process is rank 0 of its job (RANK as torchrun, torchx and Slurm
    launches set it; a process without RANK is a job of its own)."""
    return os.environ.get("RANK", "0").strip() == "0"


def report(prog: str, message: str, exit_code: int) -> int:
    """Prints ``PROG: error: MESSAGE`` on stderr, records it for torchrun, returns ``exit_code``."""
    print_whole(f"{prog}: error: {message}")
    _record_for_torchrun(f"{prog}: {message} (exit code {exit_code})")
    return exit_code


def report_bad_input(prog: str, message: str) -> int:
    """Reports bad flags or input, which every rank of the job sees alike: rank 0 of the
    job prints the line (one line for the job, not one per rank), every rank records it
    for torchrun's failure summary. Returns EXIT_BAD_INPUT, for every rank to exit with.

    Example::

        return report_bad_input("dlrm_main.py", "--batch_size must be positive, got 0")
    """
    if speaks_for_the_job():
        print_whole(f"{prog}: error: {message}")
    _record_for_torchrun(f"{prog}: {message} (exit code {EXIT_BAD_INPUT})")
    return EXIT_BAD_INPUT


def report_rank_failure(prog: str, rank: int, world_size: int, where: str, error: BaseException) -> int:
    """Reports an exception of this rank (which rank, where); returns 143 for
    ``Terminated``, else 1.

    Example::

        report_rank_failure("dlrm_main.py", 1, 2, "step 37 (epoch 0, training)", err)
        # prints: dlrm_main.py: error: rank 1 of 2 failed at step 37 (epoch 0, training): RuntimeError: ...
    """
    detail = f"{type(error).__name__}: " + (str(error).strip().splitlines() or [""])[0]
    if isinstance(error, Terminated):
        return report(prog, f"rank {rank} of {world_size} stopped at {where}: {error}", EXIT_TERMINATED)
    if _lost_a_peer(error):
        # The echo of another rank's failure: its traceback says nothing more.
        detail = f"lost contact with {_lost_peer(str(error))}, which probably stopped first ({detail})"
    elif not isinstance(error, (RankError, BadInput)):
        # Their message says what and where: a RankError, or bad input that only this rank
        # found (a data value under --mmap_mode, which each rank checks as it reads).
        print_whole("".join(traceback.format_exception(error)))
    return report(prog, f"rank {rank} of {world_size} failed at {where}: {detail}", EXIT_FAILED)


# What gloo and NCCL say when the other end of a collective has gone (gloo raises a
# plain RuntimeError, so the type alone does not tell).
_PEER_LOST_MARKERS = ("Connection closed by peer", "Connection reset by peer", "NCCL communicator was aborted")


# gloo names the other end of the broken connection, "[ADDRESS]:PORT", in its messages
# ("Connection closed by peer [10.0.0.12]:40217", "Read error [10.0.0.12]:40217:
# Connection reset by peer"); its source position, "[.../pair.cc:537]", is no address.
_PEER_ADDRESS = re.compile(r"\[([0-9A-Fa-f.:]+)\]:\d+")


def _lost_peer(message: str) -> str:
    """The ranks whose connection broke, by their host's name and address when gloo's
    message gives the address: which machine of a multi-host job to look at."""
    match = _PEER_ADDRESS.search(message)
    if match is None:
        return "another rank"
    address = match.group(1)
    try:
        name = socket.gethostbyaddr(address)[0]
    except OSError:  # no name for it (no /etc/hosts entry, no reverse DNS)
        return f"the rank(s) on host {address}"
    return f"the rank(s) on host {name} ({address})"


def _lost_a_peer(error: BaseException) -> bool:
    # Here, not at the top: bad flags are reported through this module before torch loads.
    import torch.distributed as dist

    return isinstance(error, dist.DistNetworkError) or any(m in str(error) for m in _PEER_LOST_MARKERS)


def _record_for_torchrun(message: str) -> None:
    """Writes torchrun's per-rank error file (TORCHELASTIC_ERROR_FILE, set by torchrun
    and torchx) so that its failure summary shows ``message`` instead of a link."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        write_json(path, {"message": redacted_text(message), "timestamp": int(time.time())})
    except OSError:
        pass  # the message is on stderr already; a missing summary line is not worth a crash
