"""Zero-collision tables (``--id_hashing zch``): torchrec's managed-collision modules.

Each feature's table gets an `MCHManagedCollisionModule` in front of it: the module keeps
the sorted 64-bit input ids it has admitted and the row each owns (its remapping), so two
admitted ids never share a row. The last row of a table (of each row-wise shard, when
sharded) is the default row: an id not admitted yet, evicted, or never seen reads it.
Ids are admitted only every ``eviction_interval`` training steps: the module records the
ids of those steps, then keeps the most frequent (``lfu``) or most recent (``lru``)
among the admitted and the recorded ones. Evaluation and serving never admit.

What this stack can and cannot do (torchrec 1.8.0 / fbgemm-gpu-cpu 1.8.0 on CPU with
gloo, measured; docs/zch.md):

- with torchrec's own sharders the planner cannot shard a
  `ManagedCollisionEmbeddingBagCollection` on CPU: the managed-collision sharder takes
  row-wise sharding only, and the bag collection's sharder offers row-wise on CUDA only,
  so their intersection is empty on CPU ("No available sharding type and compute kernel
  combination"); with ``buckets=1`` and 2 ranks it fails before that ("uneven buckets
  per rank ... Enable JK 'pytorch/torchrec:enable_uneven_buckets_mpzch'").
  sharding_plans/zch.py's sharder and `ZCH_BUCKETS` make it plannable; the row-wise
  plan with the fused kernel shards, trains with the fused optimizer, evicts (rows and
  optimizer state reset) and saves and loads with torch.distributed.checkpoint;
- unsharded, torchrec's eviction leaves an evicted row's weights as they were (its
  ``evict`` is a stub), where the sharded module re-initialises them: sharded and
  unsharded training differ after the first eviction by design, and a row-wise shard
  admits only the ids of its block of the input range, into its own rows;
- the remapping is module state (``_mch_sorted_raw_ids``, ``_mch_remapped_ids_mapping``,
  the policy's ``_mch_counts`` or ``_mch_last_access_iter``, ``_current_iter_tensor``):
  a checkpoint holds it, but not the ids recorded since the last admission, so a resume
  equals the uninterrupted run when the checkpoint's step is a multiple of the interval.
"""

import dataclasses
import types
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from data.sources.parquet import ZCH_EVICTION_POLICIES

# The input range of the modules: ids are non-negative int64 below int64's maximum,
# which the module uses to mark an empty slot (data.parquet.id_hashing.zch_ids).
ZCH_INPUT_RANGE = 2**63 - 1

# Buckets of each module's input range: the planner refuses a world size that does not
# divide them ("uneven buckets per rank"); 1024 (torchrec's most shards) takes every
# power of two up to it.
ZCH_BUCKETS = 1024


def zch_unavailable() -> str | None:
    """Why this stack's torchrec cannot do ``--id_hashing zch`` (one line), or None."""
    try:
        from torchrec.distributed.mc_embeddingbag import ManagedCollisionEmbeddingBagCollectionSharder  # noqa: F401
        from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection  # noqa: F401
        from torchrec.modules.mc_modules import (  # noqa: F401
            LFU_EvictionPolicy,
            LRU_EvictionPolicy,
            ManagedCollisionCollection,
            MCHManagedCollisionModule,
        )
    except ImportError as e:
        import torchrec

        version = getattr(torchrec, "__version__", "unknown")
        return f"--id_hashing zch needs torchrec's managed-collision modules, which torchrec {version} lacks ({e})"
    return None


@dataclasses.dataclass(frozen=True)
class ZchOptions:
    """How the managed-collision modules admit and evict.

    Args:
        eviction_policy: "lfu" (keep the most frequent ids) or "lru" (the most recent).
        eviction_interval: training steps between admissions (and evictions).
    """

    eviction_policy: str = "lfu"
    eviction_interval: int = 100

    def check(self) -> None:
        """Raises ValueError with one line naming the flag."""
        if self.eviction_policy not in ZCH_EVICTION_POLICIES:
            raise ValueError(
                f"--zch_eviction_policy {self.eviction_policy!r}: choose one of {', '.join(ZCH_EVICTION_POLICIES)}"
            )
        if self.eviction_interval < 1:
            raise ValueError(f"--zch_eviction_interval {self.eviction_interval}: must be at least 1 step")


