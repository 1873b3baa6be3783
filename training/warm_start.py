"""``--warm_start CHECKPOINT``: a new run that starts from another run's weights.

A warm start is a new run in every respect but its first weights: its own data, its own
``--checkpoint_dir``, step 0, the learning-rate schedule and early stopping from their
start, the random generators as ``--seed`` sets them. What carries is the checkpoint's
model (dense layers and embedding tables) and, with ``--warm_start_optimizer``, its
optimizer state (the fused embedding optimizer's and the dense one's, as saved).

A table may have more rows than the checkpoint's (a catalogue that grew): its first rows
are the checkpoint's, the others what a fresh run of this seed holds (the seeded init,
training/embedding_init.py), their optimizer state fresh. Anything else that differs
(fewer rows, another embedding dim, another feature set, another model or interaction)
is refused in one line before the model is built. The world size and the sharding may
differ: every rank reads its own shards of the checkpoint's tables (DCP reshards).

Under ``--id_hashing zch`` the id-to-row remapping (the managed-collision buffers, part of
the model's state) carries with the weights, resharded like them: every id the origin
admitted reads its trained row from the first step. Its tables keep their rows (no
growth), and a zch run warm-starts only from a zch checkpoint (and the reverse).

The checkpoint it started from (`WarmStartOrigin`) goes into every checkpoint of the new
run and its run log; ``--resume`` of a warm-started run continues that run, and refuses a
``--warm_start`` that names another origin.
"""

import hashlib
import os
from dataclasses import asdict, dataclass
from typing import Any

import torch
from iopath.common.file_io import g_pathmgr
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, ShardedTensorMetadata

from checkpoints.directory import META_FILE, checkpoint_to_load
from checkpoints.errors import CheckpointError
from checkpoints.meta import CheckpointMeta, WarmStartOrigin, meta_section
from checkpoints.opened import OpenedCheckpoint, open_checkpoint
from checkpoints.state import flat_state
from checkpoints.storage import join
from common.config_flags import option
from models.config import ModelConfig
from training.checkpoint_policy import RestorePoint, iter_differences, optimizers_of
from training.config import CheckpointConfig, OptimizerConfig, TrainConfig

# The fields that may differ between the checkpoint's model and the new run's: the
# tables' rows (they may grow; checked table by table).
_GROWABLE = ("num_embeddings_per_feature",)


@dataclass
class WarmStart:
    """The checkpoint a ``--warm_start`` run starts from, opened and checked against it.

    Attributes:
        checkpoint: the checkpoint, opened once (its tensors are loaded from it).
        optimizer: whether its optimizer state carries (``--warm_start_optimizer``).
        grown: {table: (rows in the checkpoint, rows now)} of the tables that grew.
        origin: what the new run's checkpoints and run log record of it.
    """

    checkpoint: OpenedCheckpoint
    optimizer: bool
    grown: dict[str, tuple[int, int]]
    origin: WarmStartOrigin


def find_warm_start(config: TrainConfig, restore: RestorePoint | None) -> WarmStart | None:
    """The checkpoint ``--warm_start`` names, checked against the run's model (and its
    optimizers, with ``--warm_start_optimizer``); None without the flag, or when the run
    resumes a checkpoint of its own (``--resume``), which must then have started from
    the same checkpoint.

    Reads only meta.json, so every rank can call it before any collective and fail
    with the same one-line CheckpointError.
    """
    flags = config.checkpoint
    if not flags.warm_start:
        return None
    checkpoint = open_checkpoint(_checkpoint_of(flags.warm_start))
    origin = origin_of(checkpoint)
    if restore is not None:  # --resume found this run's own checkpoint: it goes on from there
        _check_same_origin(restore, origin, flags)
        return None
    source = f"{option(flags, 'warm_start')} {checkpoint.path}"
    meta = checkpoint.meta
    _check_same_id_mode(meta.model, config.model, source)
    grown = grown_tables(meta.model, config.model, source)
    if grown and config.model.zch_eviction_policy is not None:  # the remapping buffers are sized by the rows
        tables = ", ".join(f"{table} {was} -> {now} rows" for table, (was, now) in grown.items())
        raise CheckpointError(
            f"{source}: a zch warm start keeps each table's rows (its id-to-row remapping is sized by them): {tables}"
        )
    if flags.warm_start_optimizer:
        recorded = meta_section(meta.config, "optim", OptimizerConfig, join(checkpoint.path, META_FILE))
        differences = list(iter_differences(optimizers_of(recorded), optimizers_of(config.optim), "optim."))
        if differences:
            raise CheckpointError(
                f"{source}: {option(flags, 'warm_start_optimizer')} carries the state of other optimizers: "
                f"{'; '.join(differences)} (give the same, or leave the flag out: the optimizers start fresh)"
            )
    return WarmStart(checkpoint, flags.warm_start_optimizer, grown, origin)


