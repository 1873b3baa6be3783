"""Initialises sharded embedding tables to values that do not depend on the sharding.

TorchRec initialises each shard with the local random generator, so the same seed
gives different tables on 1 and on 2 ranks, or under another plan. Here every value
is a pure function of (seed, table, row, column): a 64-bit hash of (seed, table, row)
per row, mixed with the column by a 32-bit integer hash, scaled to TorchRec's range.
Each rank computes only the rows its shards hold, about 128k values at a time per
thread, straight into the shard: no rank ever holds a second copy of a shard, and
neither the sharding, the world size nor the number of threads changes a value.

TorchRec's own initialisation of the same shards (FBGEMM's kernels draw every shard
uniformly, then the sharded collection draws it again with each table's ``init_fn``)
is skipped with `torchrec_table_init_skipped`: both are overwritten here. So is the
zero fill of the host weights FBGEMM allocates (a full pass over the tables' memory,
its page faults included, that cost more than this initialisation): they are mapped
fresh from the kernel instead, zeros that no one has written, and their pages are
first touched when this module's threads write the values.
"""

import inspect
import mmap
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from fbgemm_gpu import split_table_batched_embeddings_ops_training as fbgemm_tbe
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec.distributed.batched_embedding_kernel import BaseBatchedEmbeddingBag
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

# Values one thread computes at a time (a task is this many values' worth of whole rows):
# its scratch (three arrays of 512 KB) stays in a core's cache. Values do not depend on it.
TASK_VALUES = 1 << 17

_MASK64 = (1 << 64) - 1
_GOLDEN64 = 0x9E3779B97F4A7C15
_GOLDEN32 = np.uint32(0x9E3779B9)


def _splitmix64(value: int) -> int:
    """SplitMix64's finaliser on one integer (a bijection of 64-bit words)."""
    z = (value + _GOLDEN64) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def table_key(seed: int, table_index: int) -> int:
    """The 64-bit key of one table of one run."""
    return _splitmix64(_splitmix64(seed & _MASK64) ^ table_index)


def _row_hashes(key: int, row_start: int, num_rows: int) -> np.ndarray:
    """32 bits per row, the SplitMix64 hash of (key, row) for rows
    ``row_start .. row_start + num_rows``."""
    z = np.arange(row_start, row_start + num_rows, dtype=np.uint64)
    z *= np.uint64(_GOLDEN64)
    z += np.uint64(key)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(32)).astype(np.uint32)


