"""--async_checkpoint (staged to host memory, written in the background, one save in
flight), --checkpoint_every_n_minutes and --keep_last_n."""

import os

import pytest
import torch

import dlrm_main
from checkpoints.directory import best_checkpoint, complete_checkpoints
from checkpoints.errors import CheckpointSaveError
from checkpoints.load import load_checkpoint
from checkpoints.meta import CheckpointMeta
from checkpoints.save import CheckpointManager
from harness.launch import launch
from training.checkpoint_policy import MinuteCadence
from training.flags import parse_config


def _meta(step: int) -> CheckpointMeta:
    return CheckpointMeta(
        step=step, epoch=0, batch_in_epoch=step, world_size=1, config={}, plan={}, data_source=None, data_features=None
    )


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((256, 8), value), "b": torch.full((8,), value)}}


def test_async_save_writes_what_the_state_held_when_it_was_called(tmp_path):
    manager = CheckpointManager(str(tmp_path / "ckpt"), keep_last_n=0, rank=0, asynchronous=True)
    state = _state(1.0)
    path = manager.save(state, _meta(1))
    state["model"]["w"].fill_(2.0)  # training goes on while the save is written
    manager.wait()
    assert complete_checkpoints(str(tmp_path / "ckpt")) == [path]
    loaded = _state(0.0)
    load_checkpoint(path, loaded, rank=0, restore_rng=False)
    assert torch.equal(loaded["model"]["w"], _state(1.0)["model"]["w"])


def test_async_save_error_is_the_blocking_save_error_raised_at_the_next_save(tmp_path):
    messages = []
    for asynchronous in (False, True):
        directory = tmp_path / f"ckpt_{asynchronous}"
        manager = CheckpointManager(str(directory), keep_last_n=0, rank=0, asynchronous=asynchronous)
        os.makedirs(directory / "step_000000002")
        os.symlink("/dev/full", directory / "step_000000002" / "__0_0.distcp")  # its writes fail: ENOSPC
        manager.save(_state(1.0), _meta(1))
        with pytest.raises(CheckpointSaveError) as error:
            manager.save(_state(1.0), _meta(2))
            manager.save(_state(1.0), _meta(3))  # asynchronous: step 2's error comes here
        messages.append(str(error.value).replace(str(directory), "DIR"))
        assert [os.path.basename(p) for p in complete_checkpoints(str(directory))] == ["step_000000001"]
        assert not os.path.exists(directory / "step_000000003")
    assert messages[0] == messages[1]
    assert messages[0] == (
        "saving checkpoint DIR/step_000000002 failed: [Errno 28] No space left on device: "
        "'DIR/step_000000002/__0_0.distcp' (on rank 0)"
    )


@pytest.mark.parametrize("asynchronous", [False, True])
def test_keep_last_n_never_prunes_the_best(tmp_path, asynchronous):
    directory = str(tmp_path / "ckpt")
    manager = CheckpointManager(directory, keep_last_n=1, rank=0, asynchronous=asynchronous)
    best = manager.save(_state(1.0), _meta(1))
    manager.mark_best(best, {"step": 1})
    for step in (2, 3, 4):
        manager.save(_state(float(step)), _meta(step))
    manager.wait()
    assert best_checkpoint(directory) == best
    assert [os.path.basename(p) for p in complete_checkpoints(directory)] == ["step_000000001", "step_000000004"]


def test_keep_last_n_is_keep_last_n_checkpoints(tmp_path):
    common = ["--checkpoint_dir", str(tmp_path), "--checkpoint_every_n_minutes", "0.5"]
    new = parse_config([*common, "--keep_last_n", "3"], "dlrm_main.py", "").checkpoint
    old = parse_config([*common, "--keep_last_n_checkpoints", "3"], "dlrm_main.py", "").checkpoint
    assert new == old and new.keep_last_n_checkpoints == 3 and new.checkpoint_every_n_minutes == 0.5


def test_minute_cadence_is_due_once_its_minutes_have_passed():
    assert MinuteCadence(1e-9).due()
    cadence = MinuteCadence(60)
    assert not cadence.due()
    cadence.seconds = 0.0
    assert cadence.due()


@pytest.mark.slow
def test_every_n_minutes_saves_at_the_same_step_on_every_rank(synthetic_dir, tmp_path):
    """A cadence shorter than a step: rank 0 finds a save due after every step and both
    ranks save together (a rank saving alone would hang the collective save)."""
    ckpt = str(tmp_path / "ckpt")
    argv = [
        "--in_memory_binary_criteo_path",
        synthetic_dir,
        "--batch_size",
        "128",
        "--embedding_dim",
        "16",
        "--dense_arch_layer_sizes",
        "64,16",
        "--over_arch_layer_sizes",
        "64,1",
        "--limit_train_batches",
        "3",
        "--limit_val_batches",
        "0",
        "--limit_test_batches",
        "0",
        "--checkpoint_dir",
        ckpt,
        "--checkpoint_every_n_minutes",
        "1e-9",
        "--async_checkpoint",
        "--keep_last_n",
        "2",
        "--log_path",
        str(tmp_path / "log.jsonl"),
    ]
    assert launch(dlrm_main.main, argv) == {0: 0, 1: 0}
    assert sorted(os.listdir(ckpt)) == ["step_000000002", "step_000000003"]
    assert [os.path.basename(p) for p in complete_checkpoints(ckpt)] == ["step_000000002", "step_000000003"]
