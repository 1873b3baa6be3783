"""Checkpoints: exact resume, interrupted saves, resharding, evaluation, bad checkpoints,
and a torchrun restart after a rank is killed."""

import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

import dlrm_main
from checkpoints.opened import read_meta
from data.binary.criteo_layout import NUM_SPARSE_FEATURES
from harness.launch import REPO, eval_record, free_port, launch, read_log
from tests.support.model_state import assert_same_state, flat_state

STEPS = 16


def flags(data_dir: str, ckpt: str, log: str, *extra: str, batch: int = 128) -> list:
    return [
        "--in_memory_binary_criteo_path",
        data_dir,
        "--batch_size",
        str(batch),
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
        "--limit_train_batches",
        str(STEPS),
        "--limit_val_batches",
        "2",
        "--limit_test_batches",
        "4",
        "--checkpoint_dir",
        ckpt,
        "--checkpoint_every_n_steps",
        "5",
        "--checkpoint_at_epoch_end",
        "--log_every_n_steps",
        "1",
        "--log_path",
        log,
        "--seed",
        "2",
        *extra,
    ]


def step_loss_map(path: str) -> dict:
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a killed process
                pass
    return {r["step"]: r["loss"] for r in records if r["event"] == "train"}


@pytest.fixture(scope="module")
def reference(synthetic_dir, tmp_path_factory):
    """An uninterrupted 2-rank run with checkpoints at steps 5, 10, 15 and 16 (the end)."""
    root = tmp_path_factory.mktemp("reference")
    ckpt, log = str(root / "ckpt"), str(root / "log.jsonl")
    assert launch(dlrm_main.main, flags(synthetic_dir, ckpt, log)) == {0: 0, 1: 0}
    return ckpt, log


@pytest.mark.slow
def test_checkpoint_layout(reference):
    ckpt, _ = reference
    # best.json: the end-of-epoch validation, the only one, is the best so far
    assert sorted(os.listdir(ckpt)) == ["best.json"] + [f"step_{s:09d}" for s in (5, 10, 15, 16)]
    step10 = os.path.join(ckpt, "step_000000010")
    assert {"COMPLETE", "meta.json", ".metadata", "rank_0.pt", "rank_1.pt"} <= set(os.listdir(step10))
    meta = read_meta(step10)
    assert (meta.step, meta.epoch, meta.batch_in_epoch, meta.world_size) == (10, 0, 10, 2)
    assert meta.model.embedding_dim == 16 and meta.config["optim"]["optimizer"] == "adagrad"
    assert set(meta.plan) == {f"t_cat_{i}" for i in range(NUM_SPARSE_FEATURES)}
    end = read_meta(os.path.join(ckpt, "step_000000016"))
    assert (end.epoch, end.batch_in_epoch) == (1, 0)


@pytest.mark.slow
def test_resume_equals_uninterrupted(reference, synthetic_dir, tmp_path):
    """Interrupted after step 10 (its checkpoint is what such a run leaves) and resumed."""
    ckpt, log = reference
    resumed = str(tmp_path / "ckpt")
    os.makedirs(resumed)
    shutil.copytree(os.path.join(ckpt, "step_000000010"), os.path.join(resumed, "step_000000010"))
    new_log = str(tmp_path / "log.jsonl")
    assert launch(dlrm_main.main, flags(synthetic_dir, resumed, new_log, "--resume")) == {0: 0, 1: 0}
    expected, got = step_loss_map(log), step_loss_map(new_log)
    assert sorted(got) == list(range(11, STEPS + 1))
    assert all(got[s] == expected[s] for s in got)  # identical, not merely close
    assert_same_state(
        flat_state(os.path.join(ckpt, "step_000000016"), tmp_path),
        flat_state(os.path.join(resumed, "step_000000016"), tmp_path),
    )
    metrics = ("auroc", "log_loss", "accuracy", "num_samples")
    assert [eval_record(read_log(new_log), "test")[k] for k in metrics] == [
        eval_record(read_log(log), "test")[k] for k in metrics
    ]


