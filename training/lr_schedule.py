"""Learning-rate schedule: linear warm-up, constant, then power-2 polynomial decay to a floor."""

from collections.abc import Iterable

import torch

from training.config import OptimizerConfig


class WarmupPolyDecaySchedule:
    """The learning rate at each step, applied to every param group of an optimizer.

    - warm-up, steps 0 .. W-1: base * (step + 1) / W, so step W-1 is already at base;
    - then base until the decay start D (no dip after warm-up, unlike the public example);
    - decay, steps D .. D+S: floor + (base - floor) * (1 - (step - D) / S) ** 2;
    - after that, floor (= base * lr_decay_floor).

    Args:
        config: base LR and schedule lengths.

    Example::

        schedule = WarmupPolyDecaySchedule(OptimizerConfig(learning_rate=1.0, lr_warmup_steps=10))
        schedule.lr_at(0)  # 0.1
    """

    def __init__(self, config: OptimizerConfig) -> None:
        self.base = config.learning_rate
        self.warmup = config.lr_warmup_steps
        self.decay_start = config.lr_decay_start
        self.decay_steps = config.lr_decay_steps
        self.floor = config.learning_rate * config.lr_decay_floor

    def lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.base * (step + 1) / self.warmup
        if self.decay_steps <= 0 or step < self.decay_start:
            return self.base
        progress = min(1.0, (step - self.decay_start) / self.decay_steps)
        return self.floor + (self.base - self.floor) * (1.0 - progress) ** 2

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Sets the LR of ``step`` on every param group; returns it.

        Call before the step's forward: fused embedding optimizers take the new rate
        when the train pipeline calls ``zero_grad``, before the backward that uses it.
        """
        lr = self.lr_at(step)
        set_lr(optimizer, lr)
        return lr


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Sets ``lr`` on every param group (the fused embedding optimizers' included: they
    take it at the train pipeline's next ``zero_grad``)."""
    groups: Iterable[dict] = optimizer.param_groups
    for group in groups:
        group["lr"] = lr
