"""Train pipelines by name, and the mixed-precision forward they can run.

- sparse_dist: TrainPipelineSparseDist, the default: batch i+1's input all-to-all
  overlaps batch i's compute.
- base: TrainPipelineBase, no overlap (a reference, and for debugging), started
  afresh on each new iterator (`RestartingTrainPipelineBase`).
- semi_sync: TrainPipelineSemiSync, embeddings one step stale, more overlap (CUDA only;
  one GPU only before torchrec 1.9, `check_pipeline_supported`).
- prefetch: PrefetchTrainPipelineSparseDist, prefetches into the UVM embedding cache
  (CUDA only), with the stream order torchrec 1.6, 1.8 and 1.9 lack (`FencedPrefetchPipeline`).

`check_plan_for_pipeline` refuses plans whose embedding caches a pipeline would
leave inconsistent; `release_cache_line_locks` frees the cache lines no-grad forwards
leave locked.
"""

import platform
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torchrec
from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen
from torch import nn
from torchrec.distributed.train_pipeline.pipeline_context import PrefetchTrainPipelineContext, TrainPipelineContext
from torchrec.distributed.train_pipeline.train_pipelines import (
    PrefetchTrainPipelineSparseDist,
    TrainPipeline,
    TrainPipelineBase,
    TrainPipelineSemiSync,
    TrainPipelineSparseDist,
)

from common.errors import BadInput
from sharding_plans.constraints import UNCACHED_KERNELS
from training.config import SEMI_SYNC_START_BATCH

CUDA_ONLY_PIPELINES = ("semi_sync", "prefetch")
# Semi-sync runs forward(i+1) before the embedding backward of batch i: only FBGEMM's
# fused kernels, which apply that backward in place without a cache, keep it exact
# (data-parallel tables share their weights with the dense optimizer, which torchrec
# warns may not converge).
SEMI_SYNC_KERNELS = ("fused", "fused_uvm")
# The first torchrec whose semi_sync orders the embedding lookup after the input
# all-to-all it reads (upstream PR 4497): before it, `start_embedding_lookup` waits for
# the all-to-all on the data-dist stream and looks up on the default stream with no
# dependency between the two, so above one GPU it can read ids still in flight.
SEMI_SYNC_ORDERED_TORCHREC = (1, 9)


def _release(version: str) -> tuple[int, int]:
    """``"1.8.0"``, ``"1.9.0.dev20251101+cu130"`` -> (1, 8), (1, 9)."""
    major, minor = version.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def check_pipeline_supported(
    kind: str, device: torch.device, world_size: int = 1, torchrec_version: str = torchrec.__version__
) -> None:
    """One-line BadInput for a pipeline TorchRec cannot run here: semi_sync and prefetch
    off CUDA, semi_sync above one GPU on a torchrec before 1.9 (its lookup races the
    input all-to-all).

    Example::

        check_pipeline_supported("semi_sync", torch.device("cuda", 0), world_size=8)
    """
    if kind in CUDA_ONLY_PIPELINES and device.type != "cuda":
        raise BadInput(
            f"--pipeline {kind} needs CUDA (TorchRec runs it on side streams); on {device.type} use sparse_dist or base"
        )
    if kind == "semi_sync" and world_size > 1 and _release(torchrec_version) < SEMI_SYNC_ORDERED_TORCHREC:
        raise BadInput(
            f"--pipeline semi_sync on {world_size} GPUs needs torchrec 1.9 or newer (torchrec "
            f"{torchrec_version} looks embeddings up before their input all-to-all is done): use "
            "the torch2.14 stack, one GPU, or --pipeline sparse_dist"
        )