@pytest.mark.slow
@pytest.mark.faults
def test_save_killed_before_completion_is_ignored(reference, synthetic_dir, tmp_path):
    ckpt, log = reference
    resumed = str(tmp_path / "ckpt")
    os.makedirs(resumed)
    for step in (10, 15):
        shutil.copytree(os.path.join(ckpt, f"step_{step:09d}"), os.path.join(resumed, f"step_{step:09d}"))
    # what a kill after the tensor files but before completion leaves: no marker, no meta
    os.remove(os.path.join(resumed, "step_000000015", "COMPLETE"))
    os.remove(os.path.join(resumed, "step_000000015", "meta.json"))
    new_log = str(tmp_path / "log.jsonl")
    assert launch(dlrm_main.main, flags(synthetic_dir, resumed, new_log, "--resume")) == {0: 0, 1: 0}
    assert min(step_loss_map(new_log)) == 11  # resumed from step 10, not 15
    assert_same_state(
        flat_state(os.path.join(ckpt, "step_000000016"), tmp_path),
        flat_state(os.path.join(resumed, "step_000000016"), tmp_path),
    )


@pytest.mark.slow
def test_two_ranks_to_one_and_back(reference, synthetic_dir, tmp_path):
    ckpt, log = reference
    final = os.path.join(ckpt, "step_000000016")
    reference_test = eval_record(read_log(log), "test")
    # weights of a 2-rank checkpoint evaluated on 1 rank: the same predictions
    one_log = str(tmp_path / "one.jsonl")
    assert launch(
        dlrm_main.main,
        flags(
            synthetic_dir,
            str(tmp_path / "unused"),
            one_log,
            "--mode",
            "test",
            "--restore_checkpoint_path",
            final,
            batch=256,
        ),
        nproc=1,
    ) == {0: 0}
    one = eval_record(read_log(one_log), "test")
    assert one["num_samples"] == reference_test["num_samples"]
    assert one["log_loss"] == pytest.approx(reference_test["log_loss"], abs=1e-6)
    assert one["auroc"] == pytest.approx(reference_test["auroc"], abs=1e-6)
    # full state: resume the 2-rank step-10 checkpoint on 1 rank (same global batch)
    resumed = str(tmp_path / "resumed")
    os.makedirs(resumed)
    shutil.copytree(os.path.join(ckpt, "step_000000010"), os.path.join(resumed, "step_000000010"))
    resumed_log = str(tmp_path / "resumed.jsonl")
    assert launch(dlrm_main.main, flags(synthetic_dir, resumed, resumed_log, "--resume", batch=256), nproc=1) == {0: 0}
    expected, got = step_loss_map(log), step_loss_map(resumed_log)
    assert sorted(got) == list(range(11, STEPS + 1))
    for s in got:
        assert got[s] == pytest.approx(expected[s], abs=1e-6)
    # and back: the 1-rank checkpoint at step 15 continues on 2 ranks
    back = str(tmp_path / "back")
    os.makedirs(back)
    shutil.copytree(os.path.join(resumed, "step_000000015"), os.path.join(back, "step_000000015"))
    back_log = str(tmp_path / "back.jsonl")
    assert launch(dlrm_main.main, flags(synthetic_dir, back, back_log, "--resume")) == {0: 0, 1: 0}
    assert step_loss_map(back_log)[16] == pytest.approx(expected[16], abs=1e-6)


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if "error" in line]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def refusal_line(capsys, argv: list) -> str:
    """Runs the entry point in this process; it must exit 2 with one error line."""
    try:
        code = dlrm_main.main(argv)
    except SystemExit as e:
        code = e.code
    assert code == 2
    return one_error_line(capsys.readouterr().err)


@pytest.mark.slow
def test_mismatched_and_corrupted_checkpoints(reference, synthetic_dir, tmp_path, capsys):
    ckpt, _ = reference
    copy = str(tmp_path / "ckpt")
    shutil.copytree(ckpt, copy)
    log = str(tmp_path / "log.jsonl")

    def run(*extra: str) -> str:
        return refusal_line(capsys, flags(synthetic_dir, copy, log, *extra, batch=256))

    line = run("--resume", "--embedding_dim", "8", "--dense_arch_layer_sizes", "64,8")
    assert "step_000000016 does not match this run" in line and "embedding_dim is 16 in the checkpoint, 8 now" in line
    assert 'optim.optimizer is "adagrad" in the checkpoint, "sgd" now' in run("--resume", "--optimizer", "sgd")
    # 1 rank with a 2-rank global batch of 256 rows, but batch 128: position cannot carry over
    try:
        dlrm_main.main(flags(synthetic_dir, copy, log, "--resume"))
    except SystemExit:
        pass
    assert "global batch of 256 rows, this run has 128" in capsys.readouterr().err
    with open(os.path.join(copy, "step_000000016", "meta.json"), "w") as f:
        f.write("{ not json")
    assert "step_000000016/meta.json: 10 bytes, the manifest says" in run("--resume")
    shutil.rmtree(os.path.join(copy, "step_000000016"))
    shard = os.path.join(copy, "step_000000015", "__0_0.distcp")
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 3)
    assert "step_000000015 could not be loaded" in run("--resume")
    os.remove(os.path.join(copy, "step_000000010", "COMPLETE"))
    assert "step_000000010 is incomplete (no COMPLETE marker)" in run(
        "--mode", "test", "--restore_checkpoint_path", os.path.join(copy, "step_000000010")
    )
    assert "nowhere: no such directory" in run("--mode", "test", "--restore_checkpoint_path", str(tmp_path / "nowhere"))


