"""What a history costs a training step: a length-L sequence against the pooled bag of the same ids.

Writes a Parquet table whose list column ``hist`` holds exactly ``--length`` ids of the
item column's id space a row, and trains on it twice through the real entry point, on
``--nproc`` gloo ranks, reading the same rows:

- ``sequence``: ``--sequence_columns hist:item --max_history L``, the history looked up
  unpooled in the item's table and pooled by ``--sequence_interaction`` (target
  attention given the candidate);
- ``pooled``: ``hist`` as one more categorical feature, a multi-hot bag of the same ids
  sum-pooled by FBGEMM in a table of its own (what a Parquet list column was before
  histories).

It prints each run's step time (the run log's training intervals, the first dropped as
warm-up) and their ratio; the goal is a ratio of at most 2 (issue 41). Both runs read the
same columns, so the feed's share of the step is alike; the difference is the unpooled
lookup, its all-to-all and the attention. ``--rounds N`` runs the pair N times, one
after the other, and reports the median of the N ratios: on a shared machine each
ratio compares two runs minutes apart, not the two medians of an hour.

    python bench/sequence_speed.py [--length 50] [--steps 60] [--nproc 2] [--batch_size 512]
        [--sequence_interaction din|transformer] [--rounds 1]
"""

import collections
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from torch.autograd.profiler import record_function

import dlrm_main
from common.cli import OneLineParser, positive_int
from common.config_flags import flag, parse_flags
from harness.launch import launch, read_log

GOAL = 2.0  # sequence step time / pooled step time at most
DIM, ROWS = 64, 100_000
BOTTOM, TOP = "512,256,64", "512,512,256,1"


@dataclass
class SequenceSpeedFlags:
    """The flags of ``python bench/sequence_speed.py``: what it measures and how."""

    length: int = flag(50, help="ids in every row's history (and in the pooled bag)")
    steps: int = flag(60, help="training steps of each run (the first interval is warm-up)")
    nproc: int = flag(2, help="ranks")
    batch_size: int = flag(512, help="rows per rank")
    sequence_interaction: str = flag("din", choices=("din", "transformer"), help="how the history is pooled")
    rounds: int = flag(
        1, parse=positive_int, help="pairs of runs (sequence, then pooled); the ratio reported is their median"
    )
    phases: int = flag(
        0,
        help="instead of timing, profile this many steps of each run (after a third of --steps) with "
        "torch.profiler and print where a step's time goes, per phase and rank",
    )


def write_table(path: str, rows: int, length: int, seed: int = 0) -> None:
    """``rows`` rows: label, I1, user, item, and hist (``length`` item ids each)."""
    rng = np.random.default_rng(seed)
    items = rng.integers(0, 10 * ROWS, rows)
    history = rng.integers(0, 10 * ROWS, rows * length)
    offsets = np.arange(0, rows * length + 1, length, dtype=np.int32)
    table = pa.table(
        {
            "label": pa.array(rng.integers(0, 2, rows), pa.int8()),
            "I1": pa.array(rng.exponential(3, rows)),
            "user": pa.array(rng.integers(0, 10 * ROWS, rows)),
            "item": pa.array(items),
            "hist": pa.ListArray.from_arrays(pa.array(offsets), pa.array(history)),
        }
    )
    pq.write_table(table, path, row_group_size=16_384)


def step_seconds(log: str) -> float:
    """Mean seconds a training step, past the first logged interval."""
    train = [r for r in read_log(log) if r["event"] == "train"][1:]
    return sum(r["seconds"] for r in train) / sum(len(r["step_losses"]) for r in train)


