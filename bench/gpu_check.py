"""Verifies a GPU host in one command: the correctness matrix on the CUDA choices.

    python -m bench.gpu_check [--strength 2] [--only TEXT] [--list] [--gpus N] [--device cpu]
        [--output FILE] [--job_timeout 300]

Cases cover every pair (``--strength 3``: every triple) of the choices in
`gpu_matrix`: pipeline, compute kernel, sharding type (data-parallel and a mixed
plan included), fused and MLP optimizers, fp16 tables, multi-hot bags, interaction,
bf16 autocast, TF32, one or two epochs, validation inside the epoch, the data source,
a history feature (none, din or transformer: its item table in a sharded
EmbeddingCollection), and world sizes 1, 2 and every GPU of the host, over NCCL. Each case is checked against

- a CPU reference (`cpu_reference`: gloo, one rank, table_wise, fused kernel, the
  sparse_dist pipeline, no TF32), which no fault shared by every GPU run can pass;
- the sparse_dist pipeline on the fused kernel at the case's own placement (the
  pipelines and UVM kernels, to GPU precision); semi_sync cases, which start their
  semi-synchronous phase at batch 1 and so have no synchronous reference, against a
  semi_sync run of another placement (`placement_reference`);

to the tolerance `reference_tolerance` gives and explains; and, as in
`harness/matrix/`, resume bit-exact and the exported fp32 program equal to the
eager model (with TF32 off). Combinations the application refuses must be refused on
every rank with one ``error:`` line from rank 0. With more than one GPU it prints which
network NCCL uses. Built for a short lease: the GPU's jobs run first and the CPU
references after them; each verdict is printed, and with ``--output FILE`` appended as
one JSON line, as soon as it is made, so a run cut off keeps what it checked; every
job stops at ``--job_timeout`` seconds. Then one table with pass/fail and records/s
per case; exit 1 when a case fails, 2 (one line) when ``--only`` selects nothing.

``--list`` prints the cases, their references and tolerances without running them (no
CUDA needed; ``--gpus`` sets the GPUs to plan for). ``--device cpu`` runs the cases
the CPU can (sparse_dist and base pipelines, fused kernel, no TF32) on gloo, to
exercise the check itself. On a host without CUDA, a plain run says so and exits 0.
"""

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from common.cli import OneLineParser, cli_main
from common.config_flags import add_flags, config_values, flag
from harness import matrix
from harness.matrix import MIXED, Case, CaseResult, Launcher, MatrixSpec, Refusal
from models.config import EMBEDDING_PRECISIONS, INTERACTION_TYPES
from sharding_plans.constraints import CUDA_ONLY_KERNELS, SHARDING_TYPES
from training.config import DENSE_OPTIMIZERS, OPTIMIZERS, PIPELINES
from training.pipelines import CUDA_ONLY_PIPELINES

SEMI_SYNC_START_BATCH = 1  # semi_sync cases run their semi-synchronous phase from the second batch

# Refused on CUDA after planning (training/pipelines.py `check_plan_for_pipeline`):
# the plan's kernels are only known then, so these run with the process group up.
GPU_REFUSALS: tuple[Refusal, ...] = (
    *matrix.REFUSALS,
    Refusal(
        (("pipeline", "semi_sync"), ("compute_kernel", "fused_uvm_caching")), "--pipeline semi_sync", devices=("cuda",)
    ),
    Refusal((("pipeline", "semi_sync"), ("sharding", "data_parallel")), "--pipeline semi_sync", devices=("cuda",)),
    Refusal((("pipeline", "semi_sync"), ("sharding", MIXED)), "--pipeline semi_sync", devices=("cuda",)),
    Refusal(
        (("pipeline", "prefetch"), ("validation_within_epoch", True), ("compute_kernel", "fused_uvm_caching")),
        "--pipeline prefetch with --validation_freq_within_epoch",
        devices=("cuda",),
    ),
)

# TF32 rounds a matmul's inputs to 10 bits of mantissa (2^-11 relative), bf16 to 8
# (2^-9): a quarter of the bf16 autocast tolerance of `matrix.sharded_tolerance`.
TF32_TOLERANCE = 2.5e-3
# FBGEMM rounds fp16 table updates stochastically on CUDA (its default): each update
# may end one fp16 step above or below the reference's, a step that grows with the
# weight (2^-10 of its power of two). FP16_STEP is the step at the tables' largest
# initial weight (1/sqrt(40 rows) = 0.16), for losses and dense weights; the tables of
# an fp16 case also get the step at each weight's own magnitude (`fp16_step`).
FP16_STEP = 2.0**-13


