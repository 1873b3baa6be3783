"""The optimizer fused into the embedding tables' backward, below training and planning.

TorchRec reads the optimizer attached to the (unsharded) tables when it shards them:
it picks FBGEMM's fused kernel and, in the planner, the memory of its state. So both
the trainer and the sharding planner attach it, from the same config.

Example::

    attach_fused_embedding_optimizer(model.model.sparse_arch, EmbeddingOptimizerConfig(optimizer="adagrad"))
"""

from typing import Any

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    WeightDecayMode,  # here in FBGEMM 1.6 to 1.9 (1.6 has no tbe.config)
)
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.optim import RowWiseAdagrad

from common.library_noise import TORCHSCRIPT_NOTICES, quieted
from models.embedding_optimizer_config import EmbeddingOptimizerConfig

# torch's own, to which torchrec's deprecated `apply_optimizer_in_backward` forwards.
# Importing torch.distributed.optim scripts its functional optimizers (TorchScript's notices).
with quieted(TORCHSCRIPT_NOTICES):
    from torch.distributed.optim import _apply_optimizer_in_backward


def optimizer_class(
    name: str, learning_rate: float, eps: float, weight_decay: float = 0.0, initial_accumulator: float = 0.0
) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
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
    # The tables only: a sparse arch with histories also holds their attention's dense
    # weights, which the dense optimizer updates. torchrec adds keys to the dict it is
    # given: pass a copy.
    tables = [
        param
        for module in embedding_module.modules()
        if isinstance(module, EmbeddingBagCollection | EmbeddingCollection)
        for param in module.parameters()
    ]
    _apply_optimizer_in_backward(cls, tables, dict(kwargs))
