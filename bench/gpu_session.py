"""One prepared GPU session: what matters on a lent GPU, most valuable first, each result kept as it comes.

    python -m bench.gpu_session --minutes 9 --output DIR [--peer PATH]
    python -m bench.gpu_session --plan            # the steps and their estimates, no GPU needed
    python -m bench.gpu_session --device cpu --minutes 2 --output DIR   # the same steps, tiny, on CPU

Each step runs as its own process (`steps`), in order of value: the environment
(GPU, driver, torch, FBGEMM, torchrec, NCCL); the install check (FBGEMM's TBE forward
and backward against torch's EmbeddingBag); the GPU check's prioritized cases
(`bench.gpu_check`: prefetch first, the open fp16 / row-wise Adagrad / DCN / UVM
caching case, fp16 tables, the other pipelines, the history features); DLRMv2 at the MLPerf size on this
GPU (`bench.dlrmv2_throughput`), then again planned onto a small HBM budget, so UVM
caching misses; the public example's DLRM against the public example in the same call
(`bench/peer_throughput.py`, with ``--peer``); DCNv2 at the MLPerf size, one-hot;
the evaluation rate (`bench/eval_rate.py`); export on the device: torch.export and
AOTInductor programs against the eager model.

A step has its own time limit (its estimate times `STEP_SLACK`, never past the
session's ``--minutes``): past it the step's whole process group is killed and the
step recorded as timed out; a step with no time left is recorded as skipped. As each
step ends, one JSON line goes to DIR/session.jsonl (`read_session` reads it back),
the markdown table DIR/session.md is rewritten, and the step's output is in
DIR/logs/STEP.log: a session cut off keeps every step it finished.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.cli import OneLineParser, cli_main
from common.config_flags import flag, parse_flags
from common.errors import BadInput

PROG = "python -m bench.gpu_session"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SESSION_FILE = "session.jsonl"
TABLE_FILE = "session.md"
LOG_DIR = "logs"
VERSION = 1  # of the lines of session.jsonl
STEP_SLACK = 2.0  # a step may run this many times its estimate
STATUSES = ("ok", "failed", "timed_out", "skipped")
# The case the previous H200 run left open (fp16 / rowwise_adagrad / DCN /
# fused_uvm_caching: 1.1e-3 against a tolerance of 4.9e-4) exists only among the
# strength-3 cases, whose generation takes minutes of CPU: the session runs the
# strength-2 cases nearest it (fp16 tables, row-wise Adagrad, UVM caching).
OPEN_FP16_CASE = "rowwise_adagrad/*/fp16/*fused_uvm_caching*"
OUTPUT = "{output}"  # in a step's argv: the session's --output directory
# A GPU check job (4 steps of a tiny model) past this is stuck, not slow: it fails
# alone and the step's other cases still run.
GPU_CHECK_JOB_TIMEOUT_S = 60
# An HBM budget (GiB) that holds about half of DLRMv2's fp16 tables and their state:
# the planner moves the rest to UVM caching, and uniform ids miss its cache.
UVM_BUDGET_GB = 30
TINY_TRAINING = ["--tiny", "--steps", "3", "--warmup_steps", "1", "--device", "cpu"]


@dataclass(frozen=True)
class Step:
    """One step of the session.

    Args:
        name: its key in the results.
        what: one line on what it measures.
        estimate_s: seconds it should take on the GPU (what ``--plan`` adds up).
        argv: the process to run (after ``python``); None: skipped, for ``skip``.
        skip: why it is skipped.
        verdicts: the file (in the output directory) the GPU check appends its
            verdicts to, which the step's result then counts.
    """

    name: str
    what: str
    estimate_s: float
    argv: list[str] | None
    skip: str = ""
    verdicts: str = ""


def steps(device: str, peer: str | None = None) -> list[Step]:
    """The session's steps in order of value; ``device`` cpu: the same steps, tiny."""
    cuda = device == "cuda"
    own = ["-m", "bench.gpu_session", "--device", device, "--step"]
    training = [] if cuda else TINY_TRAINING

    def gpu_check(name: str, what: str, estimate_s: float, only: str) -> Step:
        # On the GPU its verdicts are appended to OUTPUT/NAME.jsonl as they are made;
        # on CPU (a test of the session) it lists the cases.
        if not cuda:
            return Step(
                name,
                what,
                estimate_s,
                ["-m", "bench.gpu_check", "--strength", "2", "--device", "cpu", "--list", "--only", only],
            )
        return Step(
            name,
            what,
            estimate_s,
            [
                "-m",
                "bench.gpu_check",
                "--strength",
                "2",
                "--only",
                only,
                "--job_timeout",
                str(GPU_CHECK_JOB_TIMEOUT_S),
                "--output",
                os.path.join(OUTPUT, f"{name}.jsonl"),
            ],
            verdicts=f"{name}.jsonl",
        )

    result = [
        Step("environment", "GPU, driver, CUDA, torch, FBGEMM, torchrec, NCCL", 10, own + ["environment"]),
        Step(
            "install_check",
            "FBGEMM's TBE lookup and fused update (forward, backward) = torch's",
            20,
            own + ["install_check"],
        ),
        gpu_check("gpu_check_prefetch", "the GPU check's prefetch cases", 90, "/prefetch/"),
        gpu_check(
            "gpu_check_open_fp16",
            "the cases nearest the open fp16 / row-wise Adagrad / DCN / UVM caching one",
            45,
            OPEN_FP16_CASE if cuda else OPEN_FP16_CASE.removesuffix("fused_uvm_caching*"),
        ),
        gpu_check("gpu_check_fp16", "the GPU check's fp16-table cases", 90, "/fp16/"),
        gpu_check(
            "gpu_check_pipelines",
            "the GPU check's semi_sync, sparse_dist and base cases",
            120,
            "/semi_sync/,/sparse_dist/,/base/",
        ),
        gpu_check(
            "gpu_check_sequences",
            "the GPU check's history cases: din and transformer, the item table's EmbeddingCollection sharded",
            90,
            "/history-",
        ),
        Step(
            "dlrmv2",
            "DLRMv2 at the MLPerf size on this GPU: samples/s, HBM and bf16 shares",
            120,
            ["-m", "bench.dlrmv2_throughput"] + training,
        ),
        Step(
            "dlrmv2_uvm_caching",
            f"DLRMv2 planned onto {UVM_BUDGET_GB} GiB of HBM: UVM caching with misses",
            90,
            ["-m", "bench.dlrmv2_throughput", "--hbm_gb", str(UVM_BUDGET_GB), "--steps", "20"] + training,
        ),
    ]
    peer_flags = ["--nproc", "1", "--rounds", "1"] + (
        ["--short_steps", "2", "--long_steps", "4", "--batch_size", "64"] if not cuda else []
    )
    result.append(
        Step(
            "peer",
            "the public example's small DLRM: ours against the public example, same call",
            90,
            [os.path.join("bench", "peer_throughput.py"), "--peer", peer, *peer_flags] if peer else None,
            skip="no --peer (a checkout of the public example's torchrec_dlrm folder)",
        )
    )
    result += [
        Step(
            "dcnv2",
            "DCNv2 at the MLPerf size, one id a table",
            90,
            ["-m", "bench.dlrmv2_throughput", "--one_hot"] + training,
        ),
        Step(
            "eval_rate",
            "evaluation records/s against training records/s",
            60,
            [os.path.join("bench", "eval_rate.py"), "--nproc", "1"]
            + (
                ["--steps", "60", "--eval_batches", "60", "--auroc_rows", "1000000"]
                if cuda
                else ["--steps", "6", "--eval_batches", "3", "--auroc_rows", "10000", "--num_embeddings", "1000"]
            ),
        ),
        Step("export", "torch.export and AOTInductor programs on the device = eager", 90, own + ["export"]),
    ]
    return result


