"""`python -m sharding_plans plan|inspect|sweep`: sharding plans without the hardware.

- ``plan``: plans the tables for a topology (meta tensors: no GPU, no process
  group), prints the plan, the memory and step time per rank and a verdict;
  ``--output plan.json`` saves it (for ``--sharding_plan`` of the entry points),
  ``--chart memory.png`` draws the memory per rank.
- ``inspect PLAN.json``: prints (and charts) a saved plan.
- ``sweep``: several table sizes (or scale factors) x world sizes -> one table.

The flags are declared on config classes (`common.config_flags`): the training
command line's model, table-size, batch and sharding flags, and this tool's own
below. Defaults come in layers: the fields', a ``--recipe``'s (or a ``--preset``'s,
which is a recipe plus a topology), then the command line.

Exit codes: 0 it fits (or done); 1 the plan does not fit; 2 bad input (one line on
stderr).
"""

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from common.byte_sizes import GIB, format_bytes
from common.cli import OneLineParser, run_cli
from common.config_flags import FlagError, Overrides, add_flags, config_values, flag, flag_of, flags_of, given, option
from common.errors import BadInput
from data.config import DataConfig
from data.sources import RandomData
from models.config import ModelConfig, TableSizes
from models.embedding_optimizer_config import EmbeddingOptimizerConfig
from recipes import RECIPES, Recipe
from sharding_plans.chart import write_memory_chart
from sharding_plans.dry_run import plan_request, rank_capacity_bytes, smallest_fitting_world_size
from sharding_plans.feature_spec import read_feature_spec
from sharding_plans.plan_file import read_plan, write_plan
from sharding_plans.planner import host_memory_bytes
from sharding_plans.presets import PRESETS, find_preset
from sharding_plans.report import format_plan_report, largest_rank, memory_imbalance
from sharding_plans.types import (
    PlanDoesNotFit,
    PlannerConfig,
    PlanRequest,
    Preset,
    SavedPlan,
    ShardingFlags,
    TopologyFlags,
)

PROG = "python -m sharding_plans"
# The features of a training run given no data (Criteo-shaped random data): the tables
# of --num_embeddings, and the numerical features the training MLP flags are checked with.
_DEFAULT_FEATURES = RandomData(DataConfig()).describe()
# The model flags that do not change a plan: checked as training would check them.
_DENSE_FLAGS = tuple(
    f.field.name for f in flags_of(ModelConfig) if f.field.name not in ("embedding_dim", "embedding_precision")
)
# The training flags a plan depends on; a recipe's others (epochs, dropout...) do not change it.
_PLAN_CONFIGS = (ModelConfig, TableSizes, EmbeddingOptimizerConfig, DataConfig)
# The data flags a plan depends on: the batch, and the bags' sizes (each table's ids a sample).
_PLAN_DATA_FLAGS = ("batch_size", "multi_hot_sizes")
_BATCH_ONLY = tuple(f.field.name for f in flags_of(DataConfig) if f.field.name not in _PLAN_DATA_FLAGS)
DEFAULT_LOCAL_WORLD_SIZE = 8  # GPUs per host of the common 8-GPU servers
EXIT_DOES_NOT_FIT = 1


@dataclass
class TableSourceFlags:
    """Where the tables come from when the table-size flags do not say."""

    preset: str | None = flag(
        None,
        help=f"a published TorchRec DLRM configuration: {', '.join(PRESETS)}: its recipe (the tables, "
        "their width, the batch) plus the GPUs it ran on (flags given override it)",
    )
    recipe: str | None = flag(
        None, choices=list(RECIPES), help="the training recipe's tables, width and batch (flags given win over them)"
    )
    feature_spec: str | None = flag(
        None,
        help="JSON/YAML file with num_embeddings_per_feature (e.g. the data's metadata.json) or features: {name: rows}",
    )


@dataclass
class PlanOutputFlags:
    """What ``plan`` writes besides its report (``inspect`` takes --chart)."""

    output: str | None = flag(None, help="write the plan here (JSON), for --sharding_plan")
    chart: str | None = flag(None, help="write a PNG chart of the memory per rank here")
    no_search: bool = flag(False, help="when it does not fit, do not look for the number of ranks that would hold it")


