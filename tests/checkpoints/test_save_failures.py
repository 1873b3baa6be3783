"""Failures around writing: an output that is the input, the checkpoint directory's
lock, SIGTERM during a checkpoint save, a full disk during a save and an export,
and concurrent exports. (--auroc_bins's bound: tests/training/test_binned_auroc.py.)"""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO

import pytest

from checkpoints.directory import LOCK_FILE, complete_checkpoints, newest_checkpoint
from checkpoints.opened import read_manifest
from common.manifest import check_bytes
from common.path_lock import LockHeld, PathLock
from harness.launch import REPO, free_port
from serving import export, predict

TRAIN_FLAGS = [
    "--batch_size",
    "128",
    "--embedding_dim",
    "16",
    "--dense_arch_layer_sizes",
    "64,16",
    "--over_arch_layer_sizes",
    "64,1",
    "--optimizer",
    "adagrad",
    "--learning_rate",
    "0.01",
    "--limit_val_batches",
    "2",
    "--limit_test_batches",
    "2",
    "--checkpoint_every_n_steps",
    "5",
    "--log_every_n_steps",
    "1",
    "--seed",
    "2",
]


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ": error: " in line]


# ---------------------------------------------------------------- predict --output


@pytest.mark.parametrize("how", ["same name", "symlink", "hard link"])
def test_predict_refuses_an_output_that_is_its_input(tmp_path, capsys, how):
    lines = tmp_path / "day_23.tsv"
    lines.write_bytes(b"1\t5\n" * 3)
    output = {"same name": lines, "symlink": tmp_path / "link.csv", "hard link": tmp_path / "hard.csv"}[how]
    if how == "symlink":
        os.symlink(lines, output)
    elif how == "hard link":
        os.link(lines, output)
    # No model needed: the refusal comes before the model is read.
    assert predict.main(["--model", str(tmp_path / "model"), "--input", str(lines), "--output", str(output)]) == 2
    assert capsys.readouterr().err == (
        f"python -m serving.predict: error: --output {output} is the --input {lines}: "
        "writing it would replace the input\n"
    )
    assert lines.read_bytes() == b"1\t5\n" * 3


def test_predict_refuses_an_output_in_a_missing_directory(tmp_path, capsys):
    lines = tmp_path / "day_23.tsv"
    lines.write_bytes(b"1\t5\n")
    output = tmp_path / "missing" / "p.csv"
    assert predict.main(["--model", str(tmp_path / "model"), "--input", str(lines), "--output", str(output)]) == 2
    assert capsys.readouterr().err == (
        f"python -m serving.predict: error: --output {output}: no such directory {tmp_path / 'missing'}\n"
    )


# ---------------------------------------------------------------- export --output


def test_export_refuses_an_output_that_is_a_file(tmp_path, capsys):
    existing = tmp_path / "model"
    existing.write_text("mine")
    assert export.main(["--checkpoint", str(tmp_path / "ckpt"), "--output", str(existing)]) == 2
    assert capsys.readouterr().err == (
        f"python -m serving.export: error: --output {existing} is an existing file: "
        "give the model directory to create\n"
    )
    assert existing.read_text() == "mine"


