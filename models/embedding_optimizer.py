"""The optimizer fused into the embedding tables' backward, below training and planning.

TorchRec reads the optimizer attached to the (unsharded) tables when it shards them:
it picks FBGEMM's fused kernel and, in the planner, the memory of its state. So both
the trainer and the sharding planner attach it, from the same config.

Example::

    attach_fused_embedding_optimizer(model.model.sparse_arch, EmbeddingOptimizerConfig(optimizer="adagrad"))
"""

from dataclasses import dataclass
from typing import Any, Dict, Tuple, Type

import torch
from fbgemm_gpu.tbe.config import WeightDecayMode
from torch import nn
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

from common.config_flags import FlagError, check_choices, flag, option

EMBEDDING_OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")


@dataclass
class EmbeddingOptimizerConfig:
    """The fused embedding optimizer.

    Args:
        optimizer: sgd, adagrad or rowwise_adagrad.
        learning_rate: base learning rate (the dense optimizer's too).
        eps: epsilon of the Adagrad variants (and Adam).
        embedding_weight_decay: L2 weight decay of the rows a batch looks up (FBGEMM's
            L2 mode; rowwise_adagrad only).
    """

    optimizer: str = flag("sgd", choices=EMBEDDING_OPTIMIZERS, help="fused embedding optimizer",
                          alias=("adagrad", "adagrad"))
    learning_rate: float = flag(15.0, help="base learning rate")
    eps: float = flag(1e-8, help="epsilon of Adagrad/Adam")
    embedding_weight_decay: float = flag(
        0.0, help="L2 weight decay of the looked-up embedding rows (FBGEMM's L2 mode; --optimizer rowwise_adagrad)")

    def validate(self) -> None:
        """Raises FlagError naming the flag."""
        check_choices(self)
        for name in ("learning_rate", "eps"):
            if not getattr(self, name) > 0:
                raise FlagError(f"{option(self, name)} must be positive, got {getattr(self, name)}")
        decay = option(self, "embedding_weight_decay")
        if not self.embedding_weight_decay >= 0.0:
            raise FlagError(f"{decay} must not be negative, got {self.embedding_weight_decay}")
        if self.embedding_weight_decay > 0 and self.optimizer != "rowwise_adagrad":
            raise FlagError(f"{decay}: FBGEMM's fused {self.optimizer} kernel has no weight decay (of the CPU "
                            "and GPU kernels only rowwise_adagrad has one): use --optimizer rowwise_adagrad")


def optimizer_class(name: str, learning_rate: float, eps: float, weight_decay: float = 0.0,
                    initial_accumulator: float = 0.0) -> Tuple[Type[torch.optim.Optimizer], Dict[str, Any]]:
    """(optimizer class, its keyword arguments) of sgd, adagrad, rowwise_adagrad or adam;
    ``initial_accumulator``: Adagrad's starting sum of squares (the MLPs'; FBGEMM's
    fused kernels have no such setting)."""
    decay = {"weight_decay": weight_decay} if weight_decay else {}
    if name == "sgd":
        return torch.optim.SGD, {"lr": learning_rate, **decay}
    if name == "adagrad":
        start = {"initial_accumulator_value": initial_accumulator} if initial_accumulator else {}
        return torch.optim.Adagrad, {"lr": learning_rate, "eps": eps, **decay, **start}
    if name == "rowwise_adagrad":
        return RowWiseAdagrad, {"lr": learning_rate, "eps": eps, **decay}
    if name == "adam":
        return torch.optim.Adam, {"lr": learning_rate, "eps": eps, **decay}
    raise ValueError(f"unknown optimizer {name!r}")


def attach_fused_embedding_optimizer(embedding_module: nn.Module, config: EmbeddingOptimizerConfig) -> None:
    """Marks the (unsharded) embedding parameters for an optimizer fused into the backward.

    FBGEMM maps SGD, Adagrad and RowWiseAdagrad to its exact fused kernels; it runs the
    update inside the backward pass, so embedding gradients are never materialised.
    Weight decay goes to FBGEMM in its L2 mode (``weight_decay_mode``; without it FBGEMM
    ignores ``weight_decay``): the looked-up rows' gradients get ``wd * w`` added, as
    FBGEMM documents for its row-wise Adagrad kernel (CUDA; see
    `sharding_plans.rules.check_embedding_weight_decay` for CPU).
    """
    cls, kwargs = optimizer_class(config.optimizer, config.learning_rate, config.eps, config.embedding_weight_decay)
    if config.embedding_weight_decay:
        kwargs["weight_decay_mode"] = WeightDecayMode.L2
    # torchrec adds keys to the dict it is given: pass a copy.
    apply_optimizer_in_backward(cls, embedding_module.parameters(), dict(kwargs))
