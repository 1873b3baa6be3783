"""Training speed against the public TorchRec DLRM example, measured side by side in one run.

Runs this repository's `dlrm_main.py` and the public example's (a checkout of the
``torchrec_dlrm`` folder of github.com/facebookresearch/dlrm, given with ``--peer``;
nothing is fetched) with the same Python, the same flags and the same launcher: the
default architecture (dim 64, bottom 512-256-64, top 512-512-256-1), 26 x 100k
tables, 1024 rows per rank, 2 gloo ranks under torchrun, random data. A rate is the
records of the extra steps over the extra seconds of a long run against a short one
(130 and 30 steps), so start-up, sharding, compilation and the one-batch evaluations
cancel out. Each ``--ours_flags`` adds a variant of ours (a lever against ours as it
is, both against the peer); each round starts one program later than the last; the
figures are the ratios of the medians. The fp32 and bf16 matmul peaks of the machine
(all its cores, best of before and after) and the load average beside each run are
measured in the same run.

    python bench/peer_throughput.py --peer /path/to/dlrm/torchrec_dlrm [--rounds 3]
        [--short_steps 30 --long_steps 130] [--nproc 2] [--batch_size 1024] [--ours_flags=--compile ...]
"""

import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from bench.train_throughput import BOTTOM, DIM, ROWS, TOP, flops_per_record, matmul_peak_gflops
from common.cli import OneLineParser, cli_main, positive_int
from common.config_flags import flag, parse_flags
from common.errors import BadInput
from training.distributed import usable_cores

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROG = "python bench/peer_throughput.py"
# What marks a checkout of the public example's folder: its entry point and the loader it imports.
PEER_FILES = ("dlrm_main.py", os.path.join("data", "dlrm_dataloader.py"))


@dataclass(frozen=True)
class TimedRun:
    """One training process tree: its step count, wall seconds and the 1-minute load
    average before and after it."""

    steps: int
    seconds: float
    load_before: float
    load_after: float


def records_per_sec(short: TimedRun, long: TimedRun, records_per_step: int) -> float:
    """The records of the steps the long run has beyond the short one, over the seconds
    it took beyond the short one's (everything before and after the steps cancels out).

    Example::

        records_per_sec(TimedRun(30, 20.0, 0, 0), TimedRun(130, 30.0, 0, 0), 2048)  # 20480.0
    """
    extra_steps, extra_seconds = long.steps - short.steps, long.seconds - short.seconds
    if extra_steps <= 0:
        raise ValueError(f"the long run ({long.steps} steps) must have more steps than the short one ({short.steps})")
    if extra_seconds <= 0:
        raise RuntimeError(
            f"the {long.steps}-step run took {long.seconds:.1f} s, no longer than the "
            f"{short.steps}-step run's {short.seconds:.1f} s: the machine's load swamped the "
            "difference (use more steps)"
        )
    return extra_steps * records_per_step / extra_seconds


def median_ratio(ours: Sequence[float], peer: Sequence[float]) -> float:
    """median(ours) / median(peer): above 1, ours trains faster."""
    return statistics.median(ours) / statistics.median(peer)


def check_peer(path: str) -> str:
    """The absolute path of a checkout of the public example's ``torchrec_dlrm`` folder;
    BadInput naming what is missing otherwise."""
    missing = [name for name in PEER_FILES if not os.path.isfile(os.path.join(path, name))]
    if missing:
        raise BadInput(
            f"--peer {path}: not a checkout of the public example's torchrec_dlrm folder "
            f"(no {' or '.join(missing)}); export it with "
            "`git archive HEAD torchrec_dlrm | tar -x` from github.com/facebookresearch/dlrm"
        )
    return os.path.abspath(path)


def common_flags(steps: int, batch_size: int) -> list[str]:
    """The flags both programs get: the public example's defaults spelled out, random data,
    one batch of validation and of test (both run lengths pay them alike)."""
    return [
        "--num_embeddings",
        str(ROWS),
        "--embedding_dim",
        str(DIM),
        "--dense_arch_layer_sizes",
        ",".join(map(str, BOTTOM)),
        "--over_arch_layer_sizes",
        ",".join(map(str, TOP)),
        "--batch_size",
        str(batch_size),
        "--learning_rate",
        "0.1",
        "--seed",
        "0",
        "--limit_train_batches",
        str(steps),
        "--limit_val_batches",
        "1",
        "--limit_test_batches",
        "1",
    ]


