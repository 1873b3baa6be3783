"""Initialises sharded embedding tables to values that do not depend on the sharding.

TorchRec initialises each shard with the local random generator, so the same seed
gives different tables on 1 and on 2 ranks, or under another plan. Here every table
is a fixed function of (seed, table): rows are drawn in blocks, each block from its
own generator, and each rank draws only the blocks its shards cover. So runs at
different world sizes or plans start from identical weights, and no rank ever
materialises a whole large table.
"""

from typing import Dict, Iterator, Tuple

import torch
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor

ROWS_PER_BLOCK = 65536


def _table_rows(
    seed: int, table_index: int, num_rows: int, dim: int, row_start: int, row_stop: int
) -> torch.Tensor:
    """Rows [row_start, row_stop) of the table, uniform in +-sqrt(1 / num_rows) (TorchRec's range)."""
    bound = (1.0 / num_rows) ** 0.5
    blocks = []
    first_block, last_block = row_start // ROWS_PER_BLOCK, (row_stop - 1) // ROWS_PER_BLOCK
    for block in range(first_block, last_block + 1):
        block_start = block * ROWS_PER_BLOCK
        rows = min(ROWS_PER_BLOCK, num_rows - block_start)
        block_seed = ((seed * 1_000_003 + table_index) * 1_000_003 + block) % (2**63)
        gen = torch.Generator().manual_seed(block_seed)
        values = torch.rand(rows, dim, generator=gen) * (2 * bound) - bound
        lo = max(row_start, block_start) - block_start
        hi = min(row_stop, block_start + rows) - block_start
        blocks.append(values[lo:hi])
    return torch.cat(blocks)


def _local_pieces(value: torch.Tensor) -> Iterator[Tuple[torch.Tensor, int, int]]:
    """(local tensor, row offset, column offset) of each piece this rank holds."""
    if isinstance(value, ShardedTensor):
        for shard in value.local_shards():
            row, col = shard.metadata.shard_offsets
            yield shard.tensor, row, col
    else:  # replicated (data parallel): the whole table
        yield value, 0, 0


def init_embedding_tables(
    model: nn.Module, table_sizes: Dict[str, Tuple[int, int]], seed: int
) -> int:
    """Overwrites every local shard of the named tables; returns how many tables were set.

    Args:
        model: the sharded model (its state dict holds the shards as views).
        table_sizes: {table name: (rows, dim)} in the order that numbers the tables.
        seed: the run's seed.

    Example::

        init_embedding_tables(dmp, {"t_cat_0": (1000, 64)}, seed=0)
    """
    index = {name: i for i, name in enumerate(table_sizes)}
    done = set()
    with torch.no_grad():
        for key, value in model.state_dict().items():
            parts = key.split(".")
            if len(parts) < 2 or parts[-1] != "weight" or parts[-2] not in index:
                continue
            table = parts[-2]
            num_rows, dim = table_sizes[table]
            for local, row, col in _local_pieces(value):
                if local.numel() == 0:
                    continue
                rows = _table_rows(seed, index[table], num_rows, dim, row, row + local.shape[0])
                local.copy_(rows[:, col : col + local.shape[1]].to(local.device, local.dtype))
            done.add(table)
    return len(done)
