"""`python -m sharding_plans plan|inspect|sweep`: sharding plans without the hardware.

- ``plan``: plans the tables for a topology (meta tensors: no GPU, no process
  group), prints the plan, the memory and step time per rank and a verdict;
  ``--output plan.json`` saves it (for ``--sharding_plan`` of the entry points),
  ``--chart memory.png`` draws the memory per rank.
- ``inspect PLAN.json``: prints (and charts) a saved plan.
- ``sweep``: several table sizes (or scale factors) x world sizes -> one table.

Exit codes: 0 it fits (or done); 1 the plan does not fit; 2 bad input (one line on
stderr).
"""

import argparse
import sys
from typing import Any, Optional
from collections.abc import Sequence

import torch

from common.config_flags import add_flags, config_values, flag_of, flags_of, given
from data.config import DataConfig
from data.sources import RandomData
from models.config import ModelConfig, TableSizes
from models.embedding_optimizer_config import EmbeddingOptimizerConfig
from sharding_plans.chart import write_memory_chart
from sharding_plans.constraints import ShardingFlags
from sharding_plans.dry_run import PlanRequest, plan_request, rank_capacity_bytes, smallest_fitting_world_size
from sharding_plans.feature_spec import read_feature_spec
from sharding_plans.plan_file import SavedPlan, read_plan, write_plan
from sharding_plans.planner import PlanDoesNotFit, PlannerConfig, host_memory_bytes
from sharding_plans.presets import PRESETS, Preset, find_preset
from sharding_plans.report import format_plan_report, largest_rank, memory_imbalance
from common.byte_sizes import format_bytes
from common.cli import OneLineParser, int_list, run_cli
from common.errors import BadInput

PROG = "python -m sharding_plans"
_GIB = 1024**3
DEFAULT_EMBEDDING_DIM = flag_of(ModelConfig, "embedding_dim").default  # dlrm_main.py's
# The features of a training run given no data (Criteo-shaped random data): the tables
# of --num_embeddings, and the numerical features the training MLP flags are checked with.
_DEFAULT_FEATURES = RandomData(DataConfig()).describe()
DEFAULT_BATCH_SIZE = flag_of(DataConfig, "batch_size").default  # the entry points'
# The model flags that do not change a plan: checked as training would check them.
_DENSE_FLAGS = tuple(f.field.name for f in flags_of(ModelConfig) if f.field.name not in
                     ("embedding_dim", "embedding_precision"))
DEFAULT_LOCAL_WORLD_SIZE = 8  # GPUs per host of the common 8-GPU servers
EXIT_DOES_NOT_FIT = 1


def float_list(text: str) -> list[float]:
    """Parses "0.5,1,2"."""
    try:
        return [float(item) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"malformed list {text!r}: expected comma-separated numbers")


def _add_table_flags(p: argparse.ArgumentParser, sweep: bool) -> None:
    """The training command line's model, table-size and embedding-optimizer flags
    (the same parser pieces), the preset, and the batch size."""
    a = p.add_argument
    a("--preset", default=None,
      help=f"a published TorchRec DLRM configuration: {', '.join(PRESETS)} (flags given override it)")
    add_flags(p.add_argument_group("model (the training flags; the MLPs do not change the plan)"), ModelConfig)
    tables = p.add_argument_group("table sizes (the training flags)")
    if sweep:
        tables.add_argument("--num_embeddings_per_feature", type=int_list, action="append", default=argparse.SUPPRESS,
                            help="rows of each table; repeat the flag for several configurations")
    add_flags(tables, TableSizes, exclude=("num_embeddings_per_feature",) if sweep else ())
    a("--feature_spec", default=None,
      help="JSON/YAML file with num_embeddings_per_feature (e.g. the data's metadata.json) or features: {name: rows}")
    add_flags(p.add_argument_group("embedding optimizer (the training flags; its state takes memory)"),
              EmbeddingOptimizerConfig)
    a("--batch_size", type=int, default=None, help=f"training rows per rank per step (default {DEFAULT_BATCH_SIZE})")


