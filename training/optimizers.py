"""The optimizers of a sharded model: the fused embedding optimizer (attached before
sharding, `models.embedding_optimizer`), the data-parallel tables' and the MLPs'."""

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from models.embedding_optimizer import optimizer_class
from training.config import OptimizerConfig

# The path component of every embedding table's parameters (EmbeddingBagCollection's
# ModuleDict), e.g. model.sparse_arch.embedding_bag_collection.embedding_bags.t_cat_0.weight.
TABLE_PARAMETER = "embedding_bags"
# ... and of an EmbeddingCollection's (the item tables a history shares, models/sequence_arch.py).
TABLE_PARAMETERS = (TABLE_PARAMETER, "embeddings")


def is_table_parameter(name: str) -> bool:
    """Whether the parameter (or state dict entry) ``name`` is an embedding table's."""
    return any(part in TABLE_PARAMETERS for part in name.split("."))


# Adagrad's accumulator starts here for the MLPs (torch's default is 0, with which the
# first step moves every weight by the full learning rate: make train's second loss was
# ~4e4). 0.01 starts stably and learned fastest of 0.001-1 (docs/quality.md). FBGEMM's
# fused kernels take no initial value (their momentum starts at zero): tables keep 0.
DENSE_ADAGRAD_INITIAL_ACCUMULATOR = 0.01


class LookedUpRowsL2(KeyedOptimizerWrapper):
    """Adds ``weight_decay * w`` to the gradient of every row that has one, then steps
    the optimizer: FBGEMM's L2 weight decay, which touches only the rows a batch looked
    up, for tables trained with dense gradients (data-parallel ones).

    Args:
        params: the tables' parameters by name.
        optim_factory: builds their optimizer (without weight decay of its own).
        weight_decay: the L2 coefficient.
    """

    def __init__(self, params: Mapping[str, torch.Tensor], optim_factory: Callable, weight_decay: float) -> None:
        super().__init__(params, optim_factory)
        self._weight_decay = weight_decay

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                rows = param.grad.ne(0).any(dim=1)  # looked up by the batch on some rank
                param.grad[rows] += self._weight_decay * param[rows]
        super().step(closure)


def build_combined_optimizer(sharded_model: nn.Module, config: OptimizerConfig) -> KeyedOptimizer:
    """The sharded model's fused embedding optimizer, the embedding optimizer of the
    data-parallel tables, and the dense optimizer of the MLPs, combined.

    Sharding drops the in-backward optimizer of data-parallel tables (their weights
    become plain replicated parameters and the fused optimizer holds none of them):
    without the second optimizer they would silently train with the MLPs' optimizer.
    """
    unfused = dict(in_backward_optimizer_filter(sharded_model.named_parameters()))
    tables = {name: p for name, p in unfused.items() if is_table_parameter(name)}
    mlps = {name: p for name, p in unfused.items() if name not in tables}
    optimizers: list[KeyedOptimizer] = [sharded_model.fused_optimizer]
    if tables:
        cls, kwargs = optimizer_class(config.optimizer, config.learning_rate, config.eps)
        factory = lambda ps, cls=cls, kwargs=kwargs: cls(ps, **kwargs)
        optimizers.append(
            LookedUpRowsL2(tables, factory, config.embedding_weight_decay)
            if config.embedding_weight_decay
            else KeyedOptimizerWrapper(tables, factory)
        )
    if mlps:
        cls, kwargs = optimizer_class(
            config.resolved_dense_optimizer,
            config.learning_rate,
            config.eps,
            config.weight_decay,
            DENSE_ADAGRAD_INITIAL_ACCUMULATOR,
        )
        optimizers.append(KeyedOptimizerWrapper(mlps, lambda ps, cls=cls, kwargs=kwargs: cls(ps, **kwargs)))
    return CombinedOptimizer(optimizers)