def test_export_refuses_an_output_another_export_is_writing(tmp_path, capsys):
    """The lock a running export holds beside its --output (taken here as that export
    would): the second export refuses in one line naming the holder, before reading
    the checkpoint."""
    output = tmp_path / "model"
    with PathLock(str(tmp_path / ".model.lock"), "--output"):
        assert export.main(["--checkpoint", str(tmp_path / "ckpt"), "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(
        rf"python -m serving\.export: error: --output {output} is in use by pid {os.getpid()} on "
        rf"{re.escape(socket.gethostname())} since \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d .*\(another "
        r"export to it is running\)\n",
        err,
    ), err
    assert not output.exists() and os.listdir(tmp_path) == []  # the lock went with its holder


# ---------------------------------------------------------------- the lock itself


def test_lock_names_its_holder_and_is_released(tmp_path):
    path = str(tmp_path / "dir.lock")
    with PathLock(path, "--checkpoint_dir d"):
        with open(path) as f:
            holder = json.load(f)
        assert (holder["host"], holder["pid"]) == (socket.gethostname(), os.getpid())
        with pytest.raises(LockHeld, match=rf"^--checkpoint_dir d is in use by pid {os.getpid()} on "):
            PathLock(path, "--checkpoint_dir d").acquire()
    assert not os.path.exists(path)


def test_lock_heartbeat_keeps_it_fresh(tmp_path):
    path = str(tmp_path / "dir.lock")
    with PathLock(path, "d", heartbeat_s=0.05):
        os.utime(path, (0, 0))
        time.sleep(0.5)
        assert time.time() - os.stat(path).st_mtime < 5
        with pytest.raises(LockHeld):
            PathLock(path, "d", stale_after_s=5).acquire()


def test_stale_locks_are_taken_over(tmp_path):
    """A holder of this host that no longer exists: at once. A holder elsewhere whose
    heartbeat stopped: once the file is older than the bound, not before."""
    path = str(tmp_path / "dir.lock")
    with open("/proc/sys/kernel/pid_max") as f:
        unused_pid = int(f.read())  # pids stay below pid_max
    with open(path, "w") as f:
        json.dump({"host": socket.gethostname(), "pid": unused_pid, "started": "then", "token": "x"}, f)
    with PathLock(path, "d"):
        with open(path) as f:
            assert json.load(f)["pid"] == os.getpid()

    with open(path, "w") as f:
        json.dump({"host": "another-host", "pid": 1, "started": "then", "token": "y"}, f)
    with pytest.raises(LockHeld, match="in use by pid 1 on another-host since then"):
        PathLock(path, "d", stale_after_s=60).acquire()
    os.utime(path, (time.time() - 61, time.time() - 61))
    with PathLock(path, "d", stale_after_s=60):
        with open(path) as f:
            assert json.load(f)["pid"] == os.getpid()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_a_lock_that_is_not_a_file_is_refused_and_kept(tmp_path, kind):
    """A lock path holding a directory (however old) or a link is no holder's lock: a
    one-line refusal naming it, and it stays where it was, nothing renamed beside it."""
    path = tmp_path / ".lock"
    if kind == "directory":
        (path / "sub").mkdir(parents=True)
        (path / "sub" / "notes").write_text("mine")
    else:
        (tmp_path / "target").write_text("mine")
        path.symlink_to(tmp_path / "target")
    os.utime(path, (0, 0), follow_symlinks=False)  # older than any stale bound
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(LockHeld) as refused:
        PathLock(str(path), "--checkpoint_dir d").acquire()
    what = "a directory" if kind == "directory" else "a symbolic link"
    assert str(refused.value) == (
        f"--checkpoint_dir d: its lock file {path} is {what}, which no run creates; "
        "remove it (after checking nothing of yours is in it) and run again"
    )
    assert sorted(os.listdir(tmp_path)) == before
    assert (path / "sub" / "notes").read_text() == "mine" if kind == "directory" else path.read_text() == "mine"


# ---------------------------------------------------------------- processes


@contextlib.contextmanager
def stalled_writes(paths: list[str], timeout: float = 300) -> Iterator[None]:
    """Makes each of ``paths`` a FIFO, so that a checkpoint save writing it stalls there
    (a full pipe blocks its writer) until read. Enters once every path has its writer;
    on leaving, reads each to its end, letting the writers finish or fail."""
    opened: list[IO[bytes]] = []
    for path in paths:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkfifo(path)
    openers = [threading.Thread(target=lambda p=path: opened.append(open(p, "rb")), daemon=True) for path in paths]
    for opener in openers:
        opener.start()
    try:
        deadline = time.monotonic() + timeout
        for opener in openers:  # open() of a FIFO returns once a writer has opened it too
            opener.join(max(0.0, deadline - time.monotonic()))
        assert len(opened) == len(paths), "the save never reached its files"
        yield
    finally:
        for path in paths:  # an opener still waiting: give it a writer, which it reads to the end
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        for opener in openers:
            opener.join(10)
        drains = [threading.Thread(target=lambda f=f: f.read(), daemon=True) for f in opened]
        for drain in drains:
            drain.start()
        for drain, f in zip(drains, opened):
            drain.join(timeout)
            f.close()


def _train_argv(data_dir: str, ckpt: str, steps: int) -> list[str]:
    return [
        "--in_memory_binary_criteo_path",
        data_dir,
        *TRAIN_FLAGS,
        "--limit_train_batches",
        str(steps),
        "--checkpoint_dir",
        ckpt,
    ]


def _worker_pids(agent_pid: int) -> list[int]:
    return [
        int(pid)
        for pid in subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(agent_pid)], capture_output=True, text=True, check=True
        ).stdout.split()
    ]