def world_sizes(num_gpus: int) -> tuple[int, ...]:
    """1, 2 and every GPU of the host; a count that does not divide the global batch and
    the probe rows evenly is lowered to the largest that does."""
    largest = max(
        n for n in range(1, max(num_gpus, 1) + 1) if matrix.GLOBAL_BATCH % n == 0 and matrix.PROBE_ROWS % n == 0
    )
    return tuple(sorted({1, min(2, largest), largest}))


def gpu_matrix(num_gpus: int, device: str = "cuda") -> MatrixSpec:
    """The GPU check's dimensions on ``num_gpus`` GPUs (``device`` cpu: the choices
    the CPU runs, on 1 and 2 gloo ranks)."""
    cuda = device == "cuda"
    return MatrixSpec(
        dimensions={
            "pipeline": PIPELINES if cuda else tuple(p for p in PIPELINES if p not in CUDA_ONLY_PIPELINES),
            "compute_kernel": ("fused",) + (CUDA_ONLY_KERNELS if cuda else ()),
            "sharding": SHARDING_TYPES + (MIXED,),
            "optimizer": OPTIMIZERS,
            "dense_optimizer": DENSE_OPTIMIZERS,
            "precision": EMBEDDING_PRECISIONS,
            "interaction": INTERACTION_TYPES,
            "multi_hot": (False, True),
            "amp": (False, True),
            "allow_tf32": (False, True) if cuda else (False,),
            "epochs": (1, 2),
            "validation_within_epoch": (False, True),
            # zch is trained on CPU/gloo only (docs/zch.md): the CPU matrix has its cases.
            "data_source": tuple(d for d in matrix.DIMENSIONS["data_source"] if d != matrix.PARQUET_ZCH),
            "sequence": matrix.DIMENSIONS["sequence"],
            "world_size": world_sizes(num_gpus) if cuda else (1, 2),
        },
        reference={"pipeline": "sparse_dist", "compute_kernel": "fused"},
        refusals=GPU_REFUSALS,
        device=device,
    )


# ------------------------------------------------------------------ references of a case


def refusal_cases(spec: MatrixSpec) -> list[Case]:
    """`matrix.refusal_cases` over table_wise tables: the compute kernel applies to them
    (data-parallel tables always take the dense kernel), so each case is refused for
    its own combination."""
    return matrix.refusal_cases(spec, base={"sharding": "table_wise"})


def cpu_reference(case: Case) -> Case | None:
    """The case on one CPU rank: whole tables on the fused kernel, the sparse_dist
    pipeline, fp32 matmuls; the same optimizers, precision, model, epochs and
    validation. None for semi_sync: no synchronous run reproduces its stale lookups."""
    if case["pipeline"] == "semi_sync":
        return None
    reference = {
        **case,
        "pipeline": "sparse_dist",
        "compute_kernel": "fused",
        "sharding": "table_wise",
        "world_size": 1,
        "allow_tf32": False,
    }
    return matrix.with_epoch_shares(reference, case)


# Placements a semi_sync case is compared with: the first that is not its own (nor refused).
SEMI_SYNC_PLACEMENTS = (
    {"sharding": "table_wise", "world_size": 1, "compute_kernel": "fused"},
    {"sharding": "row_wise", "world_size": 2, "compute_kernel": "fused_uvm"},
    {"sharding": "row_wise", "world_size": 1, "compute_kernel": "fused_uvm"},
)


def placement_reference(case: Case, spec: MatrixSpec) -> Case | None:
    """The GPU run a case is compared with on its own device: the sparse_dist pipeline
    on the fused kernel at the case's placement, or for semi_sync a semi_sync run of
    another placement (on the world sizes the host has). None when the case is its
    own reference."""
    if case["pipeline"] == "semi_sync":
        # The first other placement that is not refused (a history validated inside the
        # epoch is refused on several ranks: the last placement keeps one rank).
        for placement in (p for p in SEMI_SYNC_PLACEMENTS if any(case[d] != v for d, v in p.items())):
            world_size = min(placement["world_size"], max(spec.dimensions["world_size"]))
            reference = matrix.with_epoch_shares({**case, **placement, "world_size": world_size}, case)
            if spec.refusal_for(reference) is None:
                return reference
        return None
    reference = spec.reference_of(case)
    # A Parquet case's reference names its shares; at the case's own world size they are the case's.
    if reference in (case, matrix.with_epoch_shares(case, case)):
        return None
    # A base-pipeline history case validating inside the epoch on several ranks: sparse_dist is refused there.
    return None if spec.refusal_for(reference) else reference


