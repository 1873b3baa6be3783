"""The JSON plan file: our own versioned writer and reader, exact round trip.

A plan file holds what the plan was made for (topology and batch), the tables it
places, torchrec's `ShardingPlan` itself and, when the planner made it, the
planner's per-rank estimates::

    {
      "format": "torchrec-sharding-plan",
      "version": 1,
      "topology": {"world_size": 8, "local_world_size": 8, "compute_device": "cuda",
                   "batch_size": 8192, "hbm_cap_bytes": 42949672960, ...},
      "tables": {"t_cat_0": {"rows": 40000000, "dim": 128, "precision": "fp32"}, ...},
      "plan": {
        "model.sparse_arch.embedding_bag_collection": {
          "t_cat_0": {"sharding_type": "table_wise", "compute_kernel": "fused", "ranks": [0],
                      "shards": [{"offsets": [0, 0], "sizes": [40000000, 128],
                                  "placement": "rank:0/cuda:0"}]},
          ...
      "estimates": [{"rank": 0, "hbm_bytes": ..., "ddr_bytes": ..., "step_time_ms": ...}, ...]
    }

`read_plan(write_plan(p))` equals ``p`` and writing what was read gives the same bytes.
Files are written under a temporary name and renamed when complete.
"""

import dataclasses
import json
from typing import Any

from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode, CacheAlgorithm
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed.remote_device import _remote_device
from torchrec.distributed.types import (
    CacheParams,
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    ParameterSharding,
    ShardingPlan,
)
from torchrec.modules.embedding_configs import DataType

from common.atomic import write_text
from common.errors import BadInput
from sharding_plans.constraints import COMPUTE_KERNELS, SHARDING_TYPES
from sharding_plans.types import PlannerConfig, RankEstimate, SavedPlan, TableSpec

FORMAT = "torchrec-sharding-plan"
VERSION = 1
PRECISIONS = ("fp32", "fp16")
# Lines up to this width are kept on one line; longer containers are opened up.
_LINE_WIDTH = 100
# CacheParams fields this format carries (statistics and prefetch configs are not).
_CACHE_FIELDS = ("algorithm", "load_factor", "reserved_memory", "precision", "prefetch_pipeline")


class PlanFileError(BadInput):
    """A plan file is unreadable or malformed; the message names the file and the place."""


# ---------------------------------------------------------------- writing


def _enum_name(value: Any) -> str | None:
    return None if value is None else value.name


def _parameter_to_json(where: str, ps: ParameterSharding) -> dict[str, Any]:
    if ps.key_value_params is not None:
        raise PlanFileError(f"{where}: key-value (SSD / parameter server) tables cannot be saved in this format")
    entry: dict[str, Any] = {
        "sharding_type": ps.sharding_type,
        "compute_kernel": ps.compute_kernel,
        "ranks": list(ps.ranks) if ps.ranks is not None else None,
    }
    spec = ps.sharding_spec
    if spec is None:
        entry["shards"] = None
    elif isinstance(spec, EnumerableShardingSpec):
        entry["shards"] = [
            {"offsets": list(s.shard_offsets), "sizes": list(s.shard_sizes), "placement": str(s.placement)}
            for s in spec.shards
        ]
    else:
        raise PlanFileError(f"{where}: sharding spec {type(spec).__name__} cannot be saved in this format")
    # Optional settings, written only when set.
    for key in ("enforce_hbm", "stochastic_rounding"):
        if getattr(ps, key) is not None:
            entry[key] = getattr(ps, key)
    if ps.bounds_check_mode is not None:
        entry["bounds_check_mode"] = ps.bounds_check_mode.name
    if ps.output_dtype is not None:
        entry["output_dtype"] = ps.output_dtype.name
    if ps.cache_params is not None:
        cache = ps.cache_params
        unsupported = [
            f.name
            for f in dataclasses.fields(cache)
            if f.name not in _CACHE_FIELDS and getattr(cache, f.name) is not None
        ]
        if unsupported:
            raise PlanFileError(f"{where}: cache parameter {unsupported[0]} cannot be saved in this format")
        entry["cache_params"] = {
            "algorithm": _enum_name(cache.algorithm),
            "load_factor": cache.load_factor,
            "reserved_memory": cache.reserved_memory,
            "precision": _enum_name(cache.precision),
            "prefetch_pipeline": cache.prefetch_pipeline,
        }
    return entry