def _checkpoint_of(path: str) -> str:
    """``path`` when it is one checkpoint; of a directory, the one serving.export takes
    (its best, else its newest). A missing path: `open_checkpoint` says so."""
    return checkpoint_to_load(path, "--warm_start") if g_pathmgr.exists(path) else path


def origin_of(checkpoint: OpenedCheckpoint) -> WarmStartOrigin:
    """What a run warm-started from ``checkpoint`` records of it."""
    meta = checkpoint.meta
    digest = hashlib.sha256(checkpoint.read(META_FILE)).hexdigest()  # read checked against its manifest
    # A local path absolute: the record is read from other directories (a daily loop's).
    path = os.path.abspath(checkpoint.path) if "://" not in checkpoint.path else checkpoint.path
    return WarmStartOrigin(path=path, step=meta.step, meta_sha256=digest, run_id=meta.run_id)


def _check_same_origin(restore: RestorePoint, origin: WarmStartOrigin, flags: CheckpointConfig) -> None:
    """A resumed run goes on from where it started: the checkpoint ``--warm_start``
    names must be the one it was warm-started from."""
    started = restore.meta.warm_start
    if started is not None and started.meta_sha256 == origin.meta_sha256:
        return
    was = f"was warm-started from {started.describe()}" if started is not None else "started from scratch"
    raise CheckpointError(
        f"{option(flags, 'resume')}: checkpoint {restore.path} continues a run that {was}; "
        f"{option(flags, 'warm_start')} names {origin.describe()}: a run cannot change where it started "
        f"(give the new run a {option(flags, 'checkpoint_dir')} of its own)"
    )


def _check_same_id_mode(saved: ModelConfig, current: ModelConfig, source: str) -> None:
    """Under --id_hashing zch the id-to-row remapping (the managed-collision buffers,
    model state) carries with the weights: both sides must map ids by zch, or neither.
    One line, naming both."""
    was, now = saved.zch_eviction_policy is not None, current.zch_eviction_policy is not None
    if was != now:
        mode = {True: "--id_hashing zch", False: "plain tables (--id_hashing hash or vocabulary)"}
        raise CheckpointError(
            f"{source}: its model maps ids by {mode[was]}, this run by {mode[now]}: a warm start keeps the "
            "id mode (train afresh to change it)"
        )