def reference_tolerance(case: Case) -> tuple[float, str]:
    """(absolute tolerance on losses and weights, why) of a GPU case against its
    references: `matrix.sharded_tolerance` on CUDA, or TF32's or fp16's where larger."""
    candidates = [matrix.sharded_tolerance(case, "cuda")]
    if case.get("allow_tf32"):
        candidates.append(
            (
                TF32_TOLERANCE,
                "TF32 matmuls round their inputs to 10 bits of mantissa; the CPU "
                "reference does not, another placement rounds slightly different inputs",
            )
        )
    if case["precision"] == "fp16":
        steps = matrix.STEPS
        candidates.append(
            (
                steps * FP16_STEP,
                f"FBGEMM's CUDA kernels round fp16 updates stochastically: each "
                f"of {steps} updates may leave a weight one fp16 step ({FP16_STEP:g} at the initial "
                f"weights) from the reference",
            )
        )
    return max(candidates)


def fp16_step(weights: torch.Tensor) -> torch.Tensor:
    """The fp16 step at each weight's magnitude: 2^-10 of its power of two (the
    subnormal step below 2^-14)."""
    return torch.exp2(torch.floor(torch.log2(weights.abs().clamp(min=2.0**-14))) - 10)


def _fp16_table_difference(
    runs: Sequence[dict[str, Any]], reference: Sequence[dict[str, Any]], tolerance: float
) -> tuple[float, float, str]:
    """(difference, its allowance, table) at the table weight that uses most of its
    allowance: the case's tolerance, or one fp16 step at the weight's own magnitude per
    update where that is larger."""
    worst = (-1.0, 0.0, 0.0, "")
    for i, rows in enumerate(matrix.TABLE_ROWS):
        table = f"t_cat_{i}"
        a = matrix.assemble_table(runs, table, rows, matrix.EMBEDDING_DIM)
        b = matrix.assemble_table(reference, table, rows, matrix.EMBEDDING_DIM)
        allowed = torch.clamp(matrix.STEPS * fp16_step(torch.maximum(a.abs(), b.abs())), min=tolerance)
        used = (a - b).abs() / allowed
        at = int(used.argmax())
        worst = max(
            worst, (used.flatten()[at].item(), (a - b).abs().flatten()[at].item(), allowed.flatten()[at].item(), table)
        )
    return worst[1], worst[2], worst[3]


def resumable(case: Case) -> str | None:
    """None when check (b) applies; else why not."""
    if case["pipeline"] == "semi_sync":
        return (
            "n/a: a semi_sync checkpoint cannot hold the next batch's embeddings, looked up before "
            "the saved step's update"
        )
    return None


def case_argv(case: Case, data_dir: str, device: str) -> list[str]:
    """`matrix.case_argv`, with semi_sync's semi-synchronous phase from `SEMI_SYNC_START_BATCH`."""
    argv = matrix.case_argv(case, data_dir, device)
    if case["pipeline"] == "semi_sync":
        argv += ["--semi_sync_start_batch", str(SEMI_SYNC_START_BATCH)]
    return argv


# ------------------------------------------------------------------ running and checking