@dataclass
class SweepFlags:
    """What ``sweep`` tries."""

    world_sizes: list[int] | None = flag(None, help="ranks to try, comma-separated (default --preset's)")
    scale_factors: list[float] | None = flag(None, help="multiply the table sizes by each of these, comma-separated")


def _add_table_flags(p: argparse.ArgumentParser, sweep: bool) -> None:
    """The training command line's model, table-size, embedding-optimizer and batch
    flags (the same parser pieces), and where else the tables may come from."""
    add_flags(p, TableSourceFlags)
    add_flags(p.add_argument_group("model (the training flags; the MLPs do not change the plan)"), ModelConfig)
    tables = p.add_argument_group("table sizes (the training flags)")
    if sweep:
        # Repeated for several configurations: an append, which a field's flag is not.
        tables.add_argument(
            "--num_embeddings_per_feature",
            type=flag_of(TableSizes, "num_embeddings_per_feature").parse_type(),
            action="append",
            default=argparse.SUPPRESS,
            help="rows of each table; repeat the flag for several configurations",
        )
    add_flags(tables, TableSizes, exclude=("num_embeddings_per_feature",) if sweep else ())
    add_flags(
        p.add_argument_group("embedding optimizer (the training flags; its state takes memory)"),
        EmbeddingOptimizerConfig,
    )
    add_flags(p, DataConfig, exclude=_BATCH_ONLY)


def build_parser() -> argparse.ArgumentParser:
    """The three subcommands and their flags."""
    parser = OneLineParser(prog=PROG, description="Sharding plans without the hardware.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{plan,inspect,sweep}")
    plan = sub.add_parser("plan", help="plan tables for a topology", description="Plan tables for a topology.")
    _add_table_flags(plan, sweep=False)
    add_flags(plan, TopologyFlags)
    add_flags(plan, ShardingFlags)
    add_flags(plan, PlanOutputFlags)
    inspect = sub.add_parser("inspect", help="print a saved plan", description="Print a saved plan.")
    inspect.add_argument("plan_file", help="a plan written by `plan --output`")
    add_flags(inspect, PlanOutputFlags, exclude=("output", "no_search"))
    sweep = sub.add_parser(
        "sweep",
        help="table sizes x world sizes -> one table",
        description="Plan several table sizes on several world sizes.",
    )
    _add_table_flags(sweep, sweep=True)
    add_flags(sweep, SweepFlags, exclude=("scale_factors",))
    add_flags(sweep, TopologyFlags, exclude=("world_size",))
    add_flags(sweep, ShardingFlags)
    add_flags(sweep, SweepFlags, exclude=("world_sizes",))
    return parser


@dataclass
class _Layers:
    """The defaults under the command line: the recipe's (typed by this tool's config
    classes) and the preset's topology."""

    label: str | None
    recipe: tuple[Overrides, ...]
    topology: tuple[Overrides, ...]


def _layers(args: argparse.Namespace) -> _Layers:
    source = TableSourceFlags(**config_values(TableSourceFlags, args))
    if source.preset is not None and source.recipe is not None:
        raise FlagError(
            "give --preset or --recipe, not both: a preset is its recipe plus a topology "
            "(the topology flags change that part)"
        )
    preset: Preset | None = find_preset(source.preset) if source.preset is not None else None
    recipe: Recipe | None = preset.recipe if preset is not None else RECIPES.get(source.recipe or "")
    if recipe is None:
        return _Layers(None, (), ())
    layers = recipe.overrides(_PLAN_CONFIGS, only_their_flags=True)
    if any(
        getattr(args, name, None) is not None
        for name in ("num_embeddings_per_feature", "num_embeddings", "feature_spec")
    ):
        layers = tuple(layer for layer in layers if layer.config_class is not TableSizes)  # the tables given win
    topology = (Overrides(TopologyFlags, **dataclasses.asdict(preset.topology)),) if preset is not None else ()
    return _Layers(preset.title if preset is not None else recipe.name, layers, topology)


