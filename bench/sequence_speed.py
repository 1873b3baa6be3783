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

import json
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

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


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), SequenceSpeedFlags, argv)
    global_batch = args.batch_size * args.nproc
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "clicks.parquet")
        # The training split (the first 90% of the rows) holds every step.
        write_table(data, int(global_batch * (args.steps + 1) / 0.9) + global_batch, args.length)
        runs = run_flags(args, data)
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
