"""A copy of a sharded model's weights in host memory: each rank keeps its own shards."""

import torch
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.tensor import DTensor


def _local_tensors(value: torch.Tensor) -> list[torch.Tensor]:
    """The tensors this rank holds of one state-dict entry (views, writable in place)."""
    if isinstance(value, ShardedTensor):
        return [shard.tensor for shard in value.local_shards()]
    if isinstance(value, DTensor):
        return [value.to_local()]
    return [value]


class HostWeightSnapshot:
    """This rank's part of a model's state dict, copied to host memory.

    Sharded tables contribute only their local shards, so a rank holds about what it
    trains (its table shards plus the replicated dense layers), never the whole model.

    Args:
        model: the (DistributedModelParallel) model to copy.

    Example::

        best = HostWeightSnapshot(dmp)   # at the best validation
        ...                              # training goes on
        best.restore(dmp)                # the best weights are back
    """

    def __init__(self, model: nn.Module) -> None:
        with torch.no_grad():
            self._tensors: dict[str, list[torch.Tensor]] = {
                name: [t.detach().to("cpu", copy=True) for t in _local_tensors(value)]
                for name, value in model.state_dict().items()
            }

    def restore(self, model: nn.Module) -> None:
        """Copies the snapshot back into ``model`` (built with the same plan)."""
        state = model.state_dict()
        with torch.no_grad():
            for name, value in state.items():
                for target, saved in zip(_local_tensors(value), self._tensors[name], strict=True):
                    target.copy_(saved)
        model.load_state_dict(state)
