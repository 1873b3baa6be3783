"""Slurm for real, on the one-node cluster `make slurm-up` starts on this machine: the
dlrm component, a sweep, a job held pending forever (PartitionConfig) reported as
failed, and a job whose rank is killed, requeued and resumed from its checkpoint.

Skipped, with the reason, when no cluster answers (``sinfo`` and ``sacct``) or when
``.ci/run`` could not start one (``SLURM_UP_FAILED``).
"""

import os
import re
import shutil
import subprocess
import time

import pytest

from harness.launch import REPO, eval_record, read_log
from sweeps.launch import move_slurm_logs
from sweeps.run_state import RunRecord
from tests.support.cluster import parse_sacct_states, sacct_states_argv
from tests.support.sweeps import TINY_FLAGS, assert_row_matches_log, read_results, sweeps, write_sweep
from tests.support.torchx_cli import SMALL_TRAINING_FLAGS, install_components, torchx

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# Seconds a job of these tests may take from submission to its end (they train for seconds).
JOB_TIMEOUT = 300


def _answer(argv):
    """(stdout, None) of a Slurm command, or (None, why it did not answer)."""
    if shutil.which(argv[0]) is None:
        return None, f"{argv[0]} is not installed"
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} did not answer in 30 s"
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return None, f"{argv[0]} failed: {lines[-1] if lines else f'exit code {proc.returncode}'}"
    return proc.stdout, None


def _cluster_cpus():
    """CPUs of the smallest usable node of the default partition; skips the test with
    the reason when no cluster answers."""
    failed = os.environ.get("SLURM_UP_FAILED")
    if failed:
        pytest.skip(f"no Slurm cluster: {failed}")
    nodes, problem = _answer(["sinfo", "--noheader", "--Node", "--format=%t %c"])
    if problem is None:
        _, problem = _answer(["sacct", "--noheader", "-X"])
    if problem is not None:
        pytest.skip(f"no Slurm cluster ({problem}): sudo make slurm-up starts one")
    cpus = [
        int(c)
        for state, c in (line.split() for line in nodes.splitlines())
        if state.rstrip("*") in ("idle", "mix", "alloc", "comp")
    ]
    if not cpus:
        pytest.skip(f"no usable Slurm node (sinfo: {' | '.join(nodes.splitlines())})")
    return min(cpus)


@pytest.fixture(scope="module")
def node_cpus():
    return _cluster_cpus()


@pytest.fixture(scope="module")
def torchx_env(tmp_path_factory):
    return install_components(str(tmp_path_factory.mktemp("components")))


def _job_id(handle):
    assert handle.startswith("slurm://"), handle
    return handle.rsplit("/", 1)[1]


def _sacct_states(job_id):
    out = subprocess.run(sacct_states_argv(job_id), capture_output=True, text=True, check=True, timeout=60).stdout
    return parse_sacct_states(out)


def _scontrol(job_id):
    """``scontrol show job`` as {key: value}."""
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=60).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def _wait_until(what, predicate, timeout=JOB_TIMEOUT, every=0.5):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not after {timeout} s"
        time.sleep(every)


def _output(directory, job_id):
    """The nodes' stdout (what rank 0 prints) of a job whose logs moved to ``directory``."""
    with open(os.path.join(directory, f"slurm-{job_id}-dlrm_main-0.out")) as f:
        return f.read()


