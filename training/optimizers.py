"""Optimizers: fused (in-backward) embedding optimizers and the dense optimizer."""

from typing import Any, Dict, Tuple, Type

import torch
from torch import nn
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from training.config import OptimizerConfig


def _optimizer_class(name: str, config: OptimizerConfig) -> Tuple[Type[torch.optim.Optimizer], Dict[str, Any]]:
    if name == "sgd":
        return torch.optim.SGD, {"lr": config.learning_rate}
    if name == "adagrad":
        return torch.optim.Adagrad, {"lr": config.learning_rate, "eps": config.eps}
    if name == "rowwise_adagrad":
        return RowWiseAdagrad, {"lr": config.learning_rate, "eps": config.eps}
    if name == "adam":
        return torch.optim.Adam, {"lr": config.learning_rate, "eps": config.eps}
    raise ValueError(f"unknown optimizer {name!r}")


def attach_fused_embedding_optimizer(embedding_module: nn.Module, config: OptimizerConfig) -> None:
    """Marks the (unsharded) embedding parameters for an optimizer fused into the backward.

    FBGEMM maps SGD, Adagrad and RowWiseAdagrad to its exact fused kernels; it runs the
    update inside the backward pass, so embedding gradients are never materialised.
    """
    cls, kwargs = _optimizer_class(config.optimizer, config)
    # torchrec adds keys to the dict it is given: pass a copy.
    apply_optimizer_in_backward(cls, embedding_module.parameters(), dict(kwargs))


def build_combined_optimizer(sharded_model: nn.Module, config: OptimizerConfig) -> KeyedOptimizer:
    """The sharded model's fused embedding optimizer combined with the dense one."""
    cls, kwargs = _optimizer_class(config.resolved_dense_optimizer, config)
    dense_params = dict(in_backward_optimizer_filter(sharded_model.named_parameters()))
    dense = KeyedOptimizerWrapper(dense_params, lambda params: cls(params, **kwargs))
    return CombinedOptimizer([sharded_model.fused_optimizer, dense])  # type: ignore[operator]
