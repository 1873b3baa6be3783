"""What the Parquet loaders need to know of the job that reads them, and their decisions.

The trainer tells the source, once its ranks have joined (`data.sources.types.FeedJob`):
the device batches go to, the ranks on this host, a gloo process group of the feed's own
and, on a resume, the world size that read the resumed epoch's first batches. From it:

- `agree_on_batch`: every rank converts only its own rows, so a bad value is seen by
  one rank. Before a batch is handed to training, the ranks exchange, over the feed's
  gloo group, one flag each ("my rows of this batch are bad") and their rows' weight
  sum: every rank stops at the same batch with the line of the first rank that found
  one, and every rank normalizes its weighted loss by the global batch's weight sum.
  The exchange happens in the thread that iterates the loader (training's main thread),
  never in the feed's threads: every rank takes batches in the same order there, so
  the ranks' collectives pair up; a feed thread runs ahead by a different number of
  batches on each rank, and one stopped early (a limit, an evaluation, a failure) would
  leave its peer waiting in a collective. Gloo, not the training group: the flags are
  CPU values, and an NCCL collective would wait for the GPU stream.
- `pins_batches`: on CUDA the workers pin the batches they build (the copy to the GPU
  is then asynchronous, and the main thread pins nothing).
- `yields_to_training`: on CPU the workers run at a lower priority (nice + `NICE`), so
  that the kernel gives the training threads, which use the rank's share of the cores,
  the cores first; the feed takes what training leaves (it waits on the data, or on a
  collective), and pyarrow decodes in the workers instead of its own pool.
- `default_workers`: the rank's share of the host's cores (as training's threads).
"""

import os
import threading
from collections.abc import Callable
from typing import Any

from common.cores import rank_cpu_share

# How much lower a CPU run's feed threads are scheduled than training's (nice 0..19).
NICE = 10

# (this rank's error line or None, this rank's weight sum) -> (the first bad rank's line
# or None, the weight sum of every rank).
Agreement = Callable[[str | None, float], tuple[str | None, float]]


def default_workers(local_world_size: int, cores: int | None = None) -> int:
    """``--data_workers`` unset: the rank's share of the host's cores."""
    return rank_cpu_share(local_world_size, cores)


def pins_batches(device_type: str) -> bool:
    """Whether the workers pin the batches they build: for a CUDA device."""
    return device_type == "cuda"


def yields_to_training(device_type: str) -> bool:
    """Whether the feed's threads yield the cores to training: on CPU, where training's
    threads use the rank's whole share of the cores."""
    return device_type == "cpu"


def lower_this_threads_priority(nice: int = NICE) -> None:
    """Lowers the calling thread's scheduling priority by ``nice`` (Linux schedules
    threads one by one; elsewhere nothing). Threads it starts inherit it."""
    if not hasattr(os, "setpriority"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError:  # not allowed here: the feed still runs, at the training threads' priority
        pass


# `Agreement` in two halves: started (the collective under way), then finished (waits for
# it): the loader starts a batch's agreement when it hands out the batch before, so
# that the all-reduce completes during a training step instead of holding the thread.
StartedAgreement = Callable[[str | None, float], Callable[[], tuple[str | None, float]]]


def agreement(group: Any) -> Agreement:
    """`agree_on_batch` over ``group`` (a gloo process group of every rank)."""
    return lambda message, weight_sum: agree_on_batch(group, message, weight_sum)


def started_agreement(group: Any) -> StartedAgreement:
    """`start_agreement` over ``group``."""
    return lambda message, weight_sum: start_agreement(group, message, weight_sum)


def agree_on_batch(group: Any, message: str | None, weight_sum: float) -> tuple[str | None, float]:
    """One all-reduce of (weight sum, one flag per rank) over ``group``; when a rank
    flags its rows bad, its line is broadcast (as bytes: nothing is unpickled) from the
    first such rank. Returns (that line or None, the ranks' weight sum). Collective."""
    return start_agreement(group, message, weight_sum)()


def start_agreement(group: Any, message: str | None, weight_sum: float) -> Callable[[], tuple[str | None, float]]:
    """`agree_on_batch` with its all-reduce started now (asynchronous); the function it
    returns waits for it (and broadcasts a bad rank's line) and returns the result. Every
    rank starts and finishes its agreements in the same order. Collective."""
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(group), dist.get_rank(group)
    flags = torch.zeros(world + 1, dtype=torch.float64)
    flags[0] = weight_sum
    if message is not None:
        flags[1 + rank] = 1
    work = dist.all_reduce(flags, group=group, async_op=True)
    return lambda: _finish_agreement(group, work, flags, message)


def _finish_agreement(group: Any, work: Any, flags: Any, message: str | None) -> tuple[str | None, float]:
    import torch
    import torch.distributed as dist

    work.wait()
    rank = dist.get_rank(group)
    bad = torch.nonzero(flags[1:]).flatten().tolist()
    if not bad:
        return None, float(flags[0])
    source = dist.get_global_rank(group, int(bad[0]))
    size = torch.tensor([len(message.encode()) if message is not None else 0], dtype=torch.int64)
    dist.broadcast(size, src=source, group=group)
    text = torch.zeros(int(size[0]), dtype=torch.uint8)
    if int(bad[0]) == rank:
        text = torch.frombuffer(bytearray(message.encode()), dtype=torch.uint8)  # type: ignore[union-attr]
    dist.broadcast(text, src=source, group=group)
    return bytes(text.numpy()).decode(), float(flags[0])