# ------------------------------------------------------------------ what runs inside a step


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    found = {}
    for name in ("torch", "fbgemm_gpu", "fbgemm-gpu", "fbgemm-gpu-cpu", "torchrec", "torchmetrics"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name.replace("-", "_")] = metadata.version(name)
    return found


def environment(device: str) -> dict[str, Any]:
    """What the session runs on: the GPU, its driver, CUDA, the packages, NCCL."""
    import torch

    record: dict[str, Any] = {"python": sys.version.split()[0], "packages": _versions(), "device": device}
    if device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        record.update(
            gpu=torch.cuda.get_device_name(0),
            gpus=torch.cuda.device_count(),
            memory_gib=round(properties.total_memory / 2**30, 2),
            capability=f"{properties.major}.{properties.minor}",
            cuda=torch.version.cuda,
            nccl=".".join(map(str, torch.cuda.nccl.version())),
        )
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            record["driver"] = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                .stdout.strip()
                .splitlines()[0]
            )
    return record


def install_check(device: str) -> dict[str, Any]:
    """The install script's check of FBGEMM's training kernel on ``device``
    (`scripts.check_install.table_batched_lookup_and_update`: a table-batched lookup's
    sums and its fused SGD update against torch)."""
    import torch

    from scripts.check_install import table_batched_lookup_and_update

    start = time.perf_counter()
    try:
        table_batched_lookup_and_update(torch.device(device))
    except RuntimeError as e:
        return {"passed": False, "error": str(e), "seconds": round(time.perf_counter() - start, 3)}
    return {"passed": True, "seconds": round(time.perf_counter() - start, 3)}