def _positive(value: float | None, flag_name: str) -> None:
    if value is not None and not value > 0:
        raise BadInput(f"{flag_name} must be positive, got {value:g}")


def _table_sets(args: argparse.Namespace, layers: _Layers) -> list[tuple[str, list[str], list[int]]]:
    """[(label, feature names, rows)]: one set, or one per sweep configuration, capped
    at --max_table_rows."""
    given_sizes = [
        name
        for name in ("num_embeddings_per_feature", "num_embeddings", "feature_spec")
        if getattr(args, name, None) is not None
    ]
    if len(given_sizes) > 1:
        raise BadInput(f"give only one of {' and '.join('--' + name for name in given_sizes)}")
    tables = TableSizes(**config_values(TableSizes, args, layers.recipe, exclude=("num_embeddings_per_feature",)))
    tables.validate()
    sweep = args.command == "sweep"
    per_feature = getattr(args, "num_embeddings_per_feature", None)
    recipe_rows = config_values(TableSizes, argparse.Namespace(), layers.recipe)["num_embeddings_per_feature"]
    if per_feature is not None:
        lists = per_feature if sweep else [per_feature]
        sets = [
            (f"sizes {i + 1}" if len(lists) > 1 else "sizes", _feature_names(len(rows)), rows)
            for i, rows in enumerate(lists)
        ]
    elif tables.num_embeddings is not None:
        names = list(_DEFAULT_FEATURES.sparse_feature_names)
        sets = [(f"{len(names)} x {tables.num_embeddings}", names, tables.resolve(len(names), None))]
    elif getattr(args, "feature_spec", None) is not None:
        names, rows = read_feature_spec(args.feature_spec)
        sets = [(args.feature_spec, names, rows)]
    elif recipe_rows is not None:
        sets = [(layers.label or "", _feature_names(len(recipe_rows)), list(recipe_rows))]
    else:
        raise BadInput(
            "say which tables: --preset, a --recipe with tables, --num_embeddings_per_feature, "
            "--num_embeddings or --feature_spec"
        )
    factors = getattr(args, "scale_factors", None)
    for factor in factors or []:
        _positive(factor, "--scale_factors")
    if factors:
        sets = [
            (f"{label} x{f:g}", names, [max(1, round(r * f)) for r in rows])
            for label, names, rows in sets
            for f in factors
        ]
    cap = TableSizes(max_table_rows=tables.max_table_rows)
    return [(label, names, cap.resolve(len(rows), rows)) for label, names, rows in sets]


def _feature_names(count: int) -> list[str]:
    return [f"cat_{k}" for k in range(count)]


def _topology(args: argparse.Namespace, layers: _Layers, world_size: int, batch_size: int) -> PlannerConfig:
    flags = TopologyFlags(**{**config_values(TopologyFlags, args, layers.topology), "world_size": world_size})
    if not given(args, TopologyFlags, "local_world_size"):
        # A preset's (or the usual) host size, on a job that may be smaller than a host.
        flags.local_world_size = min(flags.local_world_size or DEFAULT_LOCAL_WORLD_SIZE, world_size)
    if flags.compute_device == "cpu" and not given(args, TopologyFlags, "hbm_gb"):
        flags.hbm_gb = None  # a preset's GPUs: with cpu the tables live in host memory
    flags.validate()
    assert flags.local_world_size is not None
    hbm_bytes = None
    if flags.compute_device == "cuda":
        if flags.hbm_gb is not None:
            hbm_bytes = int(flags.hbm_gb * GIB)
        elif torch.cuda.is_available():
            hbm_bytes = torch.cuda.get_device_properties(0).total_memory
        else:
            raise BadInput("--hbm_gb is needed for --compute_device cuda on a machine without a GPU")
    ddr_bytes = int(flags.ddr_gb * GIB) if flags.ddr_gb is not None else host_memory_bytes() // flags.local_world_size
    return PlannerConfig(
        world_size=world_size,
        local_world_size=flags.local_world_size,
        compute_device=flags.compute_device,
        batch_size=batch_size,
        hbm_cap_bytes=hbm_bytes,
        ddr_cap_bytes=ddr_bytes,
        intra_host_bw_gib_s=flags.intra_node_bandwidth,
        inter_host_bw_gib_s=flags.inter_node_bandwidth,
    )