def check_plan_for_pipeline(kind: str, plan: Mapping[str, Mapping[str, object]], validation_within_epoch: bool) -> None:
    """One-line BadInput when the plan's kernels make the pipeline train or evaluate
    wrongly. The plan is the same on every rank, so every rank refuses alike.

    - semi_sync: every table must be on the fused or fused_uvm kernel. With a cache
      (fused_uvm_caching), forward(i+1) and backward(i) share one set of cache
      locations.
    - prefetch with validation within the epoch: after batch i the training pipeline
      has prefetched batch i+1 into the cache, and FBGEMM hands those cache locations
      to the next forward it runs, i.e. validation's first batch (wrong rows; the
      locked cache lines are never released). A flush cannot undo that (FBGEMM's
      flush writes rows back, its reset forgets the cache, neither drops the queued
      locations), so such runs are refused; validation at epoch end is safe (the
      pipeline has drained).

    Args:
        kind: the pipeline (--pipeline).
        plan: {table: {"compute_kernel": ..., ...}} (`sharding_plans.plan_summary`).
        validation_within_epoch: whether --validation_freq_within_epoch is set.

    Example::

        check_plan_for_pipeline("semi_sync", plan_summary(plan), False)
    """
    kernels: dict[str, str] = {table: str(p["compute_kernel"]) for table, p in plan.items()}
    if kind == "semi_sync":
        bad = {t: k for t, k in kernels.items() if k not in SEMI_SYNC_KERNELS}
        if bad:
            raise BadInput(
                "--pipeline semi_sync runs forward(i+1) before the embedding backward of batch i and needs "
                f"every table on the fused or fused_uvm kernel; the plan has {_describe(bad)} "
                "(pass --compute_kernel fused or fused_uvm, or use --pipeline sparse_dist)"
            )
    if kind == "prefetch" and validation_within_epoch:
        cached = {t: k for t, k in kernels.items() if k not in UNCACHED_KERNELS}
        if cached:
            raise BadInput(
                "--pipeline prefetch with --validation_freq_within_epoch: validation would run on the "
                f"cache locations prefetched for the next training batch ({_describe(cached)}); "
                "validate at epoch end only, or use --pipeline sparse_dist"
            )


def _describe(kernels: Mapping[str, str]) -> str:
    """Tables grouped by kernel: ``t_cat_0, t_cat_3 on fused_uvm_caching; t_cat_1 on dense``."""
    by_kernel: dict[str, list] = {}
    for table, kernel in kernels.items():
        by_kernel.setdefault(kernel, []).append(table)
    return "; ".join(f"{', '.join(tables)} on {kernel}" for kernel, tables in sorted(by_kernel.items()))


def release_cache_line_locks(model: nn.Module) -> int:
    """Unlocks every cache line of the FBGEMM kernels in ``model`` that lock them
    (built with ``prefetch_pipeline=True``, with a UVM cache); returns how many kernels.

    Such a kernel locks the cache lines a forward hits or fills
    (``lxu_cache_locking_counter`` + 1) and only its backward pre-hook unlocks them.
    A forward without backward (evaluation, the feature-order probe) leaves them
    locked for good: after a few evaluations the cache is frozen and training reads
    UVM, silently. Call it when no training batch is between its forward and its
    backward, i.e. after such forwards, with the train pipeline drained or not
    prefetching ahead (`check_plan_for_pipeline` refuses the one plan where it would
    be: prefetch, a cache and validation within the epoch). torchrec resets the same
    counter this way when it restores a stashed cache (``memory_stashing.py``).

    Example::

        trainer.evaluate("validation")
        release_cache_line_locks(dmp)
    """
    released = 0
    for module in model.modules():
        # A sharded collection keeps its lookups (and their FBGEMM kernels) in a plain
        # list, out of ``modules()``.
        for lookup in getattr(module, "_lookups", ()):
            for kernel in lookup.modules():
                if (
                    isinstance(kernel, SplitTableBatchedEmbeddingBagsCodegen)
                    and kernel.prefetch_pipeline
                    and kernel.lxu_cache_locking_counter.numel() > 0
                ):
                    kernel.lxu_cache_locking_counter.zero_()
                    released += 1
    return released


def prefetched_context(pipeline: PrefetchTrainPipelineSparseDist, prefetched: Any) -> Any | None:
    """The context ``pipeline._prefetch(prefetched)`` left the prefetched inputs in, None
    when it prefetched nothing: torchrec 1.8 and 1.9 hand ``_prefetch`` the batch's
    context, 1.6 the batch itself (None past the last one) and keep one context,
    ``pipeline._context``.

    Example::

        prefetched_context(pipeline, context) is context  # torchrec 1.8, 1.9
    """
    if isinstance(prefetched, PrefetchTrainPipelineContext):
        return prefetched
    if prefetched is None:
        return None
    return pipeline._context