def export_check(device: str) -> dict[str, Any]:
    """The serving exporter's programs on ``device`` against the eager model: the fp32
    torch.export program and its AOTInductor package (the exporter writes no
    TorchScript since serving's program files replaced it)."""
    import tempfile

    import torch

    from data.binary.criteo_layout import NUM_DENSE_FEATURES, NUM_SPARSE_FEATURES
    from models import ModelConfig, build_dlrm_train
    from serving.export import compile_aoti, fp32_program
    from serving.inference_model import ProbabilityModel

    target = torch.device(device)
    names = [f"cat_{f}" for f in range(NUM_SPARSE_FEATURES)]
    config = ModelConfig(
        [1000] * NUM_SPARSE_FEATURES,
        sparse_feature_names=names,
        dense_in_features=NUM_DENSE_FEATURES,
        embedding_dim=16,
        dense_arch_layer_sizes=[32, 16],
        over_arch_layer_sizes=[32, 1],
    )
    torch.manual_seed(0)
    dlrm = build_dlrm_train(config, embedding_device=target, dense_device=target).model
    model = ProbabilityModel(dlrm, names).to(target).eval()
    generator = torch.Generator().manual_seed(1)
    dense = torch.rand(64, NUM_DENSE_FEATURES, generator=generator).to(target)
    ids = torch.randint(0, 1000, (64, NUM_SPARSE_FEATURES), generator=generator).to(target)
    record: dict[str, Any] = {"torchscript": "n/a: the exporter writes torch.export and AOTInductor programs"}
    with torch.no_grad():
        eager = model(dense, ids)
        program = fp32_program(model, (dense[:4], ids[:4]))
        record["torch_export_max_difference"] = (program.module()(dense, ids) - eager).abs().max().item()
        with tempfile.TemporaryDirectory() as work:
            package = os.path.join(work, "model.pt2")
            compile_aoti(program, package)
            loaded = torch._inductor.aoti_load_package(package)
            record["aoti_max_difference"] = (loaded(dense, ids) - eager).abs().max().item()
    # TF32 is off (torch's default) and the arithmetic the same: the programs equal eager to fp32 rounding.
    record["passed"] = max(record["torch_export_max_difference"], record["aoti_max_difference"]) <= 1e-5
    return record


IN_PROCESS_STEPS = {"environment": environment, "install_check": install_check, "export": export_check}


# ------------------------------------------------------------------ running the session


@dataclass
class StepResult:
    """What one step left: its status (`STATUSES`), seconds, the last JSON object it
    printed (its figures) and, for a failure, the end of its output."""

    step: str
    what: str
    status: str
    seconds: float
    estimate_s: float
    limit_s: float
    command: list[str]
    result: dict[str, Any] | None = None
    detail: str = ""

    def record(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "step": self.step,
            "what": self.what,
            "status": self.status,
            "seconds": round(self.seconds, 2),
            "estimate_s": self.estimate_s,
            "limit_s": round(self.limit_s, 1),
            "command": self.command,
            "result": self.result,
            "detail": self.detail,
        }