def evaluate(
    spec: MatrixSpec,
    cases: list[Case],
    refusals: list[Case],
    data_dir: str,
    work_dir: str,
    launcher: Launcher,
    on_result: Callable[[CaseResult], None] | None = None,
    job_timeout: float | None = None,
) -> list[CaseResult]:
    """Runs every case, its references and every refusal, then checks them; returns
    the refusals' results, then the cases', in the order given.

    The device's jobs run first (the cases, their placement references and the
    refusals: one launch per world size), then the CPU references (one launch), so a
    short lease spends its GPU time on the GPU. A verdict is made, and handed to
    ``on_result``, as soon as its runs are in: the refusals' and semi_sync's after the
    device's launches, each other case's after the CPU references. Every job stops at
    ``job_timeout`` seconds (recorded as its error) and the next one runs.
    """
    plan = matrix.JobPlan(data_dir, work_dir, case_argv, job_timeout)
    refusal_keys = [plan.add("refusal", c, spec.device) for c in refusals]
    planned = []
    for case in cases:
        cpu, placement = cpu_reference(case), placement_reference(case, spec)
        planned.append(
            (
                case,
                plan.add("train", case, spec.device, resume=resumable(case) is None),
                plan.add("train", cpu, "cpu") if cpu else None,
                plan.add("train", placement, spec.device) if placement else None,
            )
        )
    outcomes = plan.outcomes
    results: dict[int, CaseResult] = {}

    def done(position: int, result: CaseResult) -> None:
        results[position] = result
        if on_result is not None:
            on_result(result)

    plan.launch(launcher, spec.device)  # the device's jobs first (on --device cpu, the same kind as the references)
    with matrix.export_pool() as pool:
        exports = matrix.start_exports(pool, outcomes, [key for _, key, _, _ in planned], work_dir)
        for position, (case, key) in enumerate(zip(refusals, refusal_keys)):
            done(position, matrix.check_refusal(spec, case, outcomes[key]))
        waiting = []
        for position, (case, key, cpu_key, placement_key) in enumerate(planned, start=len(refusals)):
            if cpu_key is None or cpu_key in outcomes:
                done(
                    position,
                    check_case(
                        case, outcomes[key], outcomes.get(cpu_key), outcomes.get(placement_key), exports.get(key)
                    ),
                )
            else:
                waiting.append((position, case, key, cpu_key, placement_key))
        if spec.device != "cpu":
            plan.launch(launcher, "cpu")
        for position, case, key, cpu_key, placement_key in waiting:
            done(
                position,
                check_case(case, outcomes[key], outcomes.get(cpu_key), outcomes.get(placement_key), exports.get(key)),
            )
    return [results[position] for position in sorted(results)]


def _compare(
    result: CaseResult,
    check: str,
    runs: Sequence[dict[str, Any]],
    reference: Sequence[dict[str, Any]],
    tolerance: float,
    why: str,
) -> None:
    """Losses and weights within ``tolerance``; an fp16 case's tables within it or
    within one fp16 step at each weight's own magnitude per update, whichever is larger."""
    fp16 = result.case["precision"] == "fp16"
    diff, where = matrix.max_difference(runs, reference, tables=not fp16)
    verdicts = [(diff, tolerance, f"{diff:.2g} {{}} {tolerance:g}" + (f" ({where})" if diff > 0 else ""))]
    if fp16:
        table_diff, allowed, table = _fp16_table_difference(runs, reference, tolerance)
        verdicts.append(
            (
                table_diff,
                allowed,
                f"tables {table_diff:.2g} {{}} {allowed:g}" + (f" ({table})" if table_diff > 0 else ""),
            )
        )
    text = ", ".join(form.format(">" if found > limit else "<=") for found, limit, form in verdicts)
    if any(found > limit for found, limit, _ in verdicts):
        result.fail(check, f"{text}; tolerance because {why}")
    else:
        result.checks[check] = "ok " + text


def check_case(
    case: Case,
    per_rank: list[dict[str, Any]],
    cpu: list[dict[str, Any]] | None,
    placement: list[dict[str, Any]] | None,
    export: Future | None,
) -> CaseResult:
    """The checks of one case against its runs: the CPU reference, the placement
    reference, resume, export."""
    result = CaseResult(case, seconds=max(o["seconds"] for o in per_rank))
    for name, outcome in (("case", per_rank), ("cpu reference", cpu), ("placement reference", placement)):
        failed = [o["error"] for o in outcome or () if "error" in o]
        if failed:
            result.fail("ran", f"{name}: {failed[0]}")
            return result
    whole = [o["uninterrupted"] for o in per_rank]
    result.records_per_sec = whole[0]["records_per_sec"]
    tolerance, why = reference_tolerance(case)
    if cpu is None:
        result.checks["=cpu"] = "n/a: semi_sync (see =placement)"
    else:
        _compare(result, "=cpu", whole, [o["uninterrupted"] for o in cpu], tolerance, why)
    if placement is None:
        own = (case["pipeline"], case["compute_kernel"]) == ("sparse_dist", "fused")
        result.checks["=placement"] = (
            "n/a: the case is sparse_dist on the fused kernel" if own else "n/a: sparse_dist is refused here (=cpu)"
        )
    else:
        _compare(result, "=placement", whole, [o["uninterrupted"] for o in placement], tolerance, why)
    not_resumable = resumable(case)
    if not_resumable:
        result.checks["resume=uninterrupted"] = not_resumable
    else:
        mismatch = matrix.identical(whole, [o["resumed"] for o in per_rank], matrix.STOP)
        if mismatch is None:
            result.checks["resume=uninterrupted"] = "ok bit-exact"
        else:
            result.fail("resume=uninterrupted", mismatch)
    matrix.check_export(result, export)
    return result