def build_zch_collection(configs: Sequence[EmbeddingBagConfig], options: ZchOptions, device: torch.device) -> nn.Module:
    """A `ManagedCollisionEmbeddingBagCollection` over one table per config, each table
    with its own module (``zch_size`` = its rows, the last row the default), returning
    the remapped ids beside the pooled embeddings (for `ZchStatistics`)."""
    options.check()
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection
    from torchrec.modules.mc_modules import (
        LFU_EvictionPolicy,
        LRU_EvictionPolicy,
        ManagedCollisionCollection,
        MCHManagedCollisionModule,
    )

    configs = list(configs)
    for config in configs:
        if config.num_embeddings < 2:
            raise ValueError(f"table {config.name}: zch needs at least 2 rows (the last is the default row)")
    modules = {
        config.name: MCHManagedCollisionModule(
            zch_size=config.num_embeddings,
            device=device,
            eviction_policy=LFU_EvictionPolicy() if options.eviction_policy == "lfu" else LRU_EvictionPolicy(),
            eviction_interval=options.eviction_interval,
            input_hash_size=ZCH_INPUT_RANGE,
            buckets=ZCH_BUCKETS,
        )
        for config in configs
    }
    return ManagedCollisionEmbeddingBagCollection(
        EmbeddingBagCollection(tables=configs, device=device),
        ManagedCollisionCollection(modules, configs),
        return_remapped_features=True,
    )


def _managed_modules(collection: Any) -> dict[str, Any]:
    """The per-table modules of a (sharded or not) managed-collision bag collection:
    on a sharded one, this rank's shards."""
    return dict(collection._managed_collision_collection._managed_collision_modules.items())


def _default_rows(module: Any) -> torch.Tensor:
    """The default rows of a module: the last row of every shard of its table."""
    segments = module._output_segments_tensor
    segments = segments[segments >= 0]
    return segments[1:] - 1


def _live_ids(module: Any) -> torch.Tensor:
    """The admitted input ids of one module (its shard), sorted."""
    ids = module._mch_sorted_raw_ids
    return ids[ids != torch.iinfo(torch.int64).max]