class _Scratch(threading.local):
    """Each thread's working arrays, reused from task to task."""

    def arrays(self, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if getattr(self, "shape", None) != shape:
            self.shape = shape
            self.bits = np.empty(shape, np.uint32)
            self.shifted = np.empty(shape, np.uint32)
            self.values = np.empty(shape, np.float32)
        return self.bits, self.shifted, self.values


_SCRATCH = _Scratch()


def _values_into(out: np.ndarray, key: int, bound: float, row: int, col: int) -> None:
    """Writes the table's values of rows ``row ..`` and columns ``col ..`` (as many as
    ``out`` has) into ``out`` (float32), uniform in [-bound, bound]."""
    bits, shifted, _ = _SCRATCH.arrays(out.shape)
    columns = np.arange(col, col + out.shape[1], dtype=np.uint32) * _GOLDEN32
    np.add(_row_hashes(key, row, out.shape[0])[:, None], columns[None, :], out=bits)
    # A 32-bit integer hash (xorshift-multiply, two rounds) of row hash + column.
    for shift, multiplier in ((16, 0x7FEB352D), (15, 0x846CA68B)):
        np.right_shift(bits, shift, out=shifted)
        np.bitwise_xor(bits, shifted, out=bits)
        np.multiply(bits, np.uint32(multiplier), out=bits)
    np.right_shift(bits, 16, out=shifted)
    np.bitwise_xor(bits, shifted, out=bits)
    # As signed 32-bit integers the bits are uniform in [-2^31, 2^31): scale to the bound.
    np.copyto(out, bits.view(np.int32), casting="unsafe")
    np.multiply(out, np.float32(bound / 2**31), out=out)


def _bound(num_rows: int) -> float:
    """TorchRec's default range: uniform in +-sqrt(1 / num_rows)."""
    return (1.0 / num_rows) ** 0.5


def _as_float32_array(tensor: torch.Tensor) -> np.ndarray | None:
    """A numpy view of ``tensor`` when it is a contiguous fp32 host tensor, else None."""
    if tensor.device.type != "cpu" or tensor.dtype != torch.float32 or not tensor.is_contiguous():
        return None
    return tensor.detach().numpy()


def _fill_task(local: torch.Tensor, key: int, bound: float, row: int, col: int, start: int, stop: int) -> None:
    """Rows ``start .. stop`` of the piece ``local`` at (row, col)."""
    target = local[start:stop]
    direct = _as_float32_array(target)
    if direct is not None:
        _values_into(direct, key, bound, row + start, col)
        return
    # fp16, device or strided shards: through this thread's fp32 scratch, one task at a time.
    rows, cols = target.shape
    _, _, values = _SCRATCH.arrays((rows, cols))
    _values_into(values, key, bound, row + start, col)
    target.copy_(torch.from_numpy(values))


def table_values(
    seed: int, table_index: int, num_rows: int, rows: tuple[int, int], cols: tuple[int, int]
) -> torch.Tensor:
    """The initial values of rows ``[rows[0], rows[1])`` and columns ``[cols[0], cols[1])``
    of a table, as a new fp32 tensor (what `init_embedding_tables` writes there).

    Example::

        table_values(seed=0, table_index=3, num_rows=1000, rows=(0, 10), cols=(0, 64))
    """
    out = torch.empty(rows[1] - rows[0], cols[1] - cols[0])
    _run_tasks(_piece_tasks(out, table_key(seed, table_index), _bound(num_rows), rows[0], cols[0]), threads=1)
    return out


def _piece_tasks(local: torch.Tensor, key: int, bound: float, row: int, col: int) -> list[tuple]:
    """The fill tasks of the piece ``local`` at (row, col) of a table."""
    rows = max(1, TASK_VALUES // max(1, local.shape[1]))
    return [
        (local, key, bound, row, col, start, min(start + rows, local.shape[0]))
        for start in range(0, local.shape[0], rows)
    ]


def _fill_tasks(tasks: list[tuple]) -> None:
    for task in tasks:
        _fill_task(*task)


def _run_tasks(tasks: list[tuple], threads: int) -> None:
    """Runs the fill tasks on ``threads`` threads (numpy releases the GIL in its loops),
    each thread every ``threads``-th task: one pool job per thread, not per task."""
    if threads <= 1 or len(tasks) <= 1:
        _fill_tasks(tasks)
        return
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for done in pool.map(_fill_tasks, [tasks[first::threads] for first in range(threads)]):
            del done


def _local_pieces(value: torch.Tensor) -> Iterator[tuple[torch.Tensor, int, int]]:
    """(local tensor, row offset, column offset) of each piece this rank holds."""
    if isinstance(value, ShardedTensor):
        for shard in value.local_shards():
            row, col = shard.metadata.shard_offsets
            yield shard.tensor, row, col
    else:  # replicated (data parallel): the whole table
        yield value, 0, 0


def init_embedding_tables(
    model: nn.Module, table_sizes: dict[str, tuple[int, int]], seed: int, threads: int | None = None
) -> int:
    """Overwrites every local shard of the named tables; returns how many tables were set.

    Args:
        model: the sharded model (its state dict holds the shards as views).
        table_sizes: {table name: (rows, dim)} in the order that numbers the tables.
        seed: the run's seed.
        threads: threads that fill the shards (default: torch's intra-op threads).
            The values do not depend on it.

    Example::

        init_embedding_tables(dmp, {"t_cat_0": (1000, 64)}, seed=0)
    """
    index = {name: i for i, name in enumerate(table_sizes)}
    done = set()
    tasks: list[tuple] = []
    with torch.no_grad():
        for key, value in model.state_dict().items():
            parts = key.split(".")
            if len(parts) < 2 or parts[-1] != "weight" or parts[-2] not in index:
                continue
            table = parts[-2]
            num_rows, _ = table_sizes[table]
            for local, row, col in _local_pieces(value):
                if local.numel():
                    tasks += _piece_tasks(local, table_key(seed, index[table]), _bound(num_rows), row, col)
            done.add(table)
        _run_tasks(tasks, threads or torch.get_num_threads())
    return len(done)


def _skip_init(self: nn.Module) -> None:
    """Leaves the freshly allocated weights as they are."""


_APPLY_SPLIT = fbgemm_tbe.apply_split_helper
_APPLY_SPLIT_SIGNATURE = inspect.signature(_APPLY_SPLIT)


def _fresh_zeros(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A host tensor of zeros in a private anonymous mapping: the kernel's zero pages,
    not written until used (torch.zeros writes every byte first)."""
    size = numel * torch.empty(0, dtype=dtype).element_size()
    return torch.frombuffer(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), dtype=dtype)


def _apply_split_weights_unwritten(*args: Any, **kwargs: Any) -> None:
    """FBGEMM's `apply_split_helper`, but the host weights come from `_fresh_zeros`
    (through its ``preallocated_host_buffer``); other buffers (optimizer state) as before."""
    call = _APPLY_SPLIT_SIGNATURE.bind(*args, **kwargs)
    named = call.arguments
    on_host = torch.device(named["current_device"]).type == "cpu"
    if (
        named["prefix"] == "weights"
        and on_host
        and named["split"].host_size > 0
        and named.get("preallocated_host_buffer") is None
    ):
        named["preallocated_host_buffer"] = _fresh_zeros(named["split"].host_size, named["dtype"])
    _APPLY_SPLIT(*call.args, **call.kwargs)


@contextmanager
def torchrec_table_init_skipped() -> Iterator[None]:
    """While open, sharding an embedding-bag collection leaves its tables' weights as
    allocated (the fused kernels' host weights: zero pages, never written) instead of
    drawing them twice (the kernels' `init_parameters`, then the collection's
    `reset_parameters` with each table's ``init_fn`` and, for data-parallel tables, a
    broadcast from rank 0). Only for weights that are overwritten afterwards
    (`init_embedding_tables` or a checkpoint).

    Example::

        with torchrec_table_init_skipped():
            dmp = DistributedModelParallel(model, ...)
        init_embedding_tables(dmp, table_sizes, seed)
    """
    saved = (BaseBatchedEmbeddingBag.init_parameters, ShardedEmbeddingBagCollection.reset_parameters)
    BaseBatchedEmbeddingBag.init_parameters = _skip_init
    ShardedEmbeddingBagCollection.reset_parameters = _skip_init
    fbgemm_tbe.apply_split_helper = _apply_split_weights_unwritten
    try:
        yield
    finally:
        BaseBatchedEmbeddingBag.init_parameters, ShardedEmbeddingBagCollection.reset_parameters = saved
        fbgemm_tbe.apply_split_helper = _APPLY_SPLIT
