"""Optimizers: fused (in-backward) embedding optimizers and the dense optimizer."""

from typing import Any, Callable, Dict, List, Mapping, Tuple, Type

import torch
from fbgemm_gpu.tbe.config import WeightDecayMode
from torch import nn
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from training.config import OptimizerConfig

# The path component of every embedding table's parameters (EmbeddingBagCollection's
# ModuleDict), e.g. model.sparse_arch.embedding_bag_collection.embedding_bags.t_cat_0.weight.
TABLE_PARAMETER = "embedding_bags"
# Adagrad's accumulator starts here for the MLPs (torch's default is 0, with which the
# first step moves every weight by the full learning rate: make train's second loss was
# ~4e4). 0.01 starts stably and learned fastest of 0.001-1 (docs/quality.md). FBGEMM's
# fused kernels take no initial value (their momentum starts at zero): tables keep 0.
DENSE_ADAGRAD_INITIAL_ACCUMULATOR = 0.01


def _optimizer_class(name: str, config: OptimizerConfig, weight_decay: float = 0.0,
                     initial_accumulator: float = 0.0) -> Tuple[Type[torch.optim.Optimizer], Dict[str, Any]]:
    decay = {"weight_decay": weight_decay} if weight_decay else {}
    if name == "sgd":
        return torch.optim.SGD, {"lr": config.learning_rate, **decay}
    if name == "adagrad":
        start = {"initial_accumulator_value": initial_accumulator} if initial_accumulator else {}
        return torch.optim.Adagrad, {"lr": config.learning_rate, "eps": config.eps, **decay, **start}
    if name == "rowwise_adagrad":
        return RowWiseAdagrad, {"lr": config.learning_rate, "eps": config.eps, **decay}
    if name == "adam":
        return torch.optim.Adam, {"lr": config.learning_rate, "eps": config.eps, **decay}
    raise ValueError(f"unknown optimizer {name!r}")


def attach_fused_embedding_optimizer(embedding_module: nn.Module, config: OptimizerConfig) -> None:
    """Marks the (unsharded) embedding parameters for an optimizer fused into the backward.

    FBGEMM maps SGD, Adagrad and RowWiseAdagrad to its exact fused kernels; it runs the
    update inside the backward pass, so embedding gradients are never materialised.
    Weight decay goes to FBGEMM in its L2 mode (``weight_decay_mode``; without it FBGEMM
    ignores ``weight_decay``): the looked-up rows' gradients get ``wd * w`` added, as
    FBGEMM documents for its row-wise Adagrad kernel (CUDA; see
    `check_embedding_weight_decay` for CPU).
    """
    cls, kwargs = _optimizer_class(config.optimizer, config, config.embedding_weight_decay)
    if config.embedding_weight_decay:
        kwargs["weight_decay_mode"] = WeightDecayMode.L2
    # torchrec adds keys to the dict it is given: pass a copy.
    apply_optimizer_in_backward(cls, embedding_module.parameters(), dict(kwargs))


def check_embedding_weight_decay(plan: Dict[str, Dict[str, Any]], device: torch.device,
                                 config: OptimizerConfig) -> None:
    """Refuses --embedding_weight_decay where it would be silently ignored: FBGEMM's
    fused CPU kernels (fbgemm-gpu-cpu 1.8) accept ``weight_decay`` and its modes but
    never apply them (measured: rowwise Adagrad's update is the same with L2, decoupled
    or no decay). Data-parallel tables (`LookedUpRowsL2`) and the CUDA kernel apply it.

    Args:
        plan: the sharding plan summary, {table: {"sharding_type", "compute_kernel", ...}}.
        device: where the tables train.
        config: the optimizer flags.
    """
    if not config.embedding_weight_decay or device.type == "cuda":
        return
    fused = sorted(table for table, entry in plan.items() if entry["sharding_type"] != "data_parallel")
    if fused:
        raise ValueError(f"--embedding_weight_decay: table {fused[0]} is {plan[fused[0]]['sharding_type']} on "
                         f"FBGEMM's fused CPU kernel, which ignores weight decay; on CPU make the tables "
                         "data-parallel (--sharding_type data_parallel)")


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
    tables = {name: p for name, p in unfused.items() if TABLE_PARAMETER in name.split(".")}
    mlps = {name: p for name, p in unfused.items() if name not in tables}
    optimizers: List[KeyedOptimizer] = [sharded_model.fused_optimizer]  # type: ignore[list-item]
    if tables:
        cls, kwargs = _optimizer_class(config.optimizer, config)
        factory = lambda ps, cls=cls, kwargs=kwargs: cls(ps, **kwargs)  # noqa: E731
        optimizers.append(LookedUpRowsL2(tables, factory, config.embedding_weight_decay)
                          if config.embedding_weight_decay else KeyedOptimizerWrapper(tables, factory))
    if mlps:
        cls, kwargs = _optimizer_class(config.resolved_dense_optimizer, config, config.weight_decay,
                                       DENSE_ADAGRAD_INITIAL_ACCUMULATOR)
        optimizers.append(KeyedOptimizerWrapper(mlps, lambda ps, cls=cls, kwargs=kwargs: cls(ps, **kwargs)))
    return CombinedOptimizer(optimizers)
