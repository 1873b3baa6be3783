"""DLRMv2 (MLPerf's DLRM-DCNv2) training speed on one device, on multi-hot batches made there.

Builds ``dcnv2_main.py --recipe dlrmv2`` (the MLPerf tables, 214 ids a sample in 26
multi-hot bags, DCNv2 3 x rank 512, fp16 tables, bf16 dense, row-wise Adagrad, batch
65536), plans it onto this device with the bags' sizes (`sharding_plans`; the plan and
why each table went where it did are printed), and trains it on synthetic batches
generated once on the device and cycled, so the host neither expands bags nor copies
batches. The steps after ``--warmup_steps`` are timed between two device syncs (no
sync, log or reduction per step); the losses are checked finite once at the end.

It reports samples/s, and from the model's bytes and FLOPs per sample (`traffic` and
`flops_per_sample`, the formulas in docs/benchmarks.md) against the card's published
peaks (`PEAKS`): the embedding lookups' share of HBM bandwidth and the dense part's
share of bf16 peak. Its last line is one JSON object.

    python -m bench.dlrmv2_throughput [--steps 60] [--warmup_steps 10] [--hbm_gb GiB]
        [--one_hot] [--tiny] [--flags="--batch_size 32768 ..."]

``--one_hot`` trains DCNv2 at the MLPerf size with one id a table (the peer figure of
the issue's DCNv2 step); ``--hbm_gb`` plans as if the device had that much memory (a
small budget forces UVM caching, and its misses); ``--tiny`` shrinks tables, width,
MLPs and batch for a CPU test of the same code.
"""

import json
import math
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from common.cli import OneLineParser, cli_main
from common.config_flags import flag, parse_flags
from common.errors import BadInput

PROG = "python -m bench.dlrmv2_throughput"
# Published dense peaks of the cards the session runs on: (HBM bytes/s, bf16 dense FLOP/s).
PEAKS = {
    "H100": (3.35e12, 989e12),  # H100 SXM5 80 GB
    "H200": (4.8e12, 989e12),
}
GENERATED_BATCHES = 4  # distinct device batches cycled through (ids differ between steps)
TINY = [
    "--max_table_rows",
    "1000",
    "--embedding_dim",
    "16",
    "--dense_arch_layer_sizes",
    "32,16",
    "--over_arch_layer_sizes",
    "32,16,1",
    "--dcn_low_rank_dim",
    "8",
    "--batch_size",
    "64",
]


def card_peaks(device_name: str) -> tuple[float, float] | None:
    """(HBM bytes/s, bf16 FLOP/s) of a card named like ``NVIDIA H200``; None if unknown."""
    return next((peaks for card, peaks in PEAKS.items() if card in device_name.upper()), None)


def mlp_macs(in_features: int, sizes: Sequence[int]) -> int:
    macs = 0
    for out in sizes:
        macs, in_features = macs + in_features * out, out
    return macs


def flops_per_sample(
    num_dense: int, num_tables: int, dim: int, bottom: Sequence[int], top: Sequence[int], dcn_layers: int, dcn_rank: int
) -> float:
    """Training FLOPs of one sample of the DCNv2 model: 2 FLOPs a multiply-add, backward
    twice the forward (its two matmuls a layer). Forward multiply-adds: the bottom MLP,
    each low-rank cross layer's two projections (W -> rank -> W, W = (tables + 1) x dim),
    the top MLP from W. Elementwise work (activations, the cross layers' products) and
    the embedding pooling are left out: they are bandwidth, not FLOPs."""
    width = (num_tables + 1) * dim
    forward = mlp_macs(num_dense, bottom) + dcn_layers * 2 * width * dcn_rank + mlp_macs(width, top)
    return 3 * 2 * forward


def optimizer_state_bytes(optimizer: str, dim: int) -> int:
    """fp32 bytes of optimizer state a table row carries."""
    return {"rowwise_adagrad": 4, "adagrad": 4 * dim, "sgd": 0, "adam": 8 * dim}.get(optimizer, 4 * dim)