class FencedPrefetchPipeline(PrefetchTrainPipelineSparseDist):
    """torchrec's prefetch pipeline with each input dist ordered after the prefetch
    queued before it.

    torchrec 1.6.1, 1.8.0 and 1.9.2 start the input all-to-all of batch i+2 (of batch 1
    while filling) on the data-dist stream while the prefetch of batch i+1 may still run
    on the prefetch stream, and tell the allocator only about the prefetch and forward
    streams' use of the prefetched inputs: garbage embeddings or an illegal memory
    access on UVM-cached tables (upstream fix: torchrec PR 4191, not in a release).
    Here the data-dist stream waits for the prefetch stream (a GPU-side dependency,
    no host wait) and the prefetched inputs are recorded on the data-dist stream.
    Without streams (CPU) it is torchrec's pipeline unchanged.

    The hooks differ by release: 1.8 and 1.9 start an input dist with
    ``start_sparse_data_dist(batch, context)`` and prefetch with ``_prefetch(context)``;
    1.6's prefetch pipeline calls its own ``_start_sparse_data_dist(batch)`` and
    ``_prefetch(batch)``. Both are fenced (a release that routes one through the other
    fences twice, which orders nothing more).

    Example::

        pipeline = FencedPrefetchPipeline(dmp, optimizer, torch.device("cuda", 0))
    """

    def _fence_input_dist(self) -> None:
        """Orders the input dist about to start after every prefetch queued so far."""
        if self._prefetch_stream is not None and self._data_dist_stream is not None:
            self._data_dist_stream.wait_stream(self._prefetch_stream)

    def start_sparse_data_dist(self, batch, context: TrainPipelineContext) -> None:  # torchrec >= 1.8
        self._fence_input_dist()
        super().start_sparse_data_dist(batch, context)

    def _start_sparse_data_dist(self, batch) -> None:  # torchrec 1.6's prefetch pipeline
        self._fence_input_dist()
        super()._start_sparse_data_dist(batch)

    def _prefetch(self, prefetched) -> None:  # a context (torchrec >= 1.8) or a batch (1.6)
        super()._prefetch(prefetched)
        self._record_prefetched_on_data_dist(prefetched_context(self, prefetched))

    def _record_prefetched_on_data_dist(self, context: Any | None) -> None:
        """The next input dist runs on the data-dist stream while the prefetched inputs
        wait for their forward: the allocator must not reuse them meanwhile."""
        if context is None or self._data_dist_stream is None:
            return
        for prefetched in (
            *context.module_input_post_prefetch.values(),
            *context.module_contexts_post_prefetch.values(),
        ):
            prefetched.record_stream(self._data_dist_stream)


class ScheduledSemiSyncPipeline(TrainPipelineSemiSync):
    """torchrec's semi_sync pipeline with the tables' fused update at the schedule's
    rate for its own step.

    FBGEMM's fused optimizers take the param groups' rate when the optimizer's
    ``zero_grad`` or ``step`` runs (torchrec's ``EmbeddingFusedOptimizer``), and the
    learning-rate schedule sets it before the step's ``progress``. The other pipelines
    call ``zero_grad`` first, then backward; semi_sync runs the embedding backward
    first and ``step``/``zero_grad`` after it, so its tables trained at the previous
    step's rate. Here the fused optimizers take the rate just before the embedding
    backward (their ``zero_grad`` touches no gradient).

    Example::

        pipeline = ScheduledSemiSyncPipeline(dmp, optimizer, torch.device("cuda", 0))
    """

    def embedding_backward(self, context) -> None:
        fused = getattr(self._model, "fused_optimizer", None)
        if fused is not None:
            fused.zero_grad()  # sets each table's learning rate; no gradient is involved
        super().embedding_backward(context)


def semi_sync_start_after(start_batch: int, steps_done: int) -> int:
    """The start batch to give a new semi_sync pipeline when ``steps_done`` training
    steps have run (a resumed run): its batch count starts at 0, ``--semi_sync_start_batch``
    counts the run's steps.

    Example::

        semi_sync_start_after(900, 1000)  # 0: semi-synchronous from the first step
    """
    return max(0, start_batch - steps_done)


def autocast_forward(model: nn.Module, device: torch.device) -> Callable[..., tuple[torch.Tensor, object]]:
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

        pipeline = RestartingTrainPipelineBase(AutocastModel(dmp, device), optimizer, device)
    """

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.module = model
        self._forward = autocast_forward(model, device)

    @property
    def training(self) -> bool:
        return self.module.training

    def __call__(self, batch) -> tuple[torch.Tensor, object]:
        return self._forward(batch)


class RestartingTrainPipelineBase(TrainPipelineBase):
    """TorchRec's base pipeline, started afresh whenever it is handed a new iterator.

    `TrainPipelineBase` remembers that its iterator ended, and the batch it fetched
    ahead, until ``reset()``: handed the next epoch's iterator it raises StopIteration
    at once, so every epoch after the first trained nothing. `TrainPipelineSparseDist`
    and its subclasses already start over on a new iterator (their ``_next_batch``
    compares it with the last one); this does the same, so the trainer treats every
    pipeline alike. An iterator is never resumed after another one replaced it, so
    the batch fetched ahead from the old one is dropped with it.

    Example::

        pipeline = RestartingTrainPipelineBase(dmp, optimizer, torch.device("cpu"))
        for epoch in range(2):
            batches = iter(loader)
            ...pipeline.progress(batches) until StopIteration...
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        super().__init__(model, optimizer, device)
        self._iterator: Iterator | None = None

    def progress(self, dataloader_iter: Iterator):
        if dataloader_iter is not self._iterator:
            self.reset()
            self._iterator = dataloader_iter
        return super().progress(dataloader_iter)


