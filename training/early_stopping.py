"""Early stopping and the best model: follows the monitored validation metric, says
when it stopped improving, and keeps the best step's weights for the test split."""

import math
from collections.abc import Callable
from typing import Any

from torch import nn

from checkpoints.directory import best_checkpoint
from checkpoints.errors import CheckpointError
from checkpoints.load import load_checkpoint
from checkpoints.save import CheckpointManager
from training.config import EarlyStoppingConfig
from training.weight_snapshot import HostWeightSnapshot

# The monitored metrics and whether a higher value is better.
HIGHER_IS_BETTER = {"auroc": True, "log_loss": False, "ne": False}


def load_weights(model: nn.Module, checkpoint: str, rank: int) -> None:
    """Loads the model weights of ``checkpoint`` (not its optimizer state or RNG) into
    the (sharded) ``model``. Collective."""
    state = {"model": model.state_dict()}
    load_checkpoint(checkpoint, state, rank, restore_rng=False)
    model.load_state_dict(state["model"])


class EarlyStopping:
    """Counts validations since the best one of the monitored metric.

    A validation improves when its metric beats the best so far by more than
    ``min_delta`` (a NaN never improves). Training should stop once ``patience``
    validations in a row have not improved. The state (best step and figures, the
    count) goes into every checkpoint, so a resumed run continues the count.

    Args:
        config: patience, metric and min_delta (patience None: never stops).

    Example::

        stopping = EarlyStopping(EarlyStoppingConfig(patience=2))
        stopping.update(100, {"auroc": 0.71})  # True: the first validation is the best so far
        stopping.update(200, {"auroc": 0.70})  # False
        stopping.update(300, {"auroc": 0.69})  # False; stopping.should_stop is now True
    """

    def __init__(self, config: EarlyStoppingConfig) -> None:
        self.config = config
        self.best_step: int | None = None
        self.best_validation: dict[str, Any] | None = None
        self.validations_without_improvement = 0

    @property
    def best_value(self) -> float | None:
        return None if self.best_validation is None else self.best_validation[self.config.metric]

    def improves(self, value: float) -> bool:
        if math.isnan(value):
            return False
        best = self.best_value
        if best is None:
            return True
        if HIGHER_IS_BETTER[self.config.metric]:
            return value > best + self.config.min_delta
        return value < best - self.config.min_delta

    def update(self, step: int, validation: dict[str, Any]) -> bool:
        """Takes one validation's figures; True when it is the new best."""
        if self.improves(float(validation[self.config.metric])):
            self.best_step, self.best_validation = step, dict(validation)
            self.validations_without_improvement = 0
            return True
        self.validations_without_improvement += 1
        return False

    @property
    def should_stop(self) -> bool:
        """Checked after a validation that did not improve: patience 0 and 1 both stop
        at the first one (as Keras and Lightning count)."""
        patience = self.config.patience
        return patience is not None and self.validations_without_improvement >= max(patience, 1)

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state for a checkpoint's meta.json."""
        return {
            "metric": self.config.metric,
            "best_step": self.best_step,
            "best_validation": self.best_validation,
            "validations_without_improvement": self.validations_without_improvement,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from a checkpoint's state; a different metric starts afresh."""
        if state.get("metric") != self.config.metric:
            return
        self.best_step = state["best_step"]
        self.best_validation = state["best_validation"]
        self.validations_without_improvement = int(state["validations_without_improvement"])


class BestModel:
    """Keeps the best model of a run and tells the run when to stop.

    With a checkpoint manager, each new best is saved as a checkpoint (unless the
    step already has one) and marked in best.json, which pruning respects, whether
    or not early stopping is on: the directory always names its best checkpoint.
    With early stopping and no manager, every rank copies its own shards to host
    memory. `restore` puts the best weights back into the model, for the test split
    (early stopping only: without it the test split takes the last weights).

    Args:
        config: early stopping's flags (disabled: `observe` never stops, and without a
            checkpoint manager nothing is kept).
        checkpoints: the run's checkpoint manager, or None.
        rank: this process's rank.

    Example::

        best = BestModel(config.early_stopping, checkpoints, rank)
        if best.observe(step, validation, model, save=lambda: trainer.save_checkpoint(...)):
            ...  # patience exhausted: stop training
        best.restore(model, step)
    """

    def __init__(self, config: EarlyStoppingConfig, checkpoints: CheckpointManager | None, rank: int) -> None:
        self.config = config
        self.stopping = EarlyStopping(config)
        self.checkpoints = checkpoints
        self.rank = rank
        self._snapshot: HostWeightSnapshot | None = None
        self.stopped_early = False

    def observe(self, step: int, validation: dict[str, Any], model: nn.Module, save: Callable[[], str]) -> bool:
        """Takes one validation (collective); True when training should stop now.

        ``save`` writes the current state as a checkpoint and returns its path."""
        if not self.config.enabled and self.checkpoints is None:
            return False
        if self.stopping.update(step, validation):
            if self.checkpoints is not None:
                self.checkpoints.mark_best(
                    save(), {"step": step, "metric": self.config.metric, "value": validation[self.config.metric]}
                )
            else:
                self._snapshot = HostWeightSnapshot(model)
            return False
        self.stopped_early = self.stopping.should_stop
        return self.stopped_early

    def restore(self, model: nn.Module, step: int) -> bool:
        """Loads the best weights into ``model`` unless they are the current ones
        (``step``); True when it did. Collective."""
        best = self.stopping.best_step
        if not self.config.enabled or best is None or best == step:
            return False
        if self.checkpoints is not None:
            path = best_checkpoint(self.checkpoints.directory)
            if path is None:
                raise CheckpointError(f"{self.checkpoints.directory}: the best checkpoint (step {best}) is not marked")
            load_weights(model, path, self.rank)
        else:
            assert self._snapshot is not None, "a best step without its weights"
            self._snapshot.restore(model)
        return True