def _add_topology_flags(p: argparse.ArgumentParser, sweep: bool) -> None:
    a = p.add_argument
    if sweep:
        a("--world_sizes", type=int_list, default=None, help="ranks to try, comma-separated (default --preset's)")
    else:
        a("--world_size", type=int, default=None, help="ranks (default 1)")
    a("--local_world_size", type=int, default=None,
      help=f"ranks per host (default {DEFAULT_LOCAL_WORLD_SIZE}, at most the world size)")
    a("--compute_device", choices=("cuda", "cpu"), default="cuda", help="where the tables live")
    a("--hbm_gb", type=float, default=None, help="GiB of memory per GPU (cuda; default: this machine's GPU)")
    a("--ddr_gb", type=float, default=None,
      help="GiB of host memory per rank (default: this machine's memory / --local_world_size)")
    a("--intra_node_bandwidth", type=float, default=None, help="GiB/s between ranks of a host (default torchrec's)")
    a("--inter_node_bandwidth", type=float, default=None, help="GiB/s between hosts, per rank (default torchrec's)")
    add_flags(p, ShardingFlags)


def build_parser() -> argparse.ArgumentParser:
    """The three subcommands and their flags."""
    parser = OneLineParser(prog=PROG, description="Sharding plans without the hardware.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{plan,inspect,sweep}")
    plan = sub.add_parser("plan", help="plan tables for a topology", description="Plan tables for a topology.")
    _add_table_flags(plan, sweep=False)
    _add_topology_flags(plan, sweep=False)
    plan.add_argument("--output", default=None, help="write the plan here (JSON), for --sharding_plan")
    plan.add_argument("--chart", default=None, help="write a PNG chart of the memory per rank here")
    plan.add_argument("--no_search", action="store_true",
                      help="when it does not fit, do not look for the number of ranks that would hold it")
    inspect = sub.add_parser("inspect", help="print a saved plan", description="Print a saved plan.")
    inspect.add_argument("plan_file", help="a plan written by `plan --output`")
    inspect.add_argument("--chart", default=None, help="write a PNG chart of the memory per rank here")
    sweep = sub.add_parser("sweep", help="table sizes x world sizes -> one table",
                           description="Plan several table sizes on several world sizes.")
    _add_table_flags(sweep, sweep=True)
    _add_topology_flags(sweep, sweep=True)
    sweep.add_argument("--scale_factors", type=float_list, default=None,
                       help="multiply the table sizes by each of these, comma-separated")
    return parser


def _pick(value: Any, preset: Optional[Preset], attribute: str, default: Any) -> Any:
    """The flag if given, else the preset's value, else the default."""
    if value is not None:
        return value
    if preset is not None:
        return getattr(preset, attribute)
    return default


def _positive(value: Optional[float], flag: str) -> None:
    if value is not None and not value > 0:
        raise BadInput(f"{flag} must be positive, got {value:g}")


def _table_sets(args: argparse.Namespace, preset: Optional[Preset]) -> list[tuple[str, list[str], list[int]]]:
    """[(label, feature names, rows)]: one set, or one per sweep configuration, capped
    at --max_table_rows."""
    tables = TableSizes(**config_values(TableSizes, args, exclude=("num_embeddings_per_feature",)))
    tables.validate()
    per_feature = getattr(args, "num_embeddings_per_feature", None)
    given_sizes = [name for name, value in (("--num_embeddings_per_feature", per_feature),
                                            ("--num_embeddings", tables.num_embeddings),
                                            ("--feature_spec", args.feature_spec)) if value is not None]
    if len(given_sizes) > 1:
        raise BadInput(f"give only one of {' and '.join(given_sizes)}")
    sweep = args.command == "sweep"
    if per_feature is not None:
        lists = per_feature if sweep else [per_feature]
        sets = [(f"sizes {i + 1}" if len(lists) > 1 else "sizes", _feature_names(len(rows)), rows)
                for i, rows in enumerate(lists)]
    elif tables.num_embeddings is not None:
        names = list(_DEFAULT_FEATURES.sparse_feature_names)
        sets = [(f"{len(names)} x {tables.num_embeddings}", names, tables.resolve(len(names), None))]
    elif args.feature_spec is not None:
        names, rows = read_feature_spec(args.feature_spec)
        sets = [(args.feature_spec, names, rows)]
    elif preset is not None:
        rows = list(preset.num_embeddings_per_feature)
        sets = [(preset.title, _feature_names(len(rows)), rows)]
    else:
        raise BadInput("say which tables: --preset, --num_embeddings_per_feature, --num_embeddings or --feature_spec")
    factors = getattr(args, "scale_factors", None)
    for factor in factors or []:
        _positive(factor, "--scale_factors")
    if factors:
        sets = [(f"{label} x{f:g}", names, [max(1, round(r * f)) for r in rows])
                for label, names, rows in sets for f in factors]
    cap = TableSizes(max_table_rows=tables.max_table_rows)
    return [(label, names, cap.resolve(len(rows), rows)) for label, names, rows in sets]