def reserve_history(collection: Any, ids_per_step: int) -> None:
    """Sizes every module's record of the ids seen between two admissions for
    ``ids_per_step`` ids a step (the most one rank's shard can receive: the global
    batch's ids of the feature).

    torchrec sizes that record from the first batch a module sees (1.25 times its ids
    times the interval) and silently drops the ids that do not fit: a row-wise shard's
    first batch can be small, so admissions would then miss ids, and a resumed run
    (sized from another batch) would admit other ids than the uninterrupted one. Call
    it on the sharded (or unsharded) collection before the first step."""
    from torchrec.sparse.jagged_tensor import JaggedTensor

    for module in _managed_modules(collection).values():
        # ids_per_step * 0.8 ids: torchrec multiplies by 1.25 (rounded up here so it never falls short).
        sized = -(-ids_per_step * 4 // 5)
        while int(sized * module._eviction_interval * 1.25) < ids_per_step * module._eviction_interval:
            sized += 1
        module._init_history_buffers(
            {"ids": JaggedTensor(values=torch.empty(sized, dtype=torch.int64), lengths=torch.tensor([sized]))}
        )
        if "profile" not in module.__dict__:
            module.profile = types.MethodType(_profile_without_drops, module)


def _grow_history(module: Any, needed: int) -> None:
    """Makes room for ``needed`` more ids in a module's record of ids, keeping what it holds."""
    used = module._current_history_buffer_offset
    size = max(2 * module._input_history_buffer_size, used + needed)
    grown = torch.empty(size, dtype=torch.int64, device=module._history_accumulator.device)
    grown[:used] = module._history_accumulator[:used]
    module._history_accumulator = grown
    for name, buffer in list(module._history_metadata.items()):
        larger = torch.zeros(size, dtype=buffer.dtype, device=buffer.device)
        larger[:used] = buffer[:used]
        module.register_buffer("_history_" + name, larger, persistent=False)
        module._history_metadata[name] = larger
    module._input_history_buffer_size = size


def _profile_without_drops(self: Any, features: dict[str, Any]) -> dict[str, Any]:
    """torchrec's `MCHManagedCollisionModule.profile`, but a step whose ids do not fit the
    record grows it first: torchrec drops them silently (a larger batch, a longer bag or a
    resumed run's other first batch would then change which ids are admitted)."""
    if self.training and self._input_history_buffer_size >= 0:
        needed = sum(int(feature.values().numel()) for feature in features.values())
        if needed > self._input_history_buffer_size - self._current_history_buffer_offset:
            _grow_history(self, needed)
    return type(self).profile(self, features)


@dataclasses.dataclass
class FeatureZch:
    """One feature's counts since the last report (``live_ids``: now).

    ``collisions`` counts lookups that read the default row (an id not admitted or
    evicted: every such id shares that one row), out of ``lookups``."""

    live_ids: int = 0
    admitted: int = 0
    evicted: int = 0
    lookups: int = 0
    collisions: int = 0

    @property
    def collision_share(self) -> float:
        return self.collisions / self.lookups if self.lookups else 0.0


class ZchStatistics:
    """Per feature: live ids, admitted, evicted (between two `report` calls, from the
    remapping itself) and the lookups that read the default row (`count`, fed by
    `ZchPooledEmbeddings` from the remapped ids of each training step).

    Sharded, each rank sees its shards and its batch: `report` sums over ``group``."""

    def __init__(self, feature_to_table: dict[str, str]) -> None:
        self.feature_to_table = feature_to_table
        self._lookups = {f: 0 for f in feature_to_table}
        self._collisions = {f: 0 for f in feature_to_table}
        self._previous: dict[str, torch.Tensor] = {}
        # Evaluation's lookups (no admission): those of a default row are ids without a row, unseen.
        self._evaluated = {f: 0 for f in feature_to_table}
        self._unseen = {f: 0 for f in feature_to_table}

    def count(
        self, remapped: KeyedJaggedTensor, default_rows: dict[str, torch.Tensor], evaluation: bool = False
    ) -> None:
        lookups, hits = (self._evaluated, self._unseen) if evaluation else (self._lookups, self._collisions)
        for feature, values in zip(remapped.keys(), remapped.values().split(remapped.length_per_key())):
            table = self.feature_to_table[feature]
            lookups[feature] += values.numel()
            hits[feature] += int(torch.isin(values, default_rows[table]).sum())

    def take_unseen(self, group: Any = None) -> dict[str, tuple[int, int]]:
        """{feature: (evaluation lookups of ids without a row, evaluation lookups)} since the
        last call, summed over the ranks of ``group`` when given (collective)."""
        features = list(self.feature_to_table)
        counts = torch.tensor([[self._unseen[f], self._evaluated[f]] for f in features], dtype=torch.int64)
        for f in features:
            self._unseen[f] = self._evaluated[f] = 0
        if group is not None:
            torch.distributed.all_reduce(counts, group=group)
        return {f: (int(counts[i, 0]), int(counts[i, 1])) for i, f in enumerate(features)}

    def report(self, collection: Any, group: Any = None) -> dict[str, FeatureZch]:
        """The counts since the last call (``live_ids``: now), summed over the ranks of
        ``group`` when given (collective: every rank calls it)."""
        modules = _managed_modules(collection)
        features = list(self.feature_to_table)
        counts = torch.zeros(len(features), 5, dtype=torch.int64)
        for i, feature in enumerate(features):
            table = self.feature_to_table[feature]
            live = _live_ids(modules[table])
            before = self._previous.get(table, live[:0])
            counts[i, 0] = live.numel()
            counts[i, 1] = int((~torch.isin(live, before)).sum())
            counts[i, 2] = int((~torch.isin(before, live)).sum())
            counts[i, 3] = self._lookups[feature]
            counts[i, 4] = self._collisions[feature]
            self._previous[table] = live.clone()
            self._lookups[feature] = self._collisions[feature] = 0
        if group is not None:
            torch.distributed.all_reduce(counts, group=group)
        return {f: FeatureZch(*(int(x) for x in counts[i])) for i, f in enumerate(features)}


def zch_tables(model: nn.Module) -> "ZchPooledEmbeddings | None":
    """The managed-collision tables of ``model`` (sharded or not), or None."""
    return next((m for m in model.modules() if isinstance(m, ZchPooledEmbeddings)), None)


def zch_summary(report: dict[str, FeatureZch]) -> str:
    """One log line: per feature live ids, admitted, evicted and the collision share."""
    return "zch " + "; ".join(
        f"{f}: live {s.live_ids} +{s.admitted} -{s.evicted} collisions {s.collision_share:.2%}"
        for f, s in report.items()
    )


class ZchPooledEmbeddings(nn.Module):
    """A managed-collision bag collection that returns its pooled embeddings alone (a
    `KeyedTensor`, as an `EmbeddingBagCollection` does) and counts, in training, the
    lookups that read a default row into ``statistics``.

    Args:
        collection: `build_zch_collection`'s module (DistributedModelParallel replaces it
            with its sharded form in place).
    """

    def __init__(self, collection: Any) -> None:
        super().__init__()
        self.collection = collection
        configs = collection._embedding_module.embedding_bag_configs()
        self.statistics = ZchStatistics({f: c.name for c in configs for f in c.feature_names})

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        collection: Any = self.collection
        return collection._embedding_module.embedding_bag_configs()

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        pooled, remapped = self.collection(features)
        # torchrec's train pipeline fx-traces this forward only to find the sharded
        # collection's call (it then runs the forward as written): the counting, which
        # reads values, stays out of the trace.
        if isinstance(pooled, torch.fx.Proxy):
            return pooled
        if remapped is not None:  # training: collisions; evaluation: ids without a row (unseen)
            defaults = {t: _default_rows(m) for t, m in _managed_modules(self.collection).items()}
            remapped = remapped.wait() if hasattr(remapped, "wait") else remapped
            self.statistics.count(remapped, defaults, evaluation=not self.training)
        return pooled.wait() if hasattr(pooled, "wait") else pooled


def admitted_ids(zch: ZchPooledEmbeddings) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """{feature: (its admitted ids, increasing; the row of each; the table's shard
    boundaries)} of unsharded managed-collision tables (a checkpoint loaded in one
    process keeps the segments of the shards it was trained on): what
    `data.parquet.zch_map.ZchIdMap` serves with."""
    modules = _managed_modules(zch.collection)
    found = {}
    for feature, table in zch.statistics.feature_to_table.items():
        module = modules[table]
        ids = module._mch_sorted_raw_ids
        live = ids != torch.iinfo(torch.int64).max
        segments = module._output_segments_tensor
        found[feature] = (
            ids[live].numpy().copy(),
            module._mch_remapped_ids_mapping[live].to(torch.int64).numpy().copy(),
            segments[segments >= 0].to(torch.int64).numpy().copy(),
        )
    return found


def zch_buckets(zch: ZchPooledEmbeddings) -> int:
    """The buckets of the modules' input range (the same for every table)."""
    return int(next(iter(_managed_modules(zch.collection).values()))._buckets)


def plain_tables(zch: ZchPooledEmbeddings) -> Any:
    """The `EmbeddingBagCollection` behind the remapping: the tables a lookup of rows reads."""
    collection: Any = zch.collection
    return collection._embedding_module