def traffic(
    bag_sizes: Sequence[int], dim: int, weight_bytes: int, state_bytes: int, index_bytes: int = 8, pooled_bytes: int = 4
) -> float:
    """HBM bytes one sample's embedding work moves, at least: for every id, its row
    read in the forward, read and written by the fused update, its optimizer state read
    and written, its index read in forward and backward; for every table, the pooled
    output written (fp32) and its gradient read. Cache lines, sorting the ids for the
    update and the all-to-alls (none on one GPU) are left out: a lower bound."""
    per_id = 3 * dim * weight_bytes + 2 * state_bytes + 2 * index_bytes
    return sum(bag_sizes) * per_id + len(bag_sizes) * dim * 2 * pooled_bytes


@dataclass
class Dlrmv2Flags:
    """The flags of ``python -m bench.dlrmv2_throughput``."""

    steps: int = flag(60, help="timed training steps")
    warmup_steps: int = flag(10, help="steps before the timing (kernels' first runs, caches warming)")
    device: str = flag("cuda", choices=("cuda", "cpu"), help="where to train (cpu: with --tiny, a test)")
    hbm_gb: float | None = flag(None, help="plan as if the GPU had this many GiB (default: its own)")
    one_hot: bool = flag(False, help="one id a table instead of the recipe's bags (DCNv2 at the MLPerf size)")
    tiny: bool = flag(False, help="tiny tables, width, MLPs and batch (a CPU test of the same code)")
    flags: str = flag("", help='more training flags, after the recipe\'s (write --flags="--batch_size 32768")')


def device_batches(config, device: torch.device, count: int, seed: int = 0) -> list:
    """``count`` synthetic batches made on ``device``: uniform dense values and ids, each
    table's bag of its ``--multi_hot_sizes`` ids (one without), fair labels."""
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    generator = torch.Generator(device=device).manual_seed(seed)
    rows = config.data.batch_size
    model = config.model
    bags = config.data.multi_hot_sizes or [1] * len(model.sparse_feature_names)
    batches = []
    for _ in range(count):
        values = torch.cat(
            [
                torch.randint(0, n, (rows * h,), device=device, generator=generator)
                for n, h in zip(model.num_embeddings_per_feature, bags)
            ]
        )
        lengths = torch.cat([torch.full((rows,), h, dtype=torch.int32, device=device) for h in bags])
        sparse = KeyedJaggedTensor(keys=list(model.sparse_feature_names), values=values, lengths=lengths)
        dense = torch.rand(rows, model.dense_in_features, device=device, generator=generator)
        labels = torch.randint(0, 2, (rows,), device=device, generator=generator)
        batches.append(Batch(dense_features=dense, sparse_features=sparse, labels=labels))
    return batches


def _cycle(batches: list, steps: int):
    for step in range(steps):
        yield batches[step % len(batches)]