def _feature_names(count: int) -> list[str]:
    return [f"cat_{k}" for k in range(count)]


def _topology(args: argparse.Namespace, preset: Optional[Preset], world_size: int) -> PlannerConfig:
    _positive(world_size, "--world_sizes" if args.command == "sweep" else "--world_size")
    local = args.local_world_size
    _positive(local, "--local_world_size")
    if local is not None and local > world_size:
        raise BadInput(f"--local_world_size ({local}) must not exceed the world size ({world_size})")
    if local is None:
        local = min(_pick(None, preset, "local_world_size", DEFAULT_LOCAL_WORLD_SIZE), world_size)
    hbm_gb = args.hbm_gb
    _positive(hbm_gb, "--hbm_gb")
    _positive(args.ddr_gb, "--ddr_gb")
    _positive(args.intra_node_bandwidth, "--intra_node_bandwidth")
    _positive(args.inter_node_bandwidth, "--inter_node_bandwidth")
    batch_size = _pick(args.batch_size, preset, "batch_size", DEFAULT_BATCH_SIZE)
    _positive(batch_size, "--batch_size")
    hbm_bytes = None
    if args.compute_device == "cuda":
        hbm_gb = _pick(hbm_gb, preset, "hbm_gb", None)
        if hbm_gb is not None:
            hbm_bytes = int(hbm_gb * _GIB)
        elif torch.cuda.is_available():
            hbm_bytes = torch.cuda.get_device_properties(0).total_memory
        else:
            raise BadInput("--hbm_gb is needed for --compute_device cuda on a machine without a GPU")
    elif hbm_gb is not None:
        raise BadInput("--hbm_gb is for --compute_device cuda; with cpu the tables live in --ddr_gb")
    ddr_gb = _pick(args.ddr_gb, preset, "ddr_gb", None)
    ddr_bytes = int(ddr_gb * _GIB) if ddr_gb is not None else host_memory_bytes() // local
    return PlannerConfig(
        world_size=world_size, local_world_size=local, compute_device=args.compute_device, batch_size=batch_size,
        hbm_cap_bytes=hbm_bytes, ddr_cap_bytes=ddr_bytes,
        intra_host_bw_gib_s=args.intra_node_bandwidth, inter_host_bw_gib_s=args.inter_node_bandwidth,
    )


def _requests(args: argparse.Namespace) -> list[tuple[str, PlanRequest]]:
    """[(label, request)] for every table set x world size the flags ask for."""
    preset = find_preset(args.preset) if args.preset else None
    if args.command == "sweep":
        world_sizes = args.world_sizes or [_pick(None, preset, "world_size", 1)]
    else:
        world_sizes = [_pick(args.world_size, preset, "world_size", 1)]
    constraints = ShardingFlags(**config_values(ShardingFlags, args)).constraints()
    model = config_values(ModelConfig, args)
    model["embedding_dim"] = _pick(getattr(args, "embedding_dim", None), preset, "embedding_dim",
                                   DEFAULT_EMBEDDING_DIM)
    optimizer = EmbeddingOptimizerConfig(**config_values(EmbeddingOptimizerConfig, args))
    optimizer.validate()
    requests = []
    for label, names, rows in _table_sets(args, preset):
        if any(given(args, ModelConfig, name) for name in _DENSE_FLAGS):
            # The training command line's MLPs: refused here as training would refuse them.
            ModelConfig(num_embeddings_per_feature=rows, sparse_feature_names=names,
                        dense_in_features=_DEFAULT_FEATURES.num_dense_features, **model).validate()
        for world_size in world_sizes:
            request = PlanRequest(
                feature_names=names, num_embeddings_per_feature=rows, embedding_dim=model["embedding_dim"],
                embedding_precision=model["embedding_precision"], optimizer=optimizer.optimizer,
                topology=_topology(args, preset, world_size), constraints=constraints,
            )
            request.validate()
            requests.append((label, request))
    return requests