def plan_to_dict(saved: SavedPlan) -> dict[str, Any]:
    """The JSON object of a plan file (see the module docstring)."""
    plan: dict[str, Any] = {}
    for module_path, module_plan in saved.plan.plan.items():
        plan[module_path] = {
            table: _parameter_to_json(f"plan.{module_path}.{table}", ps) for table, ps in module_plan.items()
        }
    return {
        "format": FORMAT,
        "version": VERSION,
        "topology": dataclasses.asdict(saved.topology),
        "tables": {name: dataclasses.asdict(spec) for name, spec in saved.tables.items()},
        "plan": plan,
        "estimates": None if saved.estimates is None else [dataclasses.asdict(e) for e in saved.estimates],
    }


def _dumps(value: Any, indent: int = 0) -> str:
    """JSON text: a container on one line when that line is short, else one item per line."""
    flat = json.dumps(value, separators=(", ", ": "))
    if not isinstance(value, (dict, list)) or not value or indent + len(flat) <= _LINE_WIDTH:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {_dumps(v, indent + 2)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + _dumps(v, indent + 2) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def plan_to_json(saved: SavedPlan) -> str:
    """The text of a plan file."""
    return _dumps(plan_to_dict(saved)) + "\n"


def write_plan(path: str, saved: SavedPlan) -> None:
    """Writes the plan file: to a temporary name in the same folder, renamed when complete.

    Example::

        write_plan("plan.json", saved)
    """
    write_text(path, plan_to_json(saved))


# ---------------------------------------------------------------- reading


class _Reader:
    """Typed access to the decoded JSON, with errors naming the file and the place."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, what: str) -> PlanFileError:
        return PlanFileError(f"{self.source}: {where}: {what}" if where else f"{self.source}: {what}")

    def obj(self, value: Any, where: str, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected an object, got {type(value).__name__}")
        missing = [k for k in keys if k not in value]
        if missing:
            raise self.fail(where, f"missing key {missing[0]!r}")
        unknown = [k for k in value if k not in keys and k not in optional]
        if unknown:
            raise self.fail(where, f"unknown key {unknown[0]!r}")
        return value

    def integer(self, value: Any, where: str, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(where, f"expected an integer >= {minimum}, got {json.dumps(value)}")
        return value

    def number(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise self.fail(where, f"expected a number >= 0, got {json.dumps(value)}")
        return value

    def choice(self, value: Any, where: str, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise self.fail(where, f"expected one of {', '.join(choices)}, got {json.dumps(value)}")
        return value

    def optional(self, value: Any, where: str, kind: Any) -> Any:
        """``value`` if it is None or of ``kind`` (a type or a tuple of types; booleans
        count as integers only where ``kind`` is bool)."""
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool) and kind is not bool):
            name = getattr(kind, "__name__", "a number")
            raise self.fail(where, f"expected {name} or null, got {json.dumps(value)}")
        return value

    def enum(self, value: Any, where: str, enum_type: Any) -> Any:
        if value is None:
            return None
        if value not in enum_type.__members__:
            raise self.fail(where, f"unknown {enum_type.__name__} {json.dumps(value)}")
        return enum_type[value]

    def int_list(self, value: Any, where: str, length: int | None = None) -> list[int]:
        if not isinstance(value, list) or (length is not None and len(value) != length):
            expected = f"a list of {length} integers" if length else "a list of integers"
            raise self.fail(where, f"expected {expected}, got {json.dumps(value)}")
        return [self.integer(v, f"{where}[{i}]") for i, v in enumerate(value)]


def _read_topology(r: _Reader, value: Any) -> PlannerConfig:
    keys = tuple(f.name for f in dataclasses.fields(PlannerConfig))
    t = r.obj(value, "topology", keys)
    config = PlannerConfig(
        world_size=r.integer(t["world_size"], "topology.world_size", 1),
        local_world_size=r.integer(t["local_world_size"], "topology.local_world_size", 1),
        compute_device=r.choice(t["compute_device"], "topology.compute_device", ("cuda", "cpu")),
        batch_size=r.integer(t["batch_size"], "topology.batch_size", 1),
        hbm_cap_bytes=r.optional(t["hbm_cap_bytes"], "topology.hbm_cap_bytes", int),
        ddr_cap_bytes=r.optional(t["ddr_cap_bytes"], "topology.ddr_cap_bytes", int),
        intra_host_bw_gib_s=r.optional(t["intra_host_bw_gib_s"], "topology.intra_host_bw_gib_s", (int, float)),
        inter_host_bw_gib_s=r.optional(t["inter_host_bw_gib_s"], "topology.inter_host_bw_gib_s", (int, float)),
    )
    try:
        config.validate()
    except BadInput as e:
        raise r.fail("topology", str(e)) from None
    return config


def _read_tables(r: _Reader, value: Any) -> dict[str, TableSpec]:
    if not isinstance(value, dict) or not value:
        raise r.fail("tables", "expected a non-empty object of tables")
    tables = {}
    for name, spec in value.items():
        where = f"tables.{name}"
        t = r.obj(spec, where, ("rows", "dim", "precision"))
        tables[name] = TableSpec(
            rows=r.integer(t["rows"], f"{where}.rows", 1),
            dim=r.integer(t["dim"], f"{where}.dim", 1),
            precision=r.choice(t["precision"], f"{where}.precision", PRECISIONS),
        )
    return tables


def _read_shards(r: _Reader, value: Any, where: str, table: TableSpec, topology: PlannerConfig) -> list[ShardMetadata]:
    if not isinstance(value, list) or not value:
        raise r.fail(where, "expected a non-empty list of shards or null")
    shards = []
    covered = 0
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        s = r.obj(item, at, ("offsets", "sizes", "placement"))
        offsets = r.int_list(s["offsets"], f"{at}.offsets", 2)
        sizes = r.int_list(s["sizes"], f"{at}.sizes", 2)
        if offsets[0] + sizes[0] > table.rows or offsets[1] + sizes[1] > table.dim:
            raise r.fail(at, f"shard at {offsets} of size {sizes} extends past the {table.rows} x {table.dim} table")
        if not isinstance(s["placement"], str):
            raise r.fail(f"{at}.placement", f"expected a string like 'rank:0/cuda:0', got {json.dumps(s['placement'])}")
        try:
            placement = _remote_device(s["placement"])
        except (ValueError, RuntimeError) as e:
            raise r.fail(f"{at}.placement", f"bad placement {s['placement']!r}: {e}") from None
        rank = placement.rank()
        if rank is None or not 0 <= rank < topology.world_size:
            raise r.fail(
                f"{at}.placement", f"rank of {s['placement']!r} is not one of the plan's {topology.world_size} ranks"
            )
        if placement.device().type != topology.compute_device:
            raise r.fail(f"{at}.placement", f"{s['placement']!r} is not a {topology.compute_device} device")
        covered += sizes[0] * sizes[1]
        shards.append(ShardMetadata(shard_offsets=offsets, shard_sizes=sizes, placement=placement))
    # Shards lie inside the table; with the right total area and no overlap they cover it.
    if covered != table.rows * table.dim or _any_overlap(shards):
        raise r.fail(where, f"the shards do not cover the {table.rows} x {table.dim} table exactly once")
    return shards


def _any_overlap(shards: list[ShardMetadata]) -> bool:
    boxes = sorted((s.shard_offsets[0], s.shard_offsets[1], s.shard_sizes[0], s.shard_sizes[1]) for s in shards)
    for i, (r0, c0, h0, w0) in enumerate(boxes):
        for r1, c1, h1, w1 in boxes[i + 1 :]:
            if r1 >= r0 + h0:
                break
            if r0 < r1 + h1 and c0 < c1 + w1 and c1 < c0 + w0:
                return True
    return False


def _read_parameter(r: _Reader, value: Any, where: str, table: TableSpec, topology: PlannerConfig) -> ParameterSharding:
    optional_keys = ("enforce_hbm", "stochastic_rounding", "bounds_check_mode", "output_dtype", "cache_params")
    p = r.obj(value, where, ("sharding_type", "compute_kernel", "ranks", "shards"), optional_keys)
    sharding_type = r.choice(p["sharding_type"], f"{where}.sharding_type", SHARDING_TYPES)
    compute_kernel = r.choice(p["compute_kernel"], f"{where}.compute_kernel", COMPUTE_KERNELS)
    ranks = None
    if p["ranks"] is not None:
        ranks = r.int_list(p["ranks"], f"{where}.ranks")
        bad = [k for k in ranks if k >= topology.world_size]
        if bad:
            raise r.fail(f"{where}.ranks", f"rank {bad[0]} is not one of the plan's {topology.world_size} ranks")
    spec = None
    if p["shards"] is not None:
        spec = EnumerableShardingSpec(_read_shards(r, p["shards"], f"{where}.shards", table, topology))
        # torchrec takes a table-wise table's rank from `ranks` and its shard from the
        # placements (column-wise: shard i on ranks[i]): they must say the same.
        placed = [shard.placement.rank() for shard in spec.shards]
        if ranks != placed:
            raise r.fail(
                f"{where}.ranks",
                f"{json.dumps(ranks)} disagrees with the shards' placements, which are on "
                f"ranks {placed} in shard order",
            )
    elif sharding_type != "data_parallel":
        raise r.fail(f"{where}.shards", f"a {sharding_type} table needs its shards")
    cache = None
    if p.get("cache_params") is not None:
        c = r.obj(p["cache_params"], f"{where}.cache_params", _CACHE_FIELDS)
        cache = CacheParams(
            algorithm=r.enum(c["algorithm"], f"{where}.cache_params.algorithm", CacheAlgorithm),
            load_factor=r.optional(c["load_factor"], f"{where}.cache_params.load_factor", (int, float)),
            reserved_memory=r.optional(c["reserved_memory"], f"{where}.cache_params.reserved_memory", (int, float)),
            precision=r.enum(c["precision"], f"{where}.cache_params.precision", DataType),
            prefetch_pipeline=r.optional(c["prefetch_pipeline"], f"{where}.cache_params.prefetch_pipeline", bool),
        )
    return ParameterSharding(
        sharding_type=sharding_type,
        compute_kernel=compute_kernel,
        ranks=ranks,
        sharding_spec=spec,
        cache_params=cache,
        enforce_hbm=r.optional(p.get("enforce_hbm"), f"{where}.enforce_hbm", bool),
        stochastic_rounding=r.optional(p.get("stochastic_rounding"), f"{where}.stochastic_rounding", bool),
        bounds_check_mode=r.enum(p.get("bounds_check_mode"), f"{where}.bounds_check_mode", BoundsCheckMode),
        output_dtype=r.enum(p.get("output_dtype"), f"{where}.output_dtype", DataType),
    )


def _read_estimates(r: _Reader, value: Any, world_size: int) -> list[RankEstimate] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != world_size:
        raise r.fail("estimates", f"expected null or a list of {world_size} ranks")
    estimates = []
    for i, item in enumerate(value):
        where = f"estimates[{i}]"
        e = r.obj(item, where, ("rank", "hbm_bytes", "ddr_bytes", "step_time_ms"))
        if e["rank"] != i:
            raise r.fail(f"{where}.rank", f"expected {i}, got {json.dumps(e['rank'])}")
        estimates.append(
            RankEstimate(
                rank=i,
                hbm_bytes=r.integer(e["hbm_bytes"], f"{where}.hbm_bytes"),
                ddr_bytes=r.integer(e["ddr_bytes"], f"{where}.ddr_bytes"),
                step_time_ms=r.number(e["step_time_ms"], f"{where}.step_time_ms"),
            )
        )
    return estimates


def plan_from_dict(document: Any, source: str) -> SavedPlan:
    """Checks and converts a decoded plan file; ``source`` names it in errors."""
    r = _Reader(source)
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise r.fail("", f'not a sharding plan file (no "format": "{FORMAT}")')
    version = document.get("version")
    if version != VERSION:
        raise r.fail("version", f"this reader reads version {VERSION}, the file is version {json.dumps(version)}")
    d = r.obj(document, "", ("format", "version", "topology", "tables", "plan", "estimates"))
    topology = _read_topology(r, d["topology"])
    tables = _read_tables(r, d["tables"])
    if not isinstance(d["plan"], dict):
        raise r.fail("plan", "expected an object of modules")
    modules: dict[str, Any] = {}
    for module_path, module_plan in d["plan"].items():
        if not isinstance(module_plan, dict):
            raise r.fail(f"plan.{module_path}", "expected an object of tables")
        parameters = EmbeddingModuleShardingPlan()
        for table, value in module_plan.items():
            if table not in tables:
                raise r.fail(f"plan.{module_path}.{table}", 'table is not listed under "tables"')
            parameters[table] = _read_parameter(r, value, f"plan.{module_path}.{table}", tables[table], topology)
        modules[module_path] = parameters
    return SavedPlan(
        topology=topology,
        tables=tables,
        plan=ShardingPlan(modules),
        estimates=_read_estimates(r, d["estimates"], topology.world_size),
    )


def plan_from_json(text: str, source: str) -> SavedPlan:
    """Parses the text of a plan file; ``source`` names it in errors."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlanFileError(f"{source} line {e.lineno} column {e.colno}: not valid JSON: {e.msg}") from None
    return plan_from_dict(document, source)


def read_plan(path: str) -> SavedPlan:
    """Reads a plan file; raises PlanFileError (one line naming the file) when it is
    missing, not JSON, of another version or malformed.

    Example::

        saved = read_plan("plan.json")
        print(saved.topology.world_size)
    """
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise PlanFileError(f"{path}: cannot read the plan file: {e.strerror}") from None
    return plan_from_json(text, path)
