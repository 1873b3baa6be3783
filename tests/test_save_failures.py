"""Failures around writing: an output that is the input, the checkpoint directory's
lock, SIGTERM during a checkpoint save, a full disk during a save and an export,
concurrent exports, and flags bounded before anything is allocated."""

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
from typing import IO, Iterator, List

import pytest

from common.manifest import check_bytes
from common.path_lock import LockHeld, PathLock
from serving import export, predict
from tests.support.launch import REPO, free_port
from training.checkpoint import LOCK_FILE, complete_checkpoints, newest_checkpoint, read_manifest
from training.flags import parse_config

TRAIN_FLAGS = ["--batch_size", "128", "--embedding_dim", "16", "--dense_arch_layer_sizes", "64,16",
               "--over_arch_layer_sizes", "64,1", "--optimizer", "adagrad", "--learning_rate", "0.01",
               "--limit_val_batches", "2", "--limit_test_batches", "2", "--checkpoint_every_n_steps", "5",
               "--log_every_n_steps", "1", "--seed", "2"]


def error_lines(stderr: str) -> List[str]:
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
    assert capsys.readouterr().err == (f"python -m serving.predict: error: --output {output} is the --input {lines}: "
                                       "writing it would replace the input\n")
    assert lines.read_bytes() == b"1\t5\n" * 3


def test_predict_refuses_an_output_in_a_missing_directory(tmp_path, capsys):
    lines = tmp_path / "day_23.tsv"
    lines.write_bytes(b"1\t5\n")
    output = tmp_path / "missing" / "p.csv"
    assert predict.main(["--model", str(tmp_path / "model"), "--input", str(lines), "--output", str(output)]) == 2
    assert capsys.readouterr().err == (f"python -m serving.predict: error: --output {output}: no such directory "
                                       f"{tmp_path / 'missing'}\n")


# ---------------------------------------------------------------- export --output


def test_export_refuses_an_output_that_is_a_file(tmp_path, capsys):
    existing = tmp_path / "model"
    existing.write_text("mine")
    assert export.main(["--checkpoint", str(tmp_path / "ckpt"), "--output", str(existing)]) == 2
    assert capsys.readouterr().err == (f"python -m serving.export: error: --output {existing} is an existing file: "
                                       "give the model directory to create\n")
    assert existing.read_text() == "mine"


def test_export_refuses_an_output_another_export_is_writing(tmp_path, capsys):
    """The lock a running export holds beside its --output (taken here as that export
    would): the second export refuses in one line naming the holder, before reading
    the checkpoint."""
    output = tmp_path / "model"
    with PathLock(str(tmp_path / ".model.lock"), "--output"):
        assert export.main(["--checkpoint", str(tmp_path / "ckpt"), "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"python -m serving\.export: error: --output {output} is in use by pid {os.getpid()} on "
                        rf"{re.escape(socket.gethostname())} since \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d .*\(another "
                        r"export to it is running\)\n", err), err
    assert not output.exists() and os.listdir(tmp_path) == []  # the lock went with its holder


# ---------------------------------------------------------------- --auroc_bins


def test_auroc_bins_is_bounded_at_flag_validation(capsys):
    assert parse_config(["--auroc_bins", str(1 << 24)], "dlrm_main.py", "").auroc_bins == 1 << 24
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["--auroc_bins", "1000000000000"], "dlrm_main.py", "")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == ("dlrm_main.py: error: --auroc_bins must be in [2, 16777216] (2^24 bins are as "
                                       "fine as float32 probabilities above 0.5, and hold 256 MiB of counts), got "
                                       "1000000000000\n")


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