def _rank_kind(topology: PlannerConfig) -> str:
    if topology.compute_device == "cuda":
        return f"GPUs of {(topology.hbm_cap_bytes or 0) / _GIB:g} GiB"
    return f"CPU ranks of {(topology.ddr_cap_bytes or 0) / _GIB:g} GiB"


def _does_not_fit(request: PlanRequest, reason: str, search: bool) -> str:
    """The verdict for a plan that does not fit, with the ranks that would hold it."""
    topology = request.topology
    weights = sum(t.num_bytes for t in request.tables.values()) / _GIB
    usable = rank_capacity_bytes(topology) * topology.world_size / _GIB
    lines = [f"verdict: does NOT fit on {topology.world_size} {_rank_kind(topology)}: {reason} "
             f"(weights alone: {weights:.2f} GiB; {usable:.2f} GiB usable for embeddings in all)"]
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
    return sorted({t for module in saved.plan.plan.values() for t, ps in module.items()  # type: ignore[union-attr]
                   if ps.compute_kernel in ("fused_uvm", "fused_uvm_caching")})


def _through_uvm(uvm: list[str]) -> str:
    return f"{len(uvm)} table(s) partly in host memory through UVM"


def _fits_verdict(saved: SavedPlan) -> str:
    topology = saved.topology
    verdict = f"verdict: fits on {topology.world_size} {_rank_kind(topology)}"
    uvm = _uvm_tables(saved)
    if uvm:
        verdict += (f", with {_through_uvm(uvm)} "
                    f"({', '.join(uvm[:4])}{', ...' if len(uvm) > 4 else ''}): slower than HBM")
    return verdict


def _plan(args: argparse.Namespace) -> int:
    [(label, request)] = _requests(args)
    try:
        saved = plan_request(request)
    except PlanDoesNotFit as e:
        print(_does_not_fit(request, str(e), search=not args.no_search))
        return EXIT_DOES_NOT_FIT
    print(format_plan_report(saved))
    print(_fits_verdict(saved))
    if args.output:
        write_plan(args.output, saved)
        print(f"plan written to {args.output}")
    if args.chart:
        write_memory_chart(saved, args.chart)
        print(f"chart written to {args.chart}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    saved = read_plan(args.plan_file)
    print(format_plan_report(saved))
    if args.chart:
        write_memory_chart(saved, args.chart)
        print(f"chart written to {args.chart}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    requests = _requests(args)
    header = (f"{'tables':<24} {'weights':>11} {'ranks':>6}  {'fits':<4} {'largest rank':>13} "
              f"{'usable/rank':>12} {'imbalance':>9} {'step (ms)':>10}")
    print(header)
    for label, request in requests:
        weights = sum(t.num_bytes for t in request.tables.values())
        topology = request.topology
        usable = format_bytes(rank_capacity_bytes(topology))
        try:
            saved = plan_request(request)
        except PlanDoesNotFit:
            print(f"{label:<24} {format_bytes(weights):>11} {topology.world_size:>6}  {'no':<4} {'-':>13} "
                  f"{usable:>12} {'-':>9} {'-':>10}", flush=True)
            continue
        assert saved.estimates is not None
        top = largest_rank(saved.estimates)
        step = max(e.step_time_ms for e in saved.estimates)
        uvm = _uvm_tables(saved)
        # "uvm": it fits only because tables spill to host memory, slower than HBM.
        print(f"{label:<24} {format_bytes(weights):>11} {topology.world_size:>6}  {'uvm' if uvm else 'yes':<4} "
              f"{format_bytes(top.total_bytes):>13} {usable:>12} {memory_imbalance(saved.estimates):>9.2f} "
              f"{step:>10.3f}" + (f"  {_through_uvm(uvm)}: slower than HBM" if uvm else ""), flush=True)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs a subcommand; returns the exit code (bad input: one line on stderr, 2).

    Example::

        main(["plan", "--preset", "mlperf", "--output", "mlperf.json"])
    """
    args = build_parser().parse_args(argv)
    command = {"plan": _plan, "inspect": _inspect, "sweep": _sweep}[args.command]
    return run_cli(lambda: command(args), f"{PROG} {args.command}")