def format_plan(spec: MatrixSpec, cases: list[Case], refusals: list[Case]) -> str:
    """What ``--list`` prints: each case, what it is compared with and to what tolerance."""
    lines = []
    for case in cases:
        cpu, placement = cpu_reference(case), placement_reference(case, spec)
        tolerance, _ = reference_tolerance(case)
        lines.append(
            f"{matrix.case_name(case)}  =cpu: {'yes' if cpu else 'n/a'}  "
            f"=placement: {matrix.case_name(placement) if placement else 'itself'}  tolerance {tolerance:g}"
        )
    lines += [f"{matrix.case_name(c)}  refused: {spec.refusal_for(c).message}" for c in refusals]  # type: ignore[union-attr]
    lines.append(f"{len(cases)} cases, {len(refusals)} refusals on world sizes {spec.dimensions['world_size']}")
    return "\n".join(lines)


# ------------------------------------------------------------------ NCCL's network


def nccl_network(log: str) -> str:
    """The network NCCL chose, from its ``NCCL_DEBUG=INFO`` output: its ``Using network``
    line (``Socket``, ``IB``, or a plugin's name such as ``AWS Libfabric``), with its
    ``NET/Plugin`` lines (whether libnccl-net.so loaded, and which)."""
    chosen = re.findall(r"NCCL INFO Using network (.+)", log)
    plugin = [line.split("NCCL INFO ", 1)[1].strip() for line in log.splitlines() if "NCCL INFO NET/Plugin" in line]
    name = chosen[0].strip() if chosen else "unknown (NCCL printed no 'Using network' line)"
    return name + (f" ({'; '.join(dict.fromkeys(plugin))})" if plugin else "")