@pytest.mark.slow
@pytest.mark.faults
def test_one_run_per_checkpoint_dir_and_sigterm_while_saving(synthetic_dir, tmp_path):
    """A run holds --checkpoint_dir: a second run there refuses in one line naming the
    holder (exit 2). SIGTERM while the holder saves step 10: exit 143 naming the save,
    no traceback, the lock released, and the newest complete checkpoint is step 5."""
    ckpt = str(tmp_path / "ckpt")
    step10 = os.path.join(ckpt, "step_000000010")
    holder = subprocess.Popen(
        [sys.executable, "dlrm_main.py", *_train_argv(synthetic_dir, ckpt, 20)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with stalled_writes([os.path.join(step10, "__0_0.distcp")]):
            second = subprocess.run(
                [sys.executable, "dlrm_main.py", *_train_argv(synthetic_dir, ckpt, 20)],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert second.returncode == 2, second.stderr[-3000:]
            assert re.fullmatch(
                rf"dlrm_main\.py: error: --checkpoint_dir {ckpt} is in use by pid {holder.pid} on "
                rf"{re.escape(socket.gethostname())} since \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d .*",
                "\n".join(error_lines(second.stderr)),
            ), second.stderr[-3000:]
            holder.send_signal(signal.SIGTERM)
        _, err = holder.communicate(timeout=300)
    finally:
        holder.kill()
    assert holder.returncode == 143, err[-3000:]
    assert error_lines(err) == [
        "dlrm_main.py: error: rank 0 of 1 stopped at step 10 (epoch 0, saving step 10): received SIGTERM"
    ], err[-3000:]
    assert "Traceback" not in err
    assert not os.path.exists(os.path.join(ckpt, LOCK_FILE))
    assert newest_checkpoint(ckpt) == os.path.join(ckpt, "step_000000005")  # what --resume takes


@pytest.mark.slow
@pytest.mark.faults
def test_a_checkpoint_dir_whose_lock_is_a_directory(synthetic_dir, tmp_path):
    """An old directory named .lock in --checkpoint_dir: one line naming it, exit 2, no
    traceback, and the directory left as it was (not renamed aside)."""
    ckpt = tmp_path / "ckpt"
    (ckpt / LOCK_FILE).mkdir(parents=True)
    os.utime(ckpt / LOCK_FILE, (0, 0))
    run = subprocess.run(
        [sys.executable, "dlrm_main.py", *_train_argv(synthetic_dir, str(ckpt), 5)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 2, run.stderr[-3000:]
    assert error_lines(run.stderr) == [
        f"dlrm_main.py: error: --checkpoint_dir {ckpt}: its lock file "
        f"{ckpt / LOCK_FILE} is a directory, which no run creates; remove it (after "
        "checking nothing of yours is in it) and run again"
    ], run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    assert os.listdir(ckpt) == [LOCK_FILE] and os.path.isdir(ckpt / LOCK_FILE)


@pytest.mark.slow
@pytest.mark.faults
def test_sigterm_while_saving_on_two_ranks(synthetic_dir, tmp_path):
    """SIGTERM to both ranks of a torchrun job while they save step 10 (a scheduler
    stopping the job): each exits 143 naming the save, no traceback of ours, and step 5
    stays the newest complete checkpoint."""
    ckpt = str(tmp_path / "ckpt")
    step10 = os.path.join(ckpt, "step_000000010")
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc_per_node",
            "2",
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            f"127.0.0.1:{free_port()}",
            "dlrm_main.py",
            *_train_argv(synthetic_dir, ckpt, 20),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with stalled_writes([os.path.join(step10, f"__{rank}_0.distcp") for rank in (0, 1)]):
            for pid in _worker_pids(agent.pid):
                os.kill(pid, signal.SIGTERM)
        _, err = agent.communicate(timeout=300)
    finally:
        agent.kill()
    assert sorted(line for line in error_lines(err) if line.startswith("dlrm_main.py")) == [
        f"dlrm_main.py: error: rank {rank} of 2 stopped at step 10 (epoch 0, saving step 10): received SIGTERM"
        for rank in (0, 1)
    ], err[-3000:]
    assert os.path.join(REPO, "training") not in err  # no traceback of ours (torchrun prints its own)
    # torchrun's summary: each rank's line from its error file, with the code it exited
    # with (a rank still exiting when torchrun stops it shows SIGTERM's -15 instead).
    for rank in (0, 1):
        assert (
            f"traceback : dlrm_main.py: rank {rank} of 2 stopped at step 10 (epoch 0, saving step 10): "
            "received SIGTERM (exit code 143)"
        ) in err, err[-3000:]
    assert re.search(r"exitcode\s+: 143 ", err), err[-3000:]
    assert complete_checkpoints(ckpt) == [os.path.join(ckpt, "step_000000005")]


@contextlib.contextmanager
def tiny_file_system(path: str, size: str) -> Iterator[str]:
    """A tmpfs of ``size`` mounted at ``path`` (root only), unmounted on leaving."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    os.makedirs(path)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=True)


@pytest.mark.slow
@pytest.mark.faults
def test_full_disk_during_a_save_and_an_export(synthetic_dir, tmp_path):
    """A save that fills the disk: one line naming the file and the full disk, exit 1,
    the partial checkpoint removed, the previous one intact. An export that fills it:
    one line naming the file, exit 2, no temporary left."""
    with tiny_file_system(str(tmp_path / "ckpt"), "6m") as ckpt:  # one checkpoint (4.1 MB) fits
        run = subprocess.run(
            [sys.executable, "dlrm_main.py", *_train_argv(synthetic_dir, ckpt, 10)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 1, run.stderr[-3000:]
        step5, step10 = os.path.join(ckpt, "step_000000005"), os.path.join(ckpt, "step_000000010")
        assert re.fullmatch(
            rf"dlrm_main\.py: error: rank 0 of 1 failed at step 10 \(epoch 0, saving step 10\): "
            rf"CheckpointSaveError: saving checkpoint {step10} failed: \[Errno 28\] No space left on "
            rf"device: '{step10}/__0_[01]\.distcp' \(on rank 0\)",
            "\n".join(error_lines(run.stderr)),
        ), run.stderr[-3000:]
        assert "Traceback" not in run.stderr
        assert sorted(os.listdir(ckpt)) == ["step_000000005"]  # no partial, no lock
        for name, entry in read_manifest(step5).items():
            with open(os.path.join(step5, name), "rb") as f:
                check_bytes(f.read(), name, entry)

        with tiny_file_system(str(tmp_path / "out"), "1m") as out:  # fp32.pt2 holds 3.3 MB of tables
            model = os.path.join(out, "model")
            exported = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "serving.export",
                    "--checkpoint",
                    step5,
                    "--output",
                    model,
                    "--quantize",
                    "none",
                ],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert exported.returncode == 2, exported.stderr[-3000:]
            assert error_lines(exported.stderr) == [
                f"python -m serving.export: error: {model}/fp32.pt2: cannot write (No space left on device); "
                "the partial export was removed"
            ], exported.stderr[-3000:]
            assert os.listdir(out) == []
