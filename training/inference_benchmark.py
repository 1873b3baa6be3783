"""--mode inference_benchmark: forward-only throughput and latency percentiles per batch size.

The model is the run's sharded model (a checkpoint's weights when one is given, else
freshly built): the same forward as evaluation, without a pipeline, so a timed call is
one whole forward (input all-to-all, lookups, MLPs). Warm-up forwards are not timed.

Example::

    python dlrm_main.py --mode inference_benchmark --inference_benchmark_batch_sizes 1,64,4096
"""

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from data.batching.multi_hot import MultiHotExpander
from data.synthetic.random_data import RandomCriteoLoader

PERCENTILES = (50, 90, 99)

# What a failure during the benchmark reports (``Trainer.position``), and the ``stage`` of
# every record the benchmark writes to the run's log.
STAGE = "inference_benchmark"


@dataclass
class InferenceBenchmarkResult:
    """Timing of one batch size.

    Attributes:
        batch_size: rows per rank per forward.
        global_batch_size: rows per forward over all ranks.
        iterations: timed forwards.
        records_per_sec: global rows per second of timed forward.
        latency_p50_ms, latency_p90_ms, latency_p99_ms: per-forward wall time.
    """

    batch_size: int
    global_batch_size: int
    iterations: int
    records_per_sec: float
    latency_p50_ms: float
    latency_p90_ms: float
    latency_p99_ms: float


def time_calls(call: Callable[[], object], warmup: int, iterations: int) -> list[float]:
    """Seconds of each of ``iterations`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    seconds = []
    for _ in range(iterations):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return seconds


def summarize(batch_size: int, world_size: int, seconds: list[float]) -> InferenceBenchmarkResult:
    """Throughput and latency percentiles of one batch size's timed forwards."""
    p50, p90, p99 = np.percentile(np.asarray(seconds) * 1e3, PERCENTILES)
    global_batch = batch_size * world_size
    return InferenceBenchmarkResult(
        batch_size=batch_size,
        global_batch_size=global_batch,
        iterations=len(seconds),
        records_per_sec=global_batch * len(seconds) / sum(seconds),
        latency_p50_ms=float(p50),
        latency_p90_ms=float(p90),
        latency_p99_ms=float(p99),
    )


def format_table(results: list[InferenceBenchmarkResult]) -> str:
    """One row per batch size, aligned columns."""
    header = f"{'batch/rank':>10} {'global':>8} {'records/s':>13} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9}"
    rows = [
        f"{r.batch_size:>10} {r.global_batch_size:>8} {r.records_per_sec:>13,.0f} "
        f"{r.latency_p50_ms:>9.3f} {r.latency_p90_ms:>9.3f} {r.latency_p99_ms:>9.3f}"
        for r in results
    ]
    return "\n".join([header, *rows])


def run_inference_benchmark(trainer) -> list[InferenceBenchmarkResult]:
    """Times the trainer's model on random batches of every configured size. Collective:
    every rank runs the same forwards; rank 0's timings are reported."""
    config, env = trainer.config, trainer.env
    bench = config.inference_benchmark
    sizes = config.model.num_embeddings_per_feature
    expand = None
    if config.data.multi_hot_sizes is not None:
        expand = MultiHotExpander(
            config.data.multi_hot_sizes, sizes, config.data.multi_hot_distribution_type or "uniform", config.seed
        )
    trainer.model.eval()
    results = []
    for batch_size in bench.batch_sizes:
        loader = RandomCriteoLoader(
            1,
            batch_size,
            env.rank,
            env.world_size,
            sizes,
            config.model.sparse_feature_names,
            config.model.dense_in_features,
            seed=config.seed,
            stream=3,
            expand=expand,
        )
        batch = next(iter(loader)).to(env.device)

        def forward(batch: Any = batch) -> None:
            with torch.no_grad():
                trainer.model(batch)
            if env.device.type == "cuda":
                torch.cuda.synchronize()

        with trainer.in_stage(f"{STAGE}, batch size {batch_size}"):
            if dist.is_initialized() and env.world_size > 1:
                dist.barrier()
            seconds = time_calls(forward, bench.warmup, bench.iterations)
        results.append(summarize(batch_size, env.world_size, seconds))
    trainer.log.print(
        f"inference benchmark (forward only, {bench.warmup} warm-up forwards excluded, "
        f"{bench.iterations} timed, {env.world_size} rank(s), {env.device.type}):\n" + format_table(results)
    )
    trainer.log.record(
        "inference_benchmark",
        stage=STAGE,
        world_size=env.world_size,
        warmup=bench.warmup,
        results=[asdict(r) for r in results],
    )
    return results
