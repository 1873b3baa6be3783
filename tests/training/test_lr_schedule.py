import pytest

from training.config import OptimizerConfig
from training.lr_schedule import WarmupPolyDecaySchedule


def test_warmup_constant_decay_floor():
    schedule = WarmupPolyDecaySchedule(
        OptimizerConfig(learning_rate=2.0, lr_warmup_steps=4, lr_decay_start=10, lr_decay_steps=8, lr_decay_floor=0.1)
    )
    assert [schedule.lr_at(s) for s in range(4)] == [0.5, 1.0, 1.5, 2.0]
    # No dip between warm-up and decay start (the public example sits at (W-1)/W there).
    assert [schedule.lr_at(s) for s in range(4, 11)] == [2.0] * 7
    assert schedule.lr_at(14) == pytest.approx(0.2 + 1.8 * 0.5**2)
    assert schedule.lr_at(18) == pytest.approx(0.2)
    assert schedule.lr_at(1000) == pytest.approx(0.2)
    values = [schedule.lr_at(s) for s in range(10, 19)]
    assert all(a > b for a, b in zip(values, values[1:]))


def test_constant_without_warmup_or_decay():
    schedule = WarmupPolyDecaySchedule(OptimizerConfig(learning_rate=15.0))
    assert {schedule.lr_at(s) for s in (0, 1, 10_000)} == {15.0}


def test_apply_sets_every_param_group():
    import torch

    params = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    optimizer = torch.optim.SGD([{"params": [params[0]]}, {"params": [params[1]]}], lr=1.0)
    schedule = WarmupPolyDecaySchedule(OptimizerConfig(learning_rate=1.0, lr_warmup_steps=2))
    assert schedule.apply(optimizer, 0) == 0.5
    assert [g["lr"] for g in optimizer.param_groups] == [0.5, 0.5]