def grown_tables(saved: ModelConfig, current: ModelConfig, source: str) -> dict[str, tuple[int, int]]:
    """{table: (rows saved, rows now)} of the tables of ``current`` that have more rows
    than ``saved``'s; CheckpointError (one line starting with ``source``) for any other
    difference: a table missing on either side, fewer rows or another width (naming the
    table and both shapes), or another model."""
    was = dict(zip(saved.table_names, saved.num_embeddings_per_feature))
    now = dict(zip(current.table_names, current.num_embeddings_per_feature))
    for table, rows in now.items():
        if table not in was:
            raise CheckpointError(
                f"{source}: table {table} [{rows}, {current.embedding_dim}] of this model is not in the "
                f"checkpoint (its tables: {', '.join(was)}): another feature set"
            )
    for table, rows in was.items():
        if table not in now:
            raise CheckpointError(
                f"{source}: its table {table} [{rows}, {saved.embedding_dim}] is not in this model "
                f"(its tables: {', '.join(now)}): another feature set"
            )
    for table, rows in now.items():
        if rows < was[table] or current.embedding_dim != saved.embedding_dim:
            raise CheckpointError(
                f"{source}: table {table} is [{was[table]}, {saved.embedding_dim}] there and "
                f"[{rows}, {current.embedding_dim}] in this model: a warm start keeps a table's width "
                "and can only add rows"
            )
    differences = list(
        iter_differences(
            {k: v for k, v in asdict(saved).items() if k not in _GROWABLE},
            {k: v for k, v in asdict(current).items() if k not in _GROWABLE},
        )
    )
    if differences:
        more = f" (and {len(differences) - 3} more differences)" if len(differences) > 3 else ""
        raise CheckpointError(f"{source}: another model: {'; '.join(differences[:3])}{more}")
    return {table: (was[table], rows) for table, rows in now.items() if rows > was[table]}


def leading_rows(state: dict[str, Any], grown: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """The flat state (dotted keys) to load a checkpoint into: each value of a grown
    table (its weights, and optimizer state with a value per row) narrowed to the rows
    the checkpoint has, sharing memory with ``state``'s, so that the load fills them in
    place and leaves the new rows as they are. Other values as they are."""
    flat = flat_state(state)
    for key, value in flat.items():
        parts = key.split(".")
        table = next((part for part in parts if part in grown), None)
        if table is None or not torch.is_tensor(value) or value.dim() == 0:
            continue
        saved_rows, rows = grown[table]
        if value.size(0) == rows:
            flat[key] = _first_rows(value, saved_rows)
    return flat


def _first_rows(value: torch.Tensor, rows: int) -> torch.Tensor:
    """Rows ``0 .. rows`` of a table-shaped value (a tensor, or a sharded tensor whose
    shards keep their ranks), as views of it."""
    if not isinstance(value, ShardedTensor):
        return value.narrow(0, 0, rows)

    def kept(shard: ShardMetadata) -> ShardMetadata | None:
        start, size = shard.shard_offsets[0], shard.shard_sizes[0]
        keep = min(start + size, rows) - start
        if keep <= 0:
            return None
        return ShardMetadata(
            shard_offsets=list(shard.shard_offsets),
            shard_sizes=[keep, *shard.shard_sizes[1:]],
            placement=shard.placement,
        )

    metadata = value.metadata()
    shards = [s for s in (kept(s) for s in metadata.shards_metadata) if s is not None]
    local = []
    for shard in value.local_shards():
        narrowed = kept(shard.metadata)
        if narrowed is not None:
            local.append(Shard(shard.tensor.narrow(0, 0, narrowed.shard_sizes[0]), narrowed))
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        local,
        ShardedTensorMetadata(
            shards_metadata=shards,
            size=torch.Size([rows, *metadata.size[1:]]),
            tensor_properties=metadata.tensor_properties,
        ),
        process_group=value._process_group,
    )


def origin_sketch_bits(meta: CheckpointMeta, seen: Any) -> dict[str, int]:
    """{feature: bits} of the seen-id filters (data/parquet/id_sketch.py) the warm start's
    checkpoint saved, to be OR-ed into the new run's ``seen`` (its `SeenIds`): the
    features both have, whose saved filter is at most as wide (a table only grows).
    Empty when either has none (another id mode, a checkpoint saved before filters)."""
    recorded = (meta.serving_facts or {}).get("id_sketch")
    if seen is None or not isinstance(recorded, dict) or not isinstance(recorded.get("bits"), dict):
        return {}
    saved = recorded["bits"]
    bits = {}
    for name, now in zip(seen.names, seen.bits):
        was = saved.get(name)
        if isinstance(was, int) and 0 < was <= now and now % was == 0:
            bits[name] = was
    return bits if len(bits) == len(seen.names) else {}
