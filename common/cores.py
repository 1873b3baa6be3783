"""How many cores a process may use, and a rank's share of them: the training ranks'
intra-op threads and the data feed's workers are sized alike (training/distributed.py,
data/parquet/feed.py)."""

import os


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which Slurm and containers narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def rank_cpu_share(local_world_size: int, cores: int | None = None) -> int:
    """This rank's equal share (at least 1) of ``cores`` (default: `usable_cores`)."""
    return max(1, (usable_cores() if cores is None else cores) // local_world_size)