@pytest.mark.slow
def test_keep_last_n_prunes_after_completion(synthetic_dir, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    assert launch(
        dlrm_main.main,
        flags(synthetic_dir, ckpt, str(tmp_path / "l.jsonl"), "--keep_last_n_checkpoints", "2", batch=256),
        nproc=1,
    ) == {0: 0}
    assert sorted(os.listdir(ckpt)) == ["best.json", "step_000000015", "step_000000016"]


def _torchrun_with_restarts(argv: list, max_restarts: int) -> subprocess.Popen:
    """Two ranks of dlrm_main.py under torchrun, restarted up to ``max_restarts`` times."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc_per_node",
            "2",
            "--max_restarts",
            str(max_restarts),
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            f"127.0.0.1:{free_port()}",
            "dlrm_main.py",
            *argv,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_step(run_log: str, step: int, timeout: float) -> None:
    """Returns once the run log has a training step >= ``step``, or after ``timeout`` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline and max(step_loss_map(run_log) if os.path.exists(run_log) else {}, default=0) < step:
        time.sleep(0.005)


@pytest.mark.slow
@pytest.mark.faults
def test_torchrun_restart_after_a_killed_rank(reference, synthetic_dir, tmp_path):
    """torchrun --max_restarts: rank 1 is killed by SIGKILL mid-training; the job
    restarts, resumes from the newest checkpoint and ends with the reference's weights."""
    ckpt, log = reference
    run_ckpt, run_log = str(tmp_path / "ckpt"), str(tmp_path / "log.jsonl")
    argv = flags(synthetic_dir, run_ckpt, run_log, "--resume")
    proc = _torchrun_with_restarts(argv, max_restarts=2)
    _wait_for_step(run_log, 7, timeout=180)
    workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(workers) == 2
    os.kill(int(sorted(workers, key=int)[1]), signal.SIGKILL)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-3000:]
    assert "resumed from" in output
    expected, got = step_loss_map(log), step_loss_map(run_log)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert all(got[s] == expected[s] for s in got)
    assert_same_state(
        flat_state(os.path.join(ckpt, "step_000000016"), tmp_path),
        flat_state(os.path.join(run_ckpt, "step_000000016"), tmp_path),
    )


def set_manifest_entry(checkpoint: str, name: str) -> None:
    """Rewrites the manifest entry of ``name`` to match the file: what someone crafting
    a checkpoint would do."""
    marker = os.path.join(checkpoint, "COMPLETE")
    if open(marker).read().strip() == "complete":
        return  # no manifest to rewrite
    manifest = json.load(open(marker))
    data = open(os.path.join(checkpoint, name), "rb").read()
    manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    with open(marker, "w") as f:
        json.dump(manifest, f)