@cli_main(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0]), Dlrmv2Flags, argv)
    if args.steps <= 0 or args.warmup_steps < 0 or (args.hbm_gb is not None and args.hbm_gb <= 0):
        raise BadInput("--steps must be positive, --warmup_steps not negative, --hbm_gb positive")
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    from models import build_dlrm_train
    from models.embedding_optimizer import attach_fused_embedding_optimizer
    from sharding_plans import PlannerConfig, plan_summary
    from sharding_plans.planner import host_memory_bytes
    from sharding_plans.report import format_plan_report
    from sharding_plans.types import SavedPlan, TableSpec
    from training.distributed import init_process_group, resolve_env
    from training.flags import parse_config
    from training.optimizers import build_combined_optimizer
    from training.pipelines import build_pipeline
    from training.recipes import DCNV2
    from training.sharding import prepare_sharding

    argv_train = ["--recipe", "dlrmv2", "--device", args.device, "--pipeline", "sparse_dist"]
    if args.one_hot:
        argv_train += ["--multi_hot_sizes", ",".join(["1"] * 26)]
    if args.tiny:
        argv_train += TINY + (["--dense_precision", "fp32"] if args.device == "cpu" else [])
    config = parse_config(argv_train + shlex.split(args.flags), PROG, "", entry_recipe=DCNV2)
    env = resolve_env(args.device)
    device = env.device
    torch.manual_seed(config.seed)
    model = build_dlrm_train(config.model, dense_device=device)
    attach_fused_embedding_optimizer(model.model.sparse_arch, config.optim)
    sharding = prepare_sharding(config, env, model)
    group = init_process_group(env)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # what fp32 matmuls remain (the loss, bf16's masters)
        torch.backends.cudnn.allow_tf32 = True
    hbm = int(args.hbm_gb * 2**30) if args.hbm_gb else None
    if device.type == "cuda" and hbm is None:
        hbm = torch.cuda.get_device_properties(device).total_memory
    planner = PlannerConfig(
        world_size=1,
        local_world_size=1,
        compute_device=device.type,
        batch_size=config.data.batch_size,
        hbm_cap_bytes=hbm,
        ddr_cap_bytes=host_memory_bytes(),
    )
    plan, estimates = sharding.plan(model, planner, group)
    m = config.model
    tables = {
        name: TableSpec(rows, m.embedding_dim, m.embedding_precision)
        for name, rows in zip(m.table_names, m.num_embeddings_per_feature)
    }
    bags = config.data.multi_hot_sizes or [1] * len(tables)
    print(format_plan_report(SavedPlan(planner, tables, plan, estimates), bags), flush=True)
    # torchrec's own init of the shards, on the device (the seeded init fills them on the host).
    dmp = DistributedModelParallel(
        module=model, device=device, env=ShardingEnv.from_process_group(group), plan=plan, sharders=sharding.sharders
    )
    optimizer = build_combined_optimizer(dmp, config.optim)
    pipeline = build_pipeline(config.pipeline, dmp, optimizer, device, config.amp)
    batches = device_batches(config, device, GENERATED_BATCHES)
    losses = []

    def run(steps: int) -> None:
        iterator = _cycle(batches, steps)
        for _ in range(steps):
            loss, *_ = pipeline.progress(iterator)
            losses.append(loss.detach())

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    run(args.warmup_steps)
    sync()
    start = time.perf_counter()
    run(args.steps)
    sync()
    seconds = time.perf_counter() - start
    finite = bool(torch.isfinite(torch.stack(losses)).all())
    samples_per_sec = args.steps * config.data.batch_size / seconds
    flops = flops_per_sample(
        m.dense_in_features,
        len(tables),
        m.embedding_dim,
        m.dense_arch_layer_sizes,
        m.over_arch_layer_sizes,
        m.interaction.dcn_num_layers,
        m.interaction.dcn_low_rank_dim,
    )
    moved = traffic(
        bags,
        m.embedding_dim,
        2 if m.embedding_precision == "fp16" else 4,
        optimizer_state_bytes(config.optim.optimizer, m.embedding_dim),
    )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peaks = card_peaks(name)
    summary = plan_summary(plan)
    result = {
        "device": name,
        "samples_per_sec": round(samples_per_sec),
        "steps": args.steps,
        "batch_size": config.data.batch_size,
        "seconds": round(seconds, 3),
        "losses_finite": finite,
        "ids_per_sample": sum(bags),
        "embedding_bytes_per_sample": round(moved),
        "dense_flops_per_sample": round(flops),
        "hbm_share": round(samples_per_sec * moved / peaks[0], 4) if peaks else None,
        "bf16_peak_share": round(samples_per_sec * flops / peaks[1], 4) if peaks else None,
        "peaks": {"hbm_bytes_per_sec": peaks[0], "bf16_flops": peaks[1]} if peaks else None,
        "kernels": {t: s["compute_kernel"] for t, s in summary.items()},
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "planned_step_ms": max(e.step_time_ms for e in estimates) if estimates else None,
    }
    shares = (
        f" | lookups {100 * result['hbm_share']:.1f}% of HBM bandwidth, dense "
        f"{100 * result['bf16_peak_share']:.1f}% of bf16 peak"
        if peaks
        else ""
    )
    print(
        f"{name}: {samples_per_sec:,.0f} samples/s (batch {config.data.batch_size}, {args.steps} steps in "
        f"{seconds:.2f} s){shares}; losses finite: {finite}",
        flush=True,
    )
    print(json.dumps(result), flush=True)
    return 0 if finite and math.isfinite(samples_per_sec) else 1


if __name__ == "__main__":
    sys.exit(main())
