"""--async_checkpoint (staged to host memory, written in the background, one save in
flight), --checkpoint_every_n_minutes and --keep_last_n."""

import os

import pytest
import torch

from training.checkpoint import (CheckpointManager, CheckpointSaveError, best_checkpoint, complete_checkpoints,
                                 load_checkpoint)
from training.checkpoint_meta import CheckpointMeta
from training.flags import parse_config


def _meta(step: int) -> CheckpointMeta:
    return CheckpointMeta(step=step, epoch=0, batch_in_epoch=step, world_size=1, config={}, plan={}, data_source=None,
                          data_features=None)


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
    assert messages[0] == ("saving checkpoint DIR/step_000000002 failed: [Errno 28] No space left on device: "
                           "'DIR/step_000000002/__0_0.distcp' (on rank 0)")


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