def _requests(args: argparse.Namespace) -> list[tuple[str, PlanRequest]]:
    """[(label, request)] for every table set x world size the flags ask for."""
    layers = _layers(args)
    if args.command == "sweep":
        world_sizes = SweepFlags(**config_values(SweepFlags, args)).world_sizes
        for world_size in world_sizes or []:
            _positive(world_size, option(SweepFlags, "world_sizes"))
    else:
        world_sizes = None
    if not world_sizes:
        world_sizes = [config_values(TopologyFlags, args, layers.topology)["world_size"]]
    constraints = ShardingFlags(**config_values(ShardingFlags, args)).constraints()
    model = config_values(ModelConfig, args, layers.recipe)
    optimizer = EmbeddingOptimizerConfig(**config_values(EmbeddingOptimizerConfig, args, layers.recipe))
    optimizer.validate()
    data = config_values(DataConfig, args, layers.recipe, exclude=_BATCH_ONLY)
    batch_size, multi_hot_sizes = data["batch_size"], data["multi_hot_sizes"]
    _positive(batch_size, option(DataConfig, "batch_size"))
    requests = []
    for label, names, rows in _table_sets(args, layers):
        if any(given(args, ModelConfig, name) for name in _DENSE_FLAGS):
            # The training command line's MLPs: refused here as training would refuse them.
            ModelConfig(
                num_embeddings_per_feature=rows,
                sparse_feature_names=names,
                dense_in_features=_DEFAULT_FEATURES.num_dense_features,
                **model,
            ).validate()
        if multi_hot_sizes is not None and len(multi_hot_sizes) != len(rows):
            raise FlagError(
                f"{option(DataConfig, 'multi_hot_sizes')} has {len(multi_hot_sizes)} values for {len(rows)} tables"
            )
        for world_size in world_sizes:
            request = PlanRequest(
                feature_names=names,
                num_embeddings_per_feature=rows,
                embedding_dim=model["embedding_dim"],
                embedding_precision=model["embedding_precision"],
                optimizer=optimizer.optimizer,
                topology=_topology(args, layers, world_size, batch_size),
                constraints=constraints,
                pooling_factors=[float(n) for n in multi_hot_sizes] if multi_hot_sizes is not None else None,
            )
            request.validate()
            requests.append((label, request))
    return requests


def _rank_kind(topology: PlannerConfig) -> str:
    if topology.compute_device == "cuda":
        return f"GPUs of {(topology.hbm_cap_bytes or 0) / GIB:g} GiB"
    return f"CPU ranks of {(topology.ddr_cap_bytes or 0) / GIB:g} GiB"


def _does_not_fit(request: PlanRequest, reason: str, search: bool) -> str:
    """The verdict for a plan that does not fit, with the ranks that would hold it."""
    topology = request.topology
    weights = sum(t.num_bytes for t in request.tables.values()) / GIB
    usable = rank_capacity_bytes(topology) * topology.world_size / GIB
    lines = [
        f"verdict: does NOT fit on {topology.world_size} {_rank_kind(topology)}: {reason} "
        f"(weights alone: {weights:.2f} GiB; {usable:.2f} GiB usable for embeddings in all)"
    ]
    if not search:
        return "\n".join(lines)

    def progress(world_size: int, fits: bool) -> None:
        print(f"  {world_size} ranks: {'fits' if fits else 'does not fit'}", file=sys.stderr, flush=True)

    print("looking for the number of ranks that holds it:", file=sys.stderr, flush=True)
    fitting, failing = smallest_fitting_world_size(request, progress)
    unit = topology.local_world_size if topology.world_size % topology.local_world_size == 0 else 1
    if fitting is None:
        lines.append(f"no plan found up to {failing} {_rank_kind(topology)} (the constraints may prevent one)")
    elif fitting - failing <= unit:
        hosts = f" (whole hosts of {unit} were tried)" if unit > 1 else ""
        lines.append(f"needs at least {fitting} {_rank_kind(topology)}{hosts}")
    else:
        lines.append(f"fits on {fitting} {_rank_kind(topology)}, not on {failing}")
    return "\n".join(lines)