def last_json_object(text: str) -> dict[str, Any] | None:
    """The last line of ``text`` that is a JSON object (a bench's figures), or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            with contextlib.suppress(json.JSONDecodeError):
                value = json.loads(line)
                if isinstance(value, dict):
                    return value
    return None


def gpu_check_summary(path: str) -> dict[str, Any] | None:
    """The GPU check's verdicts a step appended (`bench.gpu_check.read_verdicts`), as
    counts and the failed cases; None when it made none."""
    if not os.path.exists(path):
        return None
    from bench.gpu_check import read_verdicts

    verdicts = read_verdicts(path)
    failed = [
        v["case"] + ": " + "; ".join(c for c in v["checks"].values() if c.startswith("FAIL"))
        for v in verdicts
        if not v["passed"]
    ]
    return {"cases": len(verdicts), "passed": not failed, "failed": failed, "verdicts": os.path.basename(path)}


def run_step(step: Step, limit_s: float, log_path: str, output: str = ".") -> StepResult:
    """Runs ``step`` in its own process group for at most ``limit_s`` seconds (then
    kills the whole group), its output to ``log_path``; ``output`` replaces `OUTPUT`
    in its argv."""
    command = [sys.executable, *(a.replace(OUTPUT, output) for a in step.argv)] if step.argv else []
    if step.argv is None or limit_s <= 0:
        return StepResult(
            step.name,
            step.what,
            "skipped",
            0.0,
            step.estimate_s,
            max(limit_s, 0.0),
            command,
            detail=step.skip or "no time left in --minutes",
        )
    start = time.perf_counter()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p),
        "PYTHONUNBUFFERED": "1",
    }
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code: int | None = process.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            code = None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # the step's ranks and compilers too
            process.wait()
    seconds = time.perf_counter() - start
    with open(log_path, errors="replace") as log:
        text = log.read()
    figures = (gpu_check_summary(os.path.join(output, step.verdicts)) if step.verdicts else None) or last_json_object(
        text
    )
    if code is None:
        status, detail = "timed_out", f"killed after {limit_s:.0f} s"
    elif code == 0 and (figures is None or figures.get("passed", True)):
        status, detail = "ok", ""
    else:
        status, detail = "failed", f"exit {code}: " + " | ".join(text.strip().splitlines()[-3:])[-600:]
    return StepResult(step.name, step.what, status, seconds, step.estimate_s, limit_s, command, figures, detail)


def _headline(result: dict[str, Any] | None) -> str:
    """The figure a step's row shows."""
    if not result:
        return ""
    if "cases" in result:
        return f"{result['cases'] - len(result['failed'])} of {result['cases']} cases passed"
    for key in ("samples_per_sec", "ratio_of_medians", "eval_records_per_sec", "gpu", "passed"):
        if key in result:
            value = result[key]
            text = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
            extra = ""
            if key == "samples_per_sec" and result.get("hbm_share") is not None:
                extra = f" (HBM {100 * result['hbm_share']:.1f}%, bf16 {100 * result['bf16_peak_share']:.1f}%)"
            return f"{key} {text}{extra}"
    return ""


def format_table(results: Sequence[StepResult]) -> str:
    """The markdown table of session.md: one row per step."""
    lines = ["| step | status | seconds | limit | figure | detail |", "|---|---|---:|---:|---|---|"]
    for r in results:
        detail = r.detail.replace("|", "/").replace("\n", " ")[:200]
        lines.append(
            f"| {r.step} | {r.status} | {r.seconds:.1f} | {r.limit_s:.0f} | {_headline(r.result)} | {detail} |"
        )
    return "\n".join(lines) + "\n"


