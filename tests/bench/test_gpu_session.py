"""bench/gpu_session.py without a GPU: its plan, its steps' limits and kills, and a whole
session on CPU (tiny sizes) that keeps each step's line as it ends, even when killed."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bench import gpu_session
from bench.gpu_session import Step
from harness.launch import REPO

ORDER = [
    "environment",
    "install_check",
    "gpu_check_prefetch",
    "gpu_check_open_fp16",
    "gpu_check_fp16",
    "gpu_check_pipelines",
    "gpu_check_sequences",
    "dlrmv2",
    "dlrmv2_uvm_caching",
    "peer",
    "dcnv2",
    "eval_rate",
    "export",
]


def test_plan_prints_the_steps_in_order_of_value_without_a_gpu():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert gpu_session.main(["--plan"]) == 0
    lines = out.getvalue().splitlines()
    assert [line.split()[0] for line in lines[1:-1]] == ORDER
    estimates = {s.name: s.estimate_s for s in gpu_session.steps("cuda")}
    assert all(f"{estimates[name]:.0f}s" in line for name, line in zip(ORDER, lines[1:-1]))
    assert "skipped: no --peer" in lines[ORDER.index("peer") + 1]
    total = sum(s.estimate_s for s in gpu_session.steps("cuda") if s.argv)
    assert lines[-1].startswith(f"{len(ORDER)} steps, about {total / 60:.1f} minutes on the GPU")


def test_cpu_steps_are_the_gpu_steps_on_tiny_sizes():
    cuda, cpu = gpu_session.steps("cuda", peer="/p"), gpu_session.steps("cpu", peer="/p")
    assert [s.name for s in cuda] == [s.name for s in cpu] == ORDER
    for a, b in zip(cuda, cpu):
        assert a.argv[:2] == b.argv[:2], a.name  # the same program
    dlrmv2 = next(s for s in cpu if s.name == "dlrmv2")
    assert "--tiny" in dlrmv2.argv and "--tiny" not in next(s for s in cuda if s.name == "dlrmv2").argv
    # On the GPU the check's verdicts go to the session's directory as they are made.
    prefetch = next(s for s in cuda if s.name == "gpu_check_prefetch")
    assert prefetch.verdicts == "gpu_check_prefetch.jsonl" and "--output" in prefetch.argv


def test_bad_flags_are_one_line(capsys):
    assert gpu_session.main(["--device", "cpu", "--minutes", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "python -m bench.gpu_session: error: --output: say where the session's results go (a new directory)"
    )


def _children_alive(marker: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if marker in line and "ps -eo" not in line]


@pytest.mark.slow
@pytest.mark.gpu_host
def test_a_step_past_its_limit_is_killed_with_its_children(tmp_path):
    marker = f"sleep_marker_{os.getpid()}"
    # The step starts a grandchild (as torchrun starts ranks): it dies with the step.
    code = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', "
        f"'{marker}']); time.sleep(300)"
    )
    step = Step("slow", "sleeps", 1, ["-c", code])
    start = time.monotonic()
    result = gpu_session.run_step(step, 2.0, str(tmp_path / "slow.log"))
    assert result.status == "timed_out" and result.detail == "killed after 2 s"
    assert time.monotonic() - start < 30
    time.sleep(0.5)
    assert not _children_alive(marker)
    failing = gpu_session.run_step(
        Step("bad", "exits 1", 1, ["-c", "print('line one'); raise SystemExit(1)"]), 30, str(tmp_path / "bad.log")
    )
    assert failing.status == "failed" and failing.detail == "exit 1: line one"
    figures = gpu_session.run_step(
        Step("ok", "figures", 1, ["-c", "print('x'); print('{\"samples_per_sec\": 5}')"]), 30, str(tmp_path / "ok.log")
    )
    assert (figures.status, figures.result) == ("ok", {"samples_per_sec": 5})
    not_passed = gpu_session.run_step(
        Step("np", "passed false", 1, ["-c", "print('{\"passed\": false}')"]), 30, str(tmp_path / "np.log")
    )
    assert not_passed.status == "failed"


def _start_session(output: str, minutes: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.Popen(
        [sys.executable, "-m", "bench.gpu_session", "--device", "cpu", "--minutes", minutes, "--output", output],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.slow
@pytest.mark.gpu_host
def test_cpu_session_writes_one_line_per_step_as_each_ends(tmp_path):
    """--device cpu --minutes 2: the steps in order, each line written when its step
    ended (the file grows while the session runs), every step accounted for within
    the two minutes, the table beside it."""
    output = str(tmp_path / "session")
    process = _start_session(output, "2")
    path = os.path.join(output, gpu_session.SESSION_FILE)
    seen = []
    while process.poll() is None:
        if os.path.exists(path):
            count = len(gpu_session.read_session(path))
            if not seen or seen[-1] != count:
                seen.append(count)
        time.sleep(0.2)
    out, err = process.communicate()
    records = gpu_session.read_session(path)
    assert [r["step"] for r in records] == ORDER, out + err
    assert len(seen) > 2 and seen == sorted(seen)  # lines appeared one by one while it ran
    statuses = {r["step"]: r["status"] for r in records}
    assert statuses["environment"] == statuses["install_check"] == "ok", err
    assert records[0]["result"]["packages"]["torchrec"]
    assert records[1]["result"]["passed"] is True
    assert statuses["peer"] == "skipped"
    assert sum(r["seconds"] for r in records) <= 2 * 60 + 5
    # Whatever did not fit in two minutes is timed out or skipped, never missing.
    assert set(statuses.values()) <= {"ok", "timed_out", "skipped"}, records
    with open(os.path.join(output, gpu_session.TABLE_FILE)) as f:
        table = f.read().splitlines()
    assert [row.split("|")[1].strip() for row in table[2:]] == ORDER
    assert process.returncode == (0 if "timed_out" not in statuses.values() else 1)
    ran = [r["step"] for r in records if r["status"] != "skipped"]
    assert sorted(os.listdir(os.path.join(output, gpu_session.LOG_DIR))) == sorted(f"{s}.log" for s in ran)
    # The results are never overwritten: a second session into the same directory is refused.
    again = subprocess.run(
        [sys.executable, "-m", "bench.gpu_session", "--device", "cpu", "--output", output],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
    )
    assert again.returncode == 2 and again.stderr.strip().endswith("give a new directory")


@pytest.mark.slow
@pytest.mark.gpu_host
def test_killed_session_keeps_the_lines_written(tmp_path):
    """SIGKILL to the session and its running step mid-way: the lines of the steps that
    ended are there, whole, and read back; the table has the same steps."""
    output = str(tmp_path / "session")
    process = _start_session(output, "5")
    path = os.path.join(output, gpu_session.SESSION_FILE)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and (not os.path.exists(path) or len(gpu_session.read_session(path)) < 2):
        assert process.poll() is None, process.communicate()
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
    records = gpu_session.read_session(path)
    assert 2 <= len(records) < len(ORDER)
    assert [r["step"] for r in records] == ORDER[: len(records)]
    with open(path) as f:
        assert all(json.loads(line)["version"] == gpu_session.VERSION for line in f)
    with open(os.path.join(output, gpu_session.TABLE_FILE)) as f:
        assert len(f.read().splitlines()) == 2 + len(records)


def test_dlrmv2_figures_per_sample_are_the_documented_formulas():
    """docs/benchmarks.md's DLRMv2 figures: 96.2 MFLOP and 196,112 bytes a sample; at
    2.0M samples/s on an H200, 8.2% of its HBM bandwidth and 19.5% of its bf16 peak."""
    from bench import dlrmv2_throughput as bench
    from recipes import DLRMV2_MULTI_HOT_SIZES

    flops = bench.flops_per_sample(13, 26, 128, [512, 256, 128], [1024, 1024, 512, 256, 1], 3, 512)
    forward = (
        13 * 512 + 512 * 256 + 256 * 128 + 3 * 2 * 3456 * 512 + 3456 * 1024 + 1024 * 1024 + 1024 * 512 + 512 * 256 + 256
    )
    assert flops == 6 * forward and round(flops / 1e5) == 962
    moved = bench.traffic(DLRMV2_MULTI_HOT_SIZES, 128, 2, bench.optimizer_state_bytes("rowwise_adagrad", 128))
    assert moved == 214 * (3 * 128 * 2 + 2 * 4 + 2 * 8) + 26 * 128 * 2 * 4 == 196_112
    hbm, bf16 = bench.card_peaks("NVIDIA H200")
    assert (round(2e6 * moved / hbm, 3), round(2e6 * flops / bf16, 3)) == (0.082, 0.195)
    assert bench.card_peaks("NVIDIA H100 80GB HBM3") == (3.35e12, 989e12) and bench.card_peaks("cpu") is None


@pytest.mark.slow
@pytest.mark.gpu_host
def test_dlrmv2_bench_trains_the_recipe_tiny_on_cpu_with_its_bags():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.dlrmv2_throughput",
            "--device",
            "cpu",
            "--tiny",
            "--steps",
            "2",
            "--warmup_steps",
            "1",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["losses_finite"] is True and figures["samples_per_sec"] > 0
    assert (figures["ids_per_sample"], figures["batch_size"], figures["steps"]) == (214, 64, 2)
    assert len(figures["kernels"]) == 26 and figures["hbm_share"] is None  # no card, no share
    assert "(214 a sample in all)" in result.stdout and "why: fused (26 tables" in result.stdout