def _uvm_tables(saved: SavedPlan) -> list[str]:
    """The tables a CUDA plan keeps partly in host memory (UVM kernels), sorted."""
    if saved.topology.compute_device != "cuda":
        return []
    return sorted(
        {
            t
            for module in saved.plan.plan.values()
            for t, ps in module.items()
            if ps.compute_kernel in ("fused_uvm", "fused_uvm_caching")
        }
    )


def _through_uvm(uvm: list[str]) -> str:
    return f"{len(uvm)} table(s) partly in host memory through UVM"


def _fits_verdict(saved: SavedPlan) -> str:
    topology = saved.topology
    verdict = f"verdict: fits on {topology.world_size} {_rank_kind(topology)}"
    uvm = _uvm_tables(saved)
    if uvm:
        verdict += (
            f", with {_through_uvm(uvm)} ({', '.join(uvm[:4])}{', ...' if len(uvm) > 4 else ''}): slower than HBM"
        )
    return verdict


def _chart(saved: SavedPlan, outputs: PlanOutputFlags) -> None:
    if outputs.chart:
        write_memory_chart(saved, outputs.chart)
        print(f"chart written to {outputs.chart}")


def _plan(args: argparse.Namespace) -> int:
    [(label, request)] = _requests(args)
    outputs = PlanOutputFlags(**config_values(PlanOutputFlags, args))
    try:
        saved = plan_request(request)
    except PlanDoesNotFit as e:
        print(_does_not_fit(request, str(e), search=not outputs.no_search))
        return EXIT_DOES_NOT_FIT
    print(format_plan_report(saved, request.pooling_factors))
    print(_fits_verdict(saved))
    if outputs.output:
        write_plan(outputs.output, saved)
        print(f"plan written to {outputs.output}")
    _chart(saved, outputs)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    saved = read_plan(args.plan_file)
    print(format_plan_report(saved))
    _chart(saved, PlanOutputFlags(**config_values(PlanOutputFlags, args)))
    return 0


def _sweep(args: argparse.Namespace) -> int:
    requests = _requests(args)
    header = (
        f"{'tables':<24} {'weights':>11} {'ranks':>6}  {'fits':<4} {'largest rank':>13} "
        f"{'usable/rank':>12} {'imbalance':>9} {'step (ms)':>10}"
    )
    print(header)
    for label, request in requests:
        weights = sum(t.num_bytes for t in request.tables.values())
        topology = request.topology
        usable = format_bytes(rank_capacity_bytes(topology))
        try:
            saved = plan_request(request)
        except PlanDoesNotFit:
            print(
                f"{label:<24} {format_bytes(weights):>11} {topology.world_size:>6}  {'no':<4} {'-':>13} "
                f"{usable:>12} {'-':>9} {'-':>10}",
                flush=True,
            )
            continue
        assert saved.estimates is not None
        top = largest_rank(saved.estimates)
        step = max(e.step_time_ms for e in saved.estimates)
        uvm = _uvm_tables(saved)
        # "uvm": it fits only because tables spill to host memory, slower than HBM.
        print(
            f"{label:<24} {format_bytes(weights):>11} {topology.world_size:>6}  {'uvm' if uvm else 'yes':<4} "
            f"{format_bytes(top.total_bytes):>13} {usable:>12} {memory_imbalance(saved.estimates):>9.2f} "
            f"{step:>10.3f}" + (f"  {_through_uvm(uvm)}: slower than HBM" if uvm else ""),
            flush=True,
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs a subcommand; returns the exit code (bad input: one line on stderr, 2).

    Example::

        main(["plan", "--preset", "mlperf", "--output", "mlperf.json"])
    """
    args = build_parser().parse_args(argv)
    command = {"plan": _plan, "inspect": _inspect, "sweep": _sweep}[args.command]
    return run_cli(lambda: command(args), f"{PROG} {args.command}")
