"""Train pipelines by name, and the mixed-precision forward they can run.

- sparse_dist: TrainPipelineSparseDist, the default: batch i+1's input all-to-all
  overlaps batch i's compute.
- base: TrainPipelineBase, no overlap (a reference, and for debugging).
- semi_sync: TrainPipelineSemiSync, embeddings one step stale, more overlap (CUDA only).
- prefetch: PrefetchTrainPipelineSparseDist, prefetches into the UVM embedding cache
  (CUDA only).
"""

from typing import Callable, Optional, Tuple

import torch
from torch import nn
from torchrec.distributed.train_pipeline.train_pipelines import (
    PrefetchTrainPipelineSparseDist,
    TrainPipeline,
    TrainPipelineBase,
    TrainPipelineSemiSync,
    TrainPipelineSparseDist,
)

CUDA_ONLY_PIPELINES = ("semi_sync", "prefetch")


def check_pipeline_supported(kind: str, device: torch.device) -> None:
    """One-line ValueError for a pipeline TorchRec cannot run on this device."""
    if kind in CUDA_ONLY_PIPELINES and device.type != "cuda":
        raise ValueError(f"--pipeline {kind} needs CUDA (TorchRec runs it on side streams); "
                         f"on {device.type} use sparse_dist or base")


def autocast_forward(model: nn.Module, device: torch.device) -> Callable[..., Tuple[torch.Tensor, object]]:
    """The model's forward under bf16 autocast: matmuls in bf16, the loss in fp32."""
    def forward(batch):
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            return model(batch)
    return forward


class AutocastModel:
    """The model as `TrainPipelineBase` calls it, with its forward under bf16 autocast.

    torchrec's base pipeline accepts ``custom_model_fwd`` but never uses it (its
    ``progress`` calls the model directly), so the autocast goes into the callable it
    is given as the model. Only the forward is wrapped: backward and the optimizer
    step run outside autocast, as in the other pipelines.

    Args:
        model: the (sharded) model; ``training`` reads its mode.
        device: where the forward runs.

    Example::

        pipeline = TrainPipelineBase(AutocastModel(dmp, device), optimizer, device)
    """

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.module = model
        self._forward = autocast_forward(model, device)

    @property
    def training(self) -> bool:
        return self.module.training

    def __call__(self, batch) -> Tuple[torch.Tensor, object]:
        return self._forward(batch)


def build_pipeline(
    kind: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    amp: bool = False,
) -> TrainPipeline:
    """A pipeline of the given kind over ``model``; with ``amp`` the forward runs under
    bf16 autocast.

    Example::

        pipeline = build_pipeline("sparse_dist", dmp, optimizer, torch.device("cpu"))
        loss, logits, labels = pipeline.progress(iter(loader))
    """
    check_pipeline_supported(kind, device)
    if kind == "base":
        called = AutocastModel(model, device) if amp else model
        return TrainPipelineBase(called, optimizer, device)  # type: ignore[arg-type]
    forward: Optional[Callable] = autocast_forward(model, device) if amp else None
    cls = {"sparse_dist": TrainPipelineSparseDist, "semi_sync": TrainPipelineSemiSync,
           "prefetch": PrefetchTrainPipelineSparseDist}[kind]
    return cls(model, optimizer, device, execute_all_batches=True, custom_model_fwd=forward)


def cpu_bf16_speed_ratio(size: int = 512, repeats: int = 5) -> float:
    """bf16 / fp32 matmul throughput on this CPU (above 1: bf16 is faster)."""
    import time

    def best(dtype: torch.dtype) -> float:
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        torch.mm(a, b)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - start)
        return min(times)

    return best(torch.float32) / best(torch.bfloat16)
