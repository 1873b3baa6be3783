"""Optimizers: fused (in-backward) embedding optimizers and the dense optimizer."""

from typing import Any, Dict, List, Tuple, Type

import torch
from torch import nn
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from training.config import OptimizerConfig

# The path component of every embedding table's parameters (EmbeddingBagCollection's
# ModuleDict), e.g. model.sparse_arch.embedding_bag_collection.embedding_bags.t_cat_0.weight.
TABLE_PARAMETER = "embedding_bags"


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
    """The sharded model's fused embedding optimizer, the embedding optimizer of the
    data-parallel tables, and the dense optimizer of the MLPs, combined.

    Sharding drops the in-backward optimizer of data-parallel tables (their weights
    become plain replicated parameters and the fused optimizer holds none of them):
    without the second optimizer they would silently train with the MLPs' optimizer.
    """
    unfused = dict(in_backward_optimizer_filter(sharded_model.named_parameters()))
    tables = {name: p for name, p in unfused.items() if TABLE_PARAMETER in name.split(".")}
    mlps = {name: p for name, p in unfused.items() if name not in tables}
    optimizers: List[KeyedOptimizer] = [sharded_model.fused_optimizer]  # type: ignore[list-item]
    for params, name in ((tables, config.optimizer), (mlps, config.resolved_dense_optimizer)):
        if params:
            cls, kwargs = _optimizer_class(name, config)
            optimizers.append(KeyedOptimizerWrapper(params, lambda ps, cls=cls, kwargs=kwargs: cls(ps, **kwargs)))
    return CombinedOptimizer(optimizers)