def run_training(
    entry_point: str, flags: list[str], steps: int, nproc: int, env: dict[str, str], cwd: str, output_path: str
) -> TimedRun:
    """Runs ``entry_point`` under torchrun and times the whole process tree."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        entry_point,
        *flags,
    ]
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    with open(output_path, "w") as output:
        returncode = subprocess.call(command, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if returncode != 0:
        with open(output_path) as output:
            tail = output.read()[-3000:]
        raise RuntimeError(f"{shlex.join(command)} exited with {returncode}:\n{tail}")
    return TimedRun(steps, seconds, load_before, os.getloadavg()[0])


def program_name(ours_flags: str) -> str:
    """How the figures name a variant of ours: "ours", or "ours --compile"."""
    return f"ours {ours_flags}".strip()


def measure(
    peer: str,
    rounds: int,
    short_steps: int,
    long_steps: int,
    nproc: int,
    batch_size: int,
    ours_variants: list[str],
    work_dir: str,
) -> dict[str, Any]:
    """Rounds of the peer and every variant of ours, each round starting one program
    later than the last; returns {"rates": {program: [records/s per round]}, "runs": [...]}."""
    # Ours finds its packages through the path; the peer's `data` package would be
    # shadowed by ours, so it runs from its folder without our path.
    ours_env = {**os.environ, "PYTHONPATH": REPO}
    peer_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    programs = {
        program_name(flags): (os.path.join(REPO, "dlrm_main.py"), shlex.split(flags), ours_env, REPO)
        for flags in ours_variants
    }
    programs["peer"] = (os.path.join(peer, "dlrm_main.py"), [], peer_env, peer)
    names = list(programs)
    rates: dict[str, list[float]] = {name: [] for name in names}
    runs: list[dict[str, object]] = []
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            entry_point, extra, env, cwd = programs[name]
            timed = [
                run_training(
                    entry_point,
                    common_flags(steps, batch_size) + extra,
                    steps,
                    nproc,
                    env,
                    cwd,
                    os.path.join(work_dir, f"{len(runs)}_{steps}.log"),
                )
                for steps in (short_steps, long_steps)
            ]
            short, long = timed
            rate = records_per_sec(short, long, records_per_step=batch_size * nproc)
            rates[name].append(rate)
            runs.append(
                {
                    "round": round_index,
                    "program": name,
                    "records_per_sec": round(rate),
                    "seconds": [round(t.seconds, 2) for t in timed],
                    "loadavg_1min": [round(v, 2) for t in timed for v in (t.load_before, t.load_after)],
                }
            )
            print(
                f"round {round_index} {name}: {rate:,.0f} records/s "
                f"({short_steps} steps {timed[0].seconds:.1f} s, {long_steps} steps {timed[1].seconds:.1f} s, "
                f"load {timed[0].load_before:.2f}-{timed[1].load_after:.2f})",
                flush=True,
            )
    return {"rates": rates, "runs": runs}


@dataclass
class PeerThroughputFlags:
    """The flags of ``python bench/peer_throughput.py``: what it measures and how."""

    peer: str = flag(help="a checkout of the public example's torchrec_dlrm folder")
    rounds: int = flag(3, parse=positive_int, help="alternating rounds of both programs")
    short_steps: int = flag(30, parse=positive_int, help="training steps of the short run")
    long_steps: int = flag(
        130, parse=positive_int, help="training steps of the long run (a smoke run: --short_steps 2 --long_steps 4)"
    )
    nproc: int = flag(2, parse=positive_int, help="ranks (torchrun --nproc_per_node)")
    batch_size: int = flag(1024, parse=positive_int, help="rows per rank")
    ours_flags: list[str] = flag(
        [],
        help="a variant of this repository's run with these flags added (write "
        '--ours_flags="--compile ...": the value starts with a dash); repeat to '
        "alternate several variants with the peer (default: ours as it is)",
    )


@cli_main(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0]), PeerThroughputFlags, argv)
    if args.long_steps <= args.short_steps:
        raise BadInput(
            f"--long_steps ({args.long_steps}) must be above --short_steps ({args.short_steps}): "
            "the rate is taken from the steps in between"
        )
    peer = check_peer(args.peer)
    threads = usable_cores()
    peaks_before = {dtype: matmul_peak_gflops(threads, dtype=dtype) for dtype in (torch.float32, torch.bfloat16)}
    with tempfile.TemporaryDirectory() as work_dir:
        figures = measure(
            peer,
            args.rounds,
            args.short_steps,
            args.long_steps,
            args.nproc,
            args.batch_size,
            args.ours_flags or [""],
            work_dir,
        )
    peaks = {dtype: max(before, matmul_peak_gflops(threads, dtype=dtype)) for dtype, before in peaks_before.items()}
    rates = figures["rates"]
    medians = {name: statistics.median(values) for name, values in rates.items()}
    ratios = {name: median_ratio(values, rates["peer"]) for name, values in rates.items() if name != "peer"}
    flops = flops_per_record()
    fractions = {
        name: {str(dtype).removeprefix("torch."): round(rate * flops / 1e9 / peak, 3) for dtype, peak in peaks.items()}
        for name, rate in medians.items()
    }
    for name, rate in medians.items():
        print(
            f"{name}: median {rate:,.0f} records/s, {rate * flops / 1e9:.1f} GFLOP/s = "
            f"{100 * fractions[name]['float32']:.1f}% of the fp32 matmul peak ({peaks[torch.float32]:.0f} GFLOP/s), "
            f"{100 * fractions[name]['bfloat16']:.1f}% of the bf16 peak ({peaks[torch.bfloat16]:.0f} GFLOP/s)"
        )
    for name, ratio in ratios.items():
        print(f"{name} / peer (medians): {ratio:.2f}x")
    print(
        json.dumps(
            {
                "ratio_of_medians": {name: round(ratio, 3) for name, ratio in ratios.items()},
                "median_records_per_sec": {name: round(rate) for name, rate in medians.items()},
                "fraction_of_matmul_peak": fractions,
                "matmul_peak_gflops": {str(d).removeprefix("torch."): round(p, 1) for d, p in peaks.items()},
                "threads_for_peak": threads,
                "mflop_per_record": round(flops / 1e6, 3),
                "ranks": args.nproc,
                "batch_size_per_rank": args.batch_size,
                "steps": [args.short_steps, args.long_steps],
                "runs": figures["runs"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