def check_validation_handover(
    kind: str, world_size: int, histories: bool, within_epoch: bool, zch: bool = False
) -> None:
    """One-line BadInput for validation inside an epoch of a model with history features
    (--sequence_columns) on several ranks under a pipeline that holds the next batch.

    Mid-epoch the pipeline is detached for validation and attached again, and torchrec
    1.8's attach starts the held batch's input all-to-all a second time. The
    EmbeddingCollection's output all-to-all is sized by the ids each rank sent, so the
    ranks then disagree: gloo fails with ``in->size == out->size`` or the ranks wait on
    each other (the correctness matrix, 2 ranks; one rank, and validation at the
    epoch's end, are unaffected). zch's managed-collision modules (--id_hashing zch) size
    their all-to-all by the ids sent as well, and fail the same way.

    Example::

        check_validation_handover("sparse_dist", 2, histories=True, within_epoch=True)  # raises
    """
    if within_epoch and (histories or zch) and world_size > 1 and kind != "base":
        what, ids = ("--sequence_columns", "history ids") if histories else ("--id_hashing zch", "ids")
        raise BadInput(
            f"--validation_freq_within_epoch with {what} on {world_size} ranks: the {kind} "
            f"pipeline's handover to validation resends the held batch's {ids} (torchrec 1.8), "
            "and the ranks' all-to-all sizes disagree; validate at the epoch's end "
            "(no --validation_freq_within_epoch) or use --pipeline base"
        )


def build_pipeline(
    kind: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    amp: bool = False,
    semi_sync_start_batch: int = SEMI_SYNC_START_BATCH,
) -> TrainPipeline:
    """A pipeline of the given kind over ``model``; with ``amp`` the forward runs under
    bf16 autocast; semi_sync is semi-synchronous from ``semi_sync_start_batch`` on.

    Example::

        pipeline = build_pipeline("sparse_dist", dmp, optimizer, torch.device("cpu"))
        loss, logits, labels = pipeline.progress(iter(loader))
    """
    check_pipeline_supported(kind, device)
    if kind == "base":
        called = AutocastModel(model, device) if amp else model
        return RestartingTrainPipelineBase(called, optimizer, device)  # type: ignore[arg-type]
    forward: Callable | None = autocast_forward(model, device) if amp else None
    if kind == "semi_sync":
        return ScheduledSemiSyncPipeline(
            model,
            optimizer,
            device,
            execute_all_batches=True,
            start_batch=semi_sync_start_batch,
            custom_model_fwd=forward,
        )
    cls = {"sparse_dist": TrainPipelineSparseDist, "prefetch": FencedPrefetchPipeline}[kind]
    return cls(model, optimizer, device, execute_all_batches=True, custom_model_fwd=forward)


def cpu_has_bf16_units() -> bool:
    """Whether this CPU does bf16 arithmetic in hardware: AVX-512 BF16 or AMX on x86,
    the BF16 extension on Arm (oneDNN's own check there). Without them oneDNN emulates
    bf16 matmuls on fp32 units, slower than fp32 itself."""
    if platform.machine().lower() in ("x86_64", "amd64"):
        return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def check_compile_supported(compile: bool) -> None:
    """One-line BadInput for --compile without the C++ compiler Inductor (torch.compile's
    backend) builds its CPU kernels with (Triton's launchers on CUDA need one too);
    without it the first step would fail deep inside the compiler."""
    if not compile:
        return
    from torch._inductor.cpp_builder import get_cpp_compiler
    from torch._inductor.exc import InvalidCxxCompiler

    try:
        get_cpp_compiler()
    except InvalidCxxCompiler:
        raise BadInput(
            "--compile: torch.compile's Inductor needs a C++ compiler and found none ($CXX, g++, ...): "
            "install g++ (the Debian package g++) or leave out --compile"
        ) from None


def check_dense_precision(precision: str, device: torch.device, has_bf16_units: bool) -> None:
    """One-line BadInput for bf16 autocast on a CPU that would run it slower than fp32.

    Example::

        check_dense_precision(config.dense_precision, env.device, cpu_has_bf16_units())
    """
    if precision == "bf16" and device.type == "cpu" and not has_bf16_units:
        raise BadInput(
            "--dense_precision bf16 (--amp) on a CPU without bf16 units (AVX-512 BF16, AMX or Arm "
            "BF16): its bf16 matmuls are emulated and slower than fp32; leave --dense_precision at fp32"
        )
