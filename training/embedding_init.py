"""Initialises sharded embedding tables to values that do not depend on the sharding.

TorchRec initialises each shard with the local random generator, so the same seed
gives different tables on 1 and on 2 ranks, or under another plan. Here every table
is a fixed function of (seed, table): rows are drawn in blocks, each block from its
own generator, and each rank draws only the blocks its shards cover, copying each
straight into its shard. So runs at different world sizes or plans start from
identical weights, and no rank ever holds more than one block beside its shards.
"""

from typing import Dict, Iterator, Tuple

import torch
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor

ROWS_PER_BLOCK = 65536


def _table_block(seed: int, table_index: int, num_rows: int, dim: int, block: int) -> torch.Tensor:
    """Rows of one block of the table (whole width, on the host), uniform in
    +-sqrt(1 / num_rows) (TorchRec's range)."""
    bound = (1.0 / num_rows) ** 0.5
    rows = min(ROWS_PER_BLOCK, num_rows - block * ROWS_PER_BLOCK)
    block_seed = ((seed * 1_000_003 + table_index) * 1_000_003 + block) % (2**63)
    gen = torch.Generator().manual_seed(block_seed)
    return torch.rand(rows, dim, generator=gen) * (2 * bound) - bound


def _fill_piece(
    local: torch.Tensor, seed: int, table_index: int, num_rows: int, dim: int, row: int, col: int
) -> None:
    """Writes the table's values into ``local``, the piece at (row, col): one block at a
    time, straight into the destination, so neither host nor device ever holds a second
    copy of the piece (UVM and large table-wise shards would not fit twice)."""
    row_stop = row + local.shape[0]
    for block in range(row // ROWS_PER_BLOCK, (row_stop - 1) // ROWS_PER_BLOCK + 1):
        block_start = block * ROWS_PER_BLOCK
        values = _table_block(seed, table_index, num_rows, dim, block)
        lo, hi = max(row, block_start), min(row_stop, block_start + values.shape[0])
        local[lo - row : hi - row].copy_(values[lo - block_start : hi - block_start, col : col + local.shape[1]])


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
                _fill_piece(local, seed, index[table], num_rows, dim, row, col)
            done.add(table)
    return len(done)