def run_flags(args: SequenceSpeedFlags, data: str) -> dict[str, list[str]]:
    """The two runs' entry-point flags over the table ``data``: {"sequence": ..., "pooled": ...}."""
    common = [
        "--parquet_path",
        data,
        "--dense_columns",
        "I1",
        "--test_window",
        "0.05",
        "--validation_window",
        "0.05",
        "--num_embeddings",
        str(ROWS),
        "--embedding_dim",
        str(DIM),
        "--dense_arch_layer_sizes",
        BOTTOM,
        "--over_arch_layer_sizes",
        TOP,
        "--batch_size",
        str(args.batch_size),
        "--limit_train_batches",
        str(args.steps),
        "--limit_val_batches",
        "0",
        "--limit_test_batches",
        "0",
        "--learning_rate",
        "0.05",
        "--log_every_n_steps",
        str(max(1, args.steps // 6)),
    ]
    runs = {
        "sequence": [
            "--sparse_columns",
            "user,item",
            "--sequence_columns",
            "hist:item",
            "--max_history",
            str(args.length),
            "--sequence_interaction",
            args.sequence_interaction,
        ],
        "pooled": ["--sparse_columns", "user,item,hist"],
    }
    return {name: [*common, *flags] for name, flags in runs.items()}


# Where a step's time goes (--phases). Each op's own (self) CPU time on the training
# thread goes to one phase: by its name (communication, FBGEMM's lookups), else by the
# region it runs in: the model's parts, marked while profiling, and torchrec's pipeline
# stages. A backward op goes to the part whose forward made its autograd node (the
# node's sequence number). Gloo runs the collectives on threads of its own: the
# training thread's share of them is its wait.
PARTS = {
    "dense_arch": "dense arch",
    "inter_arch": "interaction",
    "over_arch": "over arch",
    "sequence_pooling": "attention",
}
PHASES = [
    "input dist",
    "embedding all-to-all (+wait)",
    "dense allreduce (+wait)",
    "lookup fwd",
    "lookup bwd + fused update",
    "padding fwd",
    "padding bwd",
    "candidate sum fwd",
    "candidate sum bwd",
    "attention fwd",
    "attention bwd",
    "dense arch fwd",
    "dense arch bwd",
    "interaction fwd",
    "interaction bwd",
    "over arch fwd",
    "over arch bwd",
    "dense optimizer",
    "feed",
    "other fwd",
    "other bwd",
    "other",
]
_COLLECTIVE = ("alltoall", "all_to_all", "all2all", "c10d::", "gloo", "wait", "allgather", "all_gather")


def _phase(event: Any, forward_part: dict[int, str]) -> str:
    name = event.name.lower()
    regions = []
    parent = event
    while parent is not None:
        regions.append(parent.name)
        parent = parent.cpu_parent
    if "allreduce" in name or "all_reduce" in name:
        return "dense allreduce (+wait)"
    if any(c in name for c in _COLLECTIVE) and not name.startswith(("autograd::engine", "## ")):
        in_input_dist = any("sparse_data_dist" in r for r in regions)
        return "input dist" if in_input_dist else "embedding all-to-all (+wait)"
    node = next((e for e in _ancestors(event) if e.name.startswith("autograd::engine::evaluate_function")), None)
    if node is not None:
        if "Lookup" in node.name or ("fbgemm::" in name and "embedding" in name):
            return "lookup bwd + fused update"
        part = forward_part.get(node.sequence_nr)
        return f"{part} bwd" if part else "other bwd"
    if "fbgemm::" in name and ("embedding" in name or "lookup" in name):
        return "lookup fwd"
    for region in regions:
        if region in PARTS.values() or region in ("padding", "candidate sum"):
            return f"{region} fwd"
        if region.startswith("## optimizer"):
            return "dense optimizer"
        if "sparse_data_dist" in region:
            return "input dist"
        if region.startswith(("## wait_for_batch", "## next_batch", "## load_batch")):
            return "feed"
        if region.startswith("## forward"):
            return "other fwd"
    return "other"


def _ancestors(event: Any) -> Iterator[Any]:
    while event is not None:
        yield event
        event = event.cpu_parent


def _forward_parts(events: list[Any]) -> dict[int, str]:
    """{autograd sequence number: the model part whose forward op made it}."""
    parts: dict[int, str] = {}
    for event in events:
        if event.sequence_nr is None or event.sequence_nr < 0:
            continue
        for region in _ancestors(event):
            if region.name in PARTS.values() or region.name in ("padding", "candidate sum"):
                parts.setdefault(event.sequence_nr, region.name)
                break
    return parts


def _mark(module: Any, label: str) -> None:
    """A profiler region ``label`` around each forward of ``module``."""
    open_regions: list[Any] = []
    module.register_forward_pre_hook(lambda *_: open_regions.append(record_function(label).__enter__()))
    module.register_forward_hook(lambda *_: open_regions.pop().__exit__(None, None, None))


def profiled_main(argv: list[str]) -> int:
    """``dlrm_main.main(ARGV)`` for ``argv`` = [OUT, FIRST, STEPS, *ARGV], with steps
    FIRST to FIRST + STEPS of the train pipeline profiled; writes {"step_ms",
    "phases_ms"} (ms a step) to OUT_RANK.json."""
    out, first, steps = argv[0], int(argv[1]), int(argv[2])
    argv = argv[3:]
    import torch
    from torchrec.distributed.train_pipeline.train_pipelines import TrainPipelineSparseDist

    from models import sequence_arch

    def marked(function: Any, label: str) -> Any:
        def inner(*args: Any) -> Any:
            with record_function(label):
                return function(*args)

        return inner

    # The arch calls them through the module: the model is built (and traced) after this.
    sequence_arch.padded_history = marked(sequence_arch.padded_history, "padding")
    sequence_arch.sum_pooled = marked(sequence_arch.sum_pooled, "candidate sum")
    progress = TrainPipelineSparseDist.progress
    state: dict[str, Any] = {"step": 0}

    def profiled_progress(pipeline: Any, batches: Any) -> Any:
        if state["step"] == 0:
            for name, module in pipeline._model.named_modules():
                path: list[str] = ["", *name.split(".")]
                owner, last = path[-2], path[-1]
                label = PARTS.get(last) or (PARTS["sequence_pooling"] if owner == "sequence_pooling" else None)
                if label:
                    _mark(module, label)
        if state["step"] == first:
            state["profile"] = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            state["profile"].__enter__()
            state["start"] = time.perf_counter()
        result = progress(pipeline, batches)
        state["step"] += 1
        if state["step"] == first + steps:
            seconds = time.perf_counter() - state["start"]
            profile = state.pop("profile")
            profile.__exit__(None, None, None)
            events = list(profile.events())
            thread = collections.Counter(e.thread for e in events if e.name.startswith("## forward")).most_common(1)
            events = [e for e in events if e.thread == thread[0][0]]
            parts = _forward_parts(events)
            phases: collections.Counter = collections.Counter()
            ops: collections.Counter = collections.Counter()
            for event in events:
                phase = _phase(event, parts)
                phases[phase] += event.self_cpu_time_total / 1000 / steps
                ops[f"{phase}: {event.name}"] += event.self_cpu_time_total / 1000 / steps
            with open(f"{out}_{os.environ.get('RANK', '0')}.json", "w") as f:
                json.dump({"step_ms": 1000 * seconds / steps, "phases_ms": dict(phases), "ops_ms": dict(ops)}, f)
        return result

    TrainPipelineSparseDist.progress = profiled_progress
    return dlrm_main.main(argv)


def print_phases(args: SequenceSpeedFlags, runs: dict[str, list[str]], tmp: str) -> None:
    """Profiles one run of each model and prints its phases' ms a step, per rank."""
    first = max(1, args.steps // 3)
    steps = min(args.phases, args.steps - first)
    columns: dict[str, dict[str, Any]] = {}
    for name, flags in runs.items():
        out = os.path.join(tmp, f"{name}_phases")
        log = os.path.join(tmp, f"{name}_phases.jsonl")
        launch(profiled_main, [out, str(first), str(steps), *flags, "--log_path", log], nproc=args.nproc)
        for rank in range(args.nproc):
            with open(f"{out}_{rank}.json") as f:
                columns[f"{name} r{rank}"] = json.load(f)
    print(f"ms a step by phase ({steps} steps profiled after {first}; self CPU time of the training thread)")
    print("| phase | " + " | ".join(columns) + " |")
    print("| --- |" + " ---: |" * len(columns))
    for phase in PHASES:
        values = [c["phases_ms"].get(phase, 0.0) for c in columns.values()]
        if any(v >= 0.05 for v in values):
            print(f"| {phase} | " + " | ".join(f"{v:.1f}" for v in values) + " |")
    print("| sum of phases | " + " | ".join(f"{sum(c['phases_ms'].values()):.1f}" for c in columns.values()) + " |")
    print("| step (wall) | " + " | ".join(f"{c['step_ms']:.1f}" for c in columns.values()) + " |")
    print(json.dumps({"phases": {name: c["phases_ms"] for name, c in columns.items()}}))
    for name, column in columns.items():
        top = sorted(column["ops_ms"].items(), key=lambda item: -item[1])[:12]
        print(f"{name}, the largest ops (ms a step): " + "; ".join(f"{op} {ms:.1f}" for op, ms in top))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), SequenceSpeedFlags, argv)
    global_batch = args.batch_size * args.nproc
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "clicks.parquet")
        # The training split (the first 90% of the rows) holds every step.
        write_table(data, int(global_batch * (args.steps + 1) / 0.9) + global_batch, args.length)
        runs = run_flags(args, data)
        if args.phases:
            print_phases(args, runs, tmp)
            return 0
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        for round_ in range(args.rounds):
            for name, flags in runs.items():
                log = os.path.join(tmp, f"{name}{round_}.jsonl")
                launch(dlrm_main.main, [*flags, "--log_path", log], nproc=args.nproc)
                seconds[name].append(step_seconds(log))
            ratio = seconds["sequence"][-1] / seconds["pooled"][-1]
            print(f"round {round_ + 1}/{args.rounds}: ratio {ratio:.2f}", flush=True)
    ratios = [a / b for a, b in zip(seconds["sequence"], seconds["pooled"])]
    ratio = statistics.median(ratios)
    sequence_s, pooled_s = statistics.median(seconds["sequence"]), statistics.median(seconds["pooled"])
    result = {
        "length": args.length,
        "sequence_interaction": args.sequence_interaction,
        "ranks": args.nproc,
        "batch_size_per_rank": args.batch_size,
        "rounds": args.rounds,
        "sequence_step_ms": round(1000 * sequence_s, 2),
        "pooled_step_ms": round(1000 * pooled_s, 2),
        "ratio": round(ratio, 3),
        "round_ratios": [round(r, 3) for r in ratios],
        "within_goal": ratio <= GOAL,
    }
    print(
        f"a history of {args.length} ids ({args.sequence_interaction}): {1000 * sequence_s:.1f} ms a step; "
        f"the pooled bag of the same ids: {1000 * pooled_s:.1f} ms; ratio {ratio:.2f} "
        f"(goal <= {GOAL:g}) on {args.nproc} rank(s) of {args.batch_size} rows; median of {args.rounds} round(s)"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