class _CreatesFile:
    """A pickle payload that creates a file when unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return exec, (f"open({self.path!r}, 'w').close()",)


@pytest.mark.slow
def test_checkpoint_files_are_checked_and_never_run_code(reference, synthetic_dir, tmp_path, capsys):
    """A crafted .metadata (even with a manifest that matches it) runs nothing on
    --resume, --mode test or export; a bit-flipped shard and a missing .metadata are
    refused by name in one line; a checkpoint without a manifest loads with a warning."""
    ckpt, _ = reference
    copy = str(tmp_path / "ckpt")
    shutil.copytree(ckpt, copy)
    step16, step15 = os.path.join(copy, "step_000000016"), os.path.join(copy, "step_000000015")
    log = str(tmp_path / "log.jsonl")

    def run(*extra: str) -> str:
        return refusal_line(capsys, flags(synthetic_dir, copy, log, *extra, batch=256))

    created = tmp_path / "payload_ran"
    with open(os.path.join(step16, ".metadata"), "wb") as f:
        pickle.dump(_CreatesFile(str(created)), f)
    set_manifest_entry(step16, ".metadata")
    for extra in (("--resume",), ("--mode", "test", "--restore_checkpoint_path", step16)):
        line = run(*extra)
        assert not created.exists()
        assert f"{step16}/.metadata: refused: it asks to load builtins.exec" in line, line
    export = subprocess.run(
        [
            sys.executable,
            "-m",
            "serving.export",
            "--checkpoint",
            step16,
            "--output",
            str(tmp_path / "model"),
            "--quantize",
            "none",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert export.returncode == 2 and not created.exists()
    assert f"{step16}/.metadata: refused" in one_error_line(export.stderr)
    os.remove(os.path.join(step16, ".metadata"))
    export = subprocess.run(
        [
            sys.executable,
            "-m",
            "serving.export",
            "--checkpoint",
            step16,
            "--output",
            str(tmp_path / "model"),
            "--quantize",
            "none",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert export.returncode == 2
    assert "step_000000016: .metadata is missing or unreadable" in one_error_line(export.stderr)
    shutil.rmtree(step16)

    shard = os.path.join(step15, "__0_0.distcp")
    weights = [
        info
        for index, info in FileSystemReader(step15).read_metadata().storage_data.items()
        if index.fqn.startswith("model.") and info.relative_path == "__0_0.distcp"
    ]
    with open(shard, "r+b") as f:  # one bit of a weight (a load for testing reads no optimizer state)
        f.seek(weights[0].offset + weights[0].length // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))
    line = run("--mode", "test", "--restore_checkpoint_path", step15)
    assert re.search(rf"{shard} bytes \d+-\d+: its SHA-256 differs from the manifest's: the file is damaged", line), (
        line
    )

    from serving.inference_model import load_checkpoint_model

    step10 = os.path.join(copy, "step_000000010")
    with open(os.path.join(step10, "COMPLETE"), "w") as f:
        f.write("complete\n")  # what checkpoints saved before manifests hold
    load_checkpoint_model(step10)
    assert f"warning: checkpoint {step10} has no manifest" in capsys.readouterr().err


@pytest.mark.slow
def test_storage_failures_are_one_line(synthetic_dir, tmp_path, capsys):
    """A full disk at a save: one line naming the rank and step, exit 1, earlier
    checkpoints kept. A --checkpoint_dir that cannot be written: exit 2 before training."""
    ckpt, log = str(tmp_path / "ckpt"), str(tmp_path / "log.jsonl")
    os.makedirs(os.path.join(ckpt, "step_000000010"))
    os.symlink("/dev/full", os.path.join(ckpt, "step_000000010", "__0_0.distcp"))  # writes fail: ENOSPC
    run = subprocess.run(
        [sys.executable, "dlrm_main.py", *flags(synthetic_dir, ckpt, log)], cwd=REPO, capture_output=True, text=True
    )
    assert run.returncode == 1
    line = one_error_line(run.stderr)
    assert "rank 0 of 1 failed at step 10 (epoch 0, saving step 10): CheckpointSaveError: saving checkpoint" in line
    assert "No space left on device" in line
    assert os.path.exists(os.path.join(ckpt, "step_000000005", "COMPLETE"))

    if os.geteuid() == 0:  # root writes through permission bits: take a read-only file system
        read_only = "/sys/fs/dlrm_checkpoints"
        if os.access("/sys/fs", os.W_OK) and not os.path.ismount("/sys"):
            pytest.skip("no read-only directory to test with")
    else:
        read_only = str(tmp_path / "read_only")
        os.makedirs(read_only, mode=0o555)
    ro_log = str(tmp_path / "read_only.jsonl")
    try:
        code = dlrm_main.main(flags(synthetic_dir, read_only, ro_log))
    except SystemExit as e:
        code = e.code
    assert code == 2
    assert f"--checkpoint_dir {read_only}: cannot write there" in one_error_line(capsys.readouterr().err)
    assert not os.path.exists(ro_log)  # refused before the run started
    # Early stopping saves its best checkpoints there too, without a saving flag.
    argv = flags(synthetic_dir, read_only, ro_log, "--early_stopping_patience", "1")
    del argv[argv.index("--checkpoint_every_n_steps") : argv.index("--checkpoint_every_n_steps") + 2]
    argv.remove("--checkpoint_at_epoch_end")
    assert f"--checkpoint_dir {read_only}: cannot write there" in refusal_line(capsys, argv)
    assert not os.path.exists(ro_log)


@pytest.mark.slow
def test_async_checkpoints_equal_the_blocking_ones(reference, synthetic_dir, tmp_path):
    """--async_checkpoint trains the same steps and writes the same checkpoints, bit for
    bit, as the blocking saves; resuming from one continues exactly."""
    ckpt, log = reference
    run_ckpt, run_log = str(tmp_path / "ckpt"), str(tmp_path / "log.jsonl")
    assert launch(dlrm_main.main, flags(synthetic_dir, run_ckpt, run_log, "--async_checkpoint")) == {0: 0, 1: 0}
    assert step_loss_map(run_log) == step_loss_map(log)
    assert sorted(os.listdir(run_ckpt)) == sorted(os.listdir(ckpt))
    for step in ("step_000000010", "step_000000016"):
        assert_same_state(
            flat_state(os.path.join(ckpt, step), tmp_path), flat_state(os.path.join(run_ckpt, step), tmp_path)
        )
        for rank in (0, 1):  # torch's generator as it was at the step, not when the write ended
            blocking, background = (
                torch.load(os.path.join(d, step, f"rank_{rank}.pt"), weights_only=True) for d in (ckpt, run_ckpt)
            )
            assert torch.equal(blocking["torch"], background["torch"])
    resumed, resumed_log = str(tmp_path / "resumed"), str(tmp_path / "resumed.jsonl")
    os.makedirs(resumed)
    shutil.copytree(os.path.join(run_ckpt, "step_000000010"), os.path.join(resumed, "step_000000010"))
    assert launch(dlrm_main.main, flags(synthetic_dir, resumed, resumed_log, "--resume", "--async_checkpoint")) == {
        0: 0,
        1: 0,
    }
    expected, got = step_loss_map(log), step_loss_map(resumed_log)
    assert sorted(got) == list(range(11, STEPS + 1)) and all(got[s] == expected[s] for s in got)
    assert_same_state(
        flat_state(os.path.join(ckpt, "step_000000016"), tmp_path),
        flat_state(os.path.join(resumed, "step_000000016"), tmp_path),
    )


@pytest.mark.slow
@pytest.mark.faults
def test_rank_killed_during_an_async_save(reference, synthetic_dir, tmp_path):
    """Rank 1's background save of step 10 is held (its data file is a FIFO nobody
    reads) while training goes on; rank 1 is then killed by SIGKILL. The partial step 10
    is ignored: torchrun's restart resumes from step 5 and ends with the reference's weights."""
    ckpt, log = reference
    run_ckpt, run_log = str(tmp_path / "ckpt"), str(tmp_path / "log.jsonl")
    held = os.path.join(run_ckpt, "step_000000010", "__1_0.distcp")
    os.makedirs(os.path.dirname(held))
    os.mkfifo(held)  # opening it for writing blocks until a reader comes: none does
    argv = flags(synthetic_dir, run_ckpt, run_log, "--resume", "--async_checkpoint")
    proc = _torchrun_with_restarts(argv, max_restarts=1)
    _wait_for_step(run_log, 12, timeout=300)
    assert max(step_loss_map(run_log)) >= 12  # training went on while step 10 was being saved
    assert not os.path.exists(os.path.join(run_ckpt, "step_000000010", "COMPLETE"))
    workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(workers) == 2
    os.unlink(held)  # the restarted job writes a plain file there
    os.kill(int(sorted(workers, key=int)[1]), signal.SIGKILL)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-3000:]
    assert f"resumed from {run_ckpt}/step_000000005" in output, output[-3000:]
    expected, got = step_loss_map(log), step_loss_map(run_log)
    assert all(got[s] == expected[s] for s in got)
    assert_same_state(
        flat_state(os.path.join(ckpt, "step_000000016"), tmp_path),
        flat_state(os.path.join(run_ckpt, "step_000000016"), tmp_path),
    )