def probe_nccl_network() -> str:
    """Starts a one-rank NCCL communicator in a subprocess with NCCL_DEBUG=INFO and
    returns `nccl_network` of what it printed. NCCL loads its network plugin at the
    first communicator, whatever its size."""
    code = (
        "import torch, torch.distributed as dist; "
        "dist.init_process_group('nccl', store=dist.HashStore(), rank=0, world_size=1); "
        "t = torch.ones(1, device='cuda'); dist.all_reduce(t); torch.cuda.synchronize(); "
        "dist.destroy_process_group()"
    )
    env = {**os.environ, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    return nccl_network(done.stdout + done.stderr)


def probes_nccl(spec: MatrixSpec) -> bool:
    """Whether the check probes NCCL's network: only where a case spans several GPUs
    (with one, no case crosses a network, and the probe costs a process and NCCL's start)."""
    return max(spec.dimensions["world_size"]) > 1


# ------------------------------------------------------------------ the command

VERDICT_VERSION = 1  # of the JSON lines --output holds


def verdict_record(result: CaseResult) -> dict[str, Any]:
    """One ``--output`` line: the case, its choices, pass/fail, seconds, records/s and
    each check's verdict."""
    return {
        "version": VERDICT_VERSION,
        "case": matrix.case_name(result.case),
        "choices": result.case,
        "passed": result.passed,
        "seconds": round(result.seconds, 3),
        "records_per_sec": result.records_per_sec,
        "checks": result.checks,
    }


def read_verdicts(path: str) -> list[dict[str, Any]]:
    """The verdicts of an ``--output`` file, each line checked (a cut-off last line,
    half written, is left out)."""
    from common.json_fields import BOOLEAN, NUMBER, OBJECT, TEXT, JsonObject, optional

    verdicts = []
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip() or (number == len(lines) and not line.endswith(b"}")):
            continue
        document = JsonObject.parse(line, f"{path}:{number}", "a gpu_check verdict")
        document.version(VERDICT_VERSION)
        verdicts.append(
            {
                "case": document.get("case", TEXT),
                "choices": document.get("choices", OBJECT),
                "passed": document.get("passed", BOOLEAN),
                "seconds": document.get("seconds", NUMBER),
                "records_per_sec": document.get("records_per_sec", optional(NUMBER)),
                "checks": document.get("checks", OBJECT),
            }
        )
    return verdicts


def append_line(path: str, record: dict[str, Any]) -> None:
    """Appends ``record`` as one JSON line and flushes it to the disk: a run cut off
    after it keeps it."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def run(
    spec: MatrixSpec,
    strength: int,
    only: str,
    list_only: bool,
    launcher: Launcher | None = None,
    output: str | None = None,
    job_timeout: float | None = None,
) -> int:
    """Generates the cases of ``spec``, runs them (over freshly generated data), prints
    each verdict as it is made (and appends it to ``output``), then the table; 0 when
    every case passed. BadInput when ``only`` selects nothing."""
    cases, refusals = matrix.selected_cases(spec, strength, only, refusal_cases, where=f" on {spec.device}")
    if list_only:
        print(format_plan(spec, cases, refusals))
        return 0
    start = time.perf_counter()

    def verdict(result: CaseResult) -> None:
        print(
            f"{'pass' if result.passed else 'FAIL'} {matrix.case_name(result.case)} ({result.seconds:.1f} s): "
            + "; ".join(f"{k}: {v}" for k, v in result.checks.items()),
            flush=True,
        )
        if output:
            append_line(output, verdict_record(result))

    with matrix.small_data("gpu_check-") as (work, data_dir):
        results = evaluate(
            spec, cases, refusals, data_dir, work, launcher or matrix.local_launcher, verdict, job_timeout
        )
    print(matrix.format_table(spec, results))
    print(
        f"gpu_check on {spec.device}, strength {strength}: {len(cases)} cases and {len(refusals)} refusals "
        f"in {time.perf_counter() - start:.0f} s"
    )
    return 0 if all(r.passed for r in results) else 1


@dataclass
class GpuCheckFlags:
    """The flags of ``python -m bench.gpu_check`` beyond the matrix's (`harness.matrix.MatrixFlags`)."""

    gpus: int | None = flag(None, help="GPUs to plan the world sizes for (default: this host's)")
    device: str = flag(
        "cuda", choices=("cuda", "cpu"), help="cpu: run the cases the CPU can, on gloo, to exercise the check itself"
    )
    output: str | None = flag(None, help="append each verdict here as one JSON line as soon as it is made")
    job_timeout: float = flag(
        300.0,
        help="seconds one training or refusal job may run before it is stopped and recorded as failed (0: no limit)",
    )


def parser() -> OneLineParser:
    result = matrix.matrix_parser("python -m bench.gpu_check", __doc__.split("\n\n")[0], strength=2)
    add_flags(result, GpuCheckFlags, parser_defaults=True)
    return result


@cli_main("python -m bench.gpu_check")
def main(argv: Sequence[str] | None = None) -> int:
    parsed = parser().parse_args(argv)
    matrix_flags = matrix.MatrixFlags(**config_values(matrix.MatrixFlags, parsed))
    gpu_flags = GpuCheckFlags(**config_values(GpuCheckFlags, parsed))
    present = torch.cuda.device_count() if torch.cuda.is_available() else 0
    planned = (
        present
        if gpu_flags.gpus is None
        else gpu_flags.gpus
        if matrix_flags.list_only
        else min(gpu_flags.gpus, present)
    )
    spec = gpu_matrix(planned, gpu_flags.device)
    if matrix_flags.list_only:
        return run(spec, matrix_flags.strength, matrix_flags.only, list_only=True)
    if gpu_flags.device == "cuda":
        if not present:
            print(f"gpu_check: no CUDA device on this host (torch {torch.__version__}): nothing to check")
            return 0
        print(
            f"gpu_check: {present} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
            f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}",
            flush=True,
        )
        if probes_nccl(spec):
            print(f"nccl network: {probe_nccl_network()}", flush=True)
        else:
            print("nccl network: not probed (one GPU: no case communicates)", flush=True)
    return run(
        spec,
        matrix_flags.strength,
        matrix_flags.only,
        list_only=False,
        output=gpu_flags.output,
        job_timeout=gpu_flags.job_timeout or None,
    )


if __name__ == "__main__":
    sys.exit(main())