def test_dlrm_component_trains_on_slurm(node_cpus, torchx_env, synthetic_dir, tmp_path):
    """`torchx run --wait -s slurm dlrm -j 1x2 --cpu N`: the job ends SUCCEEDED, its
    printed test AUROC is its JSON log's."""
    log_path = str(tmp_path / "run.jsonl")
    proc = torchx(
        [
            "run",
            "--wait",
            "-s",
            "slurm",
            "dlrm",
            "-j",
            "1x2",
            "--cpu",
            str(node_cpus),
            "--data_dir",
            synthetic_dir,
            "--",
            *SMALL_TRAINING_FLAGS,
            "--log_path",
            log_path,
        ],
        torchx_env,
        timeout=JOB_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    job_id = _job_id(proc.stdout.strip().splitlines()[-1])
    move_slurm_logs(job_id, str(tmp_path), submit_dir=REPO)
    assert "Job finished: SUCCEEDED" in proc.stderr, proc.stderr[-4000:]
    assert _sacct_states(job_id) == ["COMPLETED"]
    log = read_log(log_path)
    assert log[0]["world_size"] == 2
    test = eval_record(log, "test")
    assert test["num_samples"] == 2 * 2 * 256  # 2 ranks x 2 batches of 256
    printed = re.findall(r"test: AUROC (\d\.\d+) \| log loss", _output(str(tmp_path), job_id))
    assert printed == [f"{test['auroc']:.4f}"]  # by rank 0 only


def test_sweep_on_slurm_reports_what_each_runs_log_says(node_cpus, synthetic_dir, tmp_path):
    sweep = write_sweep(
        tmp_path / "sweep.yaml",
        scheduler="slurm",
        component_args={"cpu": node_cpus},
        flags={**TINY_FLAGS, "in_memory_binary_criteo_path": synthetic_dir},
        grid={"learning_rate": [0.05, 0.1]},
    )
    out = str(tmp_path / "out")
    proc = sweeps(["run", sweep], timeout=2 * JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(re.findall(r"^\[\d/2\] learning_rate=[\d.]+: submitted slurm://", proc.stdout, re.M)) == 2
    rows = read_results(out)
    assert list(rows) == ["learning_rate=0.05", "learning_rate=0.1"]
    for name, row in rows.items():
        run_dir = os.path.join(out, name)
        assert_row_matches_log(row, os.path.join(run_dir, "log.jsonl"))
        job_id = _job_id(RunRecord.read(run_dir).app_handle)
        assert _sacct_states(job_id) == ["COMPLETED"]
        # The job's output moved from the submit directory to the run directory.
        # With checkpoints the test line names its model (`test (final, step 6, the one export takes): ...`).
        assert re.search(rf"test( \([^)]*\))?: AUROC {float(row['test_auroc']):.4f}", _output(run_dir, job_id))
        assert not [n for n in os.listdir(REPO) if n.startswith(f"slurm-{job_id}")]
    status = sweeps(["status", out])
    assert status.returncode == 0 and status.stdout.splitlines()[-1] == "2 succeeded", status.stdout


def test_sweep_fails_a_job_slurm_would_hold_pending_forever(node_cpus, synthetic_dir, tmp_path):
    """More CPUs per node than the node has: Slurm accepts the job and holds it pending
    (reason PartitionConfig) forever; the sweep cancels it and reports it failed."""
    sweep = write_sweep(
        tmp_path / "sweep.yaml",
        scheduler="slurm",
        component_args={"cpu": node_cpus + 1},
        flags={**TINY_FLAGS, "in_memory_binary_criteo_path": synthetic_dir},
        grid={"learning_rate": [0.05]},
    )
    proc = sweeps(["run", sweep], timeout=JOB_TIMEOUT)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    job_id = re.search(r"submitted slurm://[^/]+/(\d+)", proc.stdout).group(1)
    failed = [line for line in proc.stdout.splitlines() if line.startswith("[1/1] learning_rate=0.05: failed")]
    assert len(failed) == 1 and failed[0].endswith(
        "(exit code unknown): Slurm holds the job pending with reason PartitionConfig, which waiting never "
        "clears: it asks for more than the partition gives (size component_args h/cpu/memMB to the "
        "partition's nodes, see sinfo -o '%P %c %m')"
    ), proc.stdout
    _wait_until("the job cancelled", lambda: _sacct_states(job_id) == ["CANCELLED"], timeout=60)
    (row,) = read_results(str(tmp_path / "out")).values()
    assert row["state"] == "failed" and row["test_auroc"] == ""


def _rank_pids(marker, local_rank):
    """Pids of the training processes whose command line holds ``marker`` (a unique log
    path) and whose LOCAL_RANK is ``local_rank`` (torchrun sets it for each rank)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        if marker.encode() in argv and f"LOCAL_RANK={local_rank}".encode() in environ and b"dlrm_main" in argv:
            pids.append(int(pid))
    return pids


def _released_or_ended(job_id):
    """Whether the job ended; releases it when Slurm holds it after a requeue (for
    its credentials' lifetime, 120 s) instead of waiting."""
    info = _scontrol(job_id)
    if info.get("JobState") == "PENDING" and info.get("Reason") == "BeginTime":
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True, timeout=60)
    return _sacct_states(job_id)[-1] in ("COMPLETED", "FAILED")


def test_killed_rank_requeues_the_job_which_resumes_from_its_checkpoint(node_cpus, torchx_env, synthetic_dir, tmp_path):
    """The dlrm component with --max_retries 1 and a checkpoint directory: rank 1 is
    killed after the first checkpoint; the job script requeues the job, whose second
    run continues from the newest complete checkpoint to the end."""
    ckpt, log_path = str(tmp_path / "ckpt"), str(tmp_path / "run.jsonl")
    every, total = 10, 60
    flags = [
        *SMALL_TRAINING_FLAGS,
        "--log_every_n_steps",
        "1",
        "--checkpoint_every_n_steps",
        str(every),
        "--log_path",
        log_path,
    ]
    flags[flags.index("--limit_train_batches") + 1] = str(total)
    proc = torchx(
        [
            "run",
            "-s",
            "slurm",
            "dlrm",
            "-j",
            "1x2",
            "--cpu",
            str(node_cpus),
            "--max_retries",
            "1",
            "--data_dir",
            synthetic_dir,
            "--checkpoint_dir",
            ckpt,
            "--",
            *flags,
        ],
        torchx_env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    job_id = _job_id(proc.stdout.strip().splitlines()[-1])
    try:
        first = os.path.join(ckpt, f"step_{every:09d}", "COMPLETE")
        _wait_until("the first checkpoint", lambda: os.path.exists(first), every=0.1)
        (pid,) = _rank_pids(log_path, local_rank=1)
        os.kill(pid, 9)
        # The job script requeues the job, pending again once its first run is over.
        _wait_until("the job requeued", lambda: _scontrol(job_id).get("JobState") == "PENDING")
        assert _scontrol(job_id)["Restarts"] == "1"
        # Every rank of the first run is gone: its newest complete checkpoint is final.
        newest = max(
            int(name[len("step_") :])
            for name in os.listdir(ckpt)
            if os.path.exists(os.path.join(ckpt, name, "COMPLETE"))
        )
        # slurmd compares a launch credential with the job's revocation to the second: a
        # release in the second of the requeue is refused ("Job credential revoked") and
        # the job ends FAILED without running. Seen once in CI.
        time.sleep(2)
        _wait_until("the requeued job's end", lambda: _released_or_ended(job_id))
    finally:
        subprocess.run(["scancel", job_id], timeout=60)  # nothing left behind when a wait failed
        move_slurm_logs(job_id, str(tmp_path), submit_dir=REPO)
    assert _sacct_states(job_id) == ["REQUEUED", "COMPLETED"]

    log = read_log(log_path)
    runs = list(dict.fromkeys(r["run_id"] for r in log))
    assert len(runs) == 2  # the killed run, then the requeued one, appending to the same log
    steps = {run: [r["step"] for r in log if r["event"] == "train" and r["run_id"] == run] for run in runs}
    resumed = re.findall(r"resumed from (\S+): step (\d+),", _output(str(tmp_path), job_id))
    assert len(resumed) == 1, _output(str(tmp_path), job_id)[-3000:]
    # The newest checkpoint the killed run completed, from which it goes on to the end.
    assert resumed[0] == (os.path.join(ckpt, f"step_{newest:09d}"), str(newest))
    assert every <= newest <= steps[runs[0]][-1] < total
    assert steps[runs[1]] == list(range(newest + 1, total + 1))
    assert eval_record(log, "test")["run_id"] == runs[1]