def append_line(path: str, record: dict[str, Any]) -> None:
    """One JSON line, flushed to the disk before the next step starts."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_session(path: str) -> list[dict[str, Any]]:
    """The steps of a session.jsonl, each line checked (a cut-off last line is left out)."""
    from common.json_fields import NUMBER, OBJECT, TEXT, JsonObject, one_of, optional, text_list

    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or (number == len(lines) and not line.endswith(b"}")):
            continue
        document = JsonObject.parse(line, f"{path}:{number}", "a gpu_session step")
        document.version(VERSION)
        records.append(
            {
                "step": document.get("step", TEXT),
                "status": document.get("status", one_of(*STATUSES)),
                "seconds": document.get("seconds", NUMBER),
                "limit_s": document.get("limit_s", NUMBER),
                "command": document.get("command", text_list(allow_empty=True)),
                "result": document.get("result", optional(OBJECT)),
                "detail": document.get("detail", TEXT),
            }
        )
    return records


def format_plan(plan: Sequence[Step], minutes: float) -> str:
    """What ``--plan`` prints: each step, its estimate and what it measures."""
    lines = [f"{'step':<22} {'estimate':>9}  what"]
    total = 0.0
    for step in plan:
        total += step.estimate_s if step.argv else 0
        note = f"  (skipped: {step.skip})" if step.argv is None else ""
        lines.append(f"{step.name:<22} {step.estimate_s:>8.0f}s  {step.what}{note}")
    lines.append(
        f"{len(plan)} steps, about {total / 60:.1f} minutes on the GPU; --minutes {minutes:g} bounds the "
        "session, each step at most its estimate x " + f"{STEP_SLACK:g}"
    )
    return "\n".join(lines)


def run_session(plan: Sequence[Step], minutes: float, output: str) -> list[StepResult]:
    """Runs the steps in order within ``minutes``; each step's limit is its estimate x
    `STEP_SLACK`, cut to the time left."""
    session_path = os.path.join(output, SESSION_FILE)
    if os.path.exists(session_path):
        raise BadInput(
            f"--output {output}: it already holds {SESSION_FILE} (a session's results are never "
            "overwritten): give a new directory"
        )
    os.makedirs(os.path.join(output, LOG_DIR), exist_ok=True)
    deadline = time.monotonic() + minutes * 60
    results: list[StepResult] = []
    for step in plan:
        left = deadline - time.monotonic()
        limit = min(step.estimate_s * STEP_SLACK, left)
        print(f"gpu_session: {step.name} (limit {max(limit, 0):.0f} s): {step.what}", flush=True)
        result = run_step(step, limit, os.path.join(output, LOG_DIR, f"{step.name}.log"), output)
        results.append(result)
        append_line(session_path, result.record())
        with open(os.path.join(output, TABLE_FILE + ".tmp"), "w") as f:
            f.write(format_table(results))
        os.replace(os.path.join(output, TABLE_FILE + ".tmp"), os.path.join(output, TABLE_FILE))
        print(
            f"gpu_session: {step.name} {result.status} in {result.seconds:.1f} s {_headline(result.result)}", flush=True
        )
    return results


@dataclass
class GpuSessionFlags:
    """The flags of ``python -m bench.gpu_session``."""

    minutes: float = flag(9.0, help="the whole session's time; steps left when it runs out are skipped")
    output: str | None = flag(None, help="a new directory for session.jsonl, session.md and the steps' logs")
    plan: bool = flag(False, help="print the steps and their time estimates, run nothing (no GPU needed)")
    device: str = flag("cuda", choices=("cuda", "cpu"), help="cpu: the same steps on tiny sizes, to test the session")
    peer: str | None = flag(None, help="a checkout of the public example's torchrec_dlrm folder, for the peer step")
    step: str | None = flag(
        None,
        choices=list(IN_PROCESS_STEPS),
        help="run one in-process step and print its JSON (what the session itself calls)",
    )


@cli_main(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0]), GpuSessionFlags, argv)
    if args.step is not None:
        record = IN_PROCESS_STEPS[args.step](args.device)
        print(json.dumps(record), flush=True)
        return 0 if record.get("passed", True) else 1
    if args.minutes <= 0:  # the plan prints the bound too
        raise BadInput(f"--minutes must be positive, got {args.minutes:g}")
    plan = steps(args.device, args.peer)
    if args.plan:
        print(format_plan(plan, args.minutes))
        return 0
    if not args.output:
        raise BadInput("--output: say where the session's results go (a new directory)")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise BadInput(
                "--device cuda: no CUDA device on this host (--plan prints the steps; --device cpu runs them tiny)"
            )
    results = run_session(plan, args.minutes, args.output)
    counts = {status: sum(r.status == status for r in results) for status in STATUSES}
    print(
        f"gpu_session: {', '.join(f'{n} {s}' for s, n in counts.items() if n)}; results in "
        f"{os.path.join(args.output, SESSION_FILE)} and {os.path.join(args.output, TABLE_FILE)}"
    )
    return 0 if counts["failed"] == counts["timed_out"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
