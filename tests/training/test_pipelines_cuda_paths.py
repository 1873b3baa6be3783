"""Decisions the CUDA paths make, tested on CPU: the pipelines' mixed precision, the
checkpoint's RNG state, the sharders' prefetch parameter, the refusals of cached
tables under pipelines that cannot keep them consistent, the cache-line locks no-grad
forwards leave, the prefetch pipeline's stream order, plan files that turn locking
off, semi_sync on resume, evaluation under --amp's autocast, the order of table
initialisation and the feature-order probe, and the install script's device checks."""

import dataclasses
import inspect
import os
import random
import re

import pytest
import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.datasets.utils import Batch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
from torchrec.distributed.train_pipeline.train_pipelines import PrefetchTrainPipelineSparseDist
from torchrec.distributed.types import CacheParams, ShardingEnv, ShardingPlan
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from checkpoints.state import rng_state, set_rng_state
from common.errors import BadInput
from models import build_dlrm_train
from sharding_plans import PlannerConfig, build_sharders, plan_summary
from sharding_plans.dry_run import plan_request
from sharding_plans.plan_check import PlanMismatchError
from sharding_plans.plan_file import write_plan
from sharding_plans.planner import plan_with_estimates
from sharding_plans.setup import prepare_sharding as prepare_sharding_setup
from sharding_plans.sharders import RowSplitsOnCpuSharder
from sharding_plans.types import PlanRequest
from training.config import PIPELINES
from training.distributed import DistributedEnv
from training.flags import parse_config
from training.pipelines import (
    FencedPrefetchPipeline,
    ScheduledSemiSyncPipeline,
    build_pipeline,
    check_pipeline_supported,
    check_plan_for_pipeline,
    prefetched_context,
    release_cache_line_locks,
    semi_sync_start_after,
)
from training.sharding import prepare_sharding


class AutocastProbe(nn.Module):
    """A one-layer model that records, on each real (untraced) forward, whether CPU
    autocast was on and the dtype its matmul produced."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.seen = []

    def forward(self, batch: Batch):
        logits = self.linear(batch.dense_features).squeeze(-1)
        if isinstance(logits, torch.Tensor):  # not the train pipeline's fx trace
            self.seen.append((torch.is_autocast_enabled("cpu"), logits.dtype))
        loss = nn.functional.binary_cross_entropy_with_logits(logits.float(), batch.labels)
        return loss, (loss.detach(), logits.detach(), batch.labels)


def _run_to_end(pipeline, batches) -> int:
    """Steps ``pipeline`` through ``batches`` to their end; the number of steps."""
    steps = 0
    while True:
        try:
            pipeline.progress(batches)
        except StopIteration:
            return steps
        steps += 1


def _batches(count: int):
    for _ in range(count):
        kjt = KeyedJaggedTensor(
            keys=["f"], values=torch.zeros(2, dtype=torch.int64), lengths=torch.ones(2, dtype=torch.int32)
        )
        yield Batch(dense_features=torch.randn(2, 4), sparse_features=kjt, labels=torch.ones(2))


@pytest.mark.parametrize("kind", ["base", "sparse_dist"])
@pytest.mark.parametrize("amp", [False, True])
def test_amp_runs_the_forward_under_bf16_autocast_in_every_pipeline(kind, amp):
    """torchrec's base pipeline ignores custom_model_fwd: --pipeline base --amp must
    still run the forward under bf16 autocast, and still train (backward + step)."""
    torch.manual_seed(0)
    model = AutocastProbe()
    before = model.linear.weight.detach().clone()
    pipeline = build_pipeline(kind, model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"), amp)
    steps = _run_to_end(pipeline, _batches(3))
    expected = (True, torch.bfloat16) if amp else (False, torch.float32)
    assert steps == 3 and model.seen == [expected] * 3
    assert not torch.equal(before, model.linear.weight)
    assert not torch.is_autocast_enabled("cpu")  # autocast ends with the forward


def test_checkpoint_rng_state_holds_this_process_generators_only(tmp_path):
    """The per-rank RNG file holds the CPU and Python generators, and on CUDA the
    current device's generator alone (not every visible GPU's): a resume on a host
    showing fewer GPUs must load it."""
    state = rng_state()
    if torch.cuda.is_available():
        assert set(state) == {"torch", "python", "cuda"}
        assert torch.equal(state["cuda"], torch.cuda.get_rng_state())
    else:
        assert set(state) == {"torch", "python"}
    torch.save(state, tmp_path / "rank_0.pt")
    expected = (torch.rand(3), random.random())
    set_rng_state(torch.load(tmp_path / "rank_0.pt", weights_only=True))  # as a resume reads it
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_checkpoint_cuda_rng_state_restores_on_the_current_device():
    state = rng_state()
    expected = torch.rand(3, device="cuda")
    set_rng_state(state)
    assert torch.equal(torch.rand(3, device="cuda"), expected)


TINY_RUN = [
    "--num_embeddings",
    "50",
    "--embedding_dim",
    "4",
    "--dense_arch_layer_sizes",
    "8,4",
    "--over_arch_layer_sizes",
    "8,1",
    "--batch_size",
    "4",
    "--limit_train_batches",
    "1",
    "--limit_val_batches",
    "1",
    "--limit_test_batches",
    "1",
    "--seed",
    "3",
]


@pytest.fixture
def one_process(monkeypatch):
    """A single-process run in this process (its own in-memory process group)."""
    import torch.distributed as dist

    for name in ("MASTER_ADDR", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_feature_order_probe_sees_the_seeded_tables(one_process, monkeypatch):
    """The probe lookup loads row 0 of every table into a UVM cache: it must run after
    the seeded initialisation, so the cache never holds torchrec's own init."""
    import training.trainer as trainer_module
    from training.distributed import resolve_env
    from training.embedding_init import _local_pieces, table_values

    config = parse_config(TINY_RUN, "dlrm_main.py", "")
    rows, dim = config.model.num_embeddings_per_feature[0], config.model.embedding_dim
    seen = []
    real_probe = trainer_module.align_to_sharded_embeddings

    def probe_after_init(model, device):
        weights = {k.split(".")[-2]: v for k, v in model.state_dict().items() if k.endswith(".weight")}
        first = config.model.table_names[0]
        ((local, _, _),) = _local_pieces(weights[first])  # one rank: the whole table
        seen.append(torch.equal(local, table_values(config.seed, 0, rows, (0, rows), (0, dim))))
        return real_probe(model, device)

    monkeypatch.setattr(trainer_module, "align_to_sharded_embeddings", probe_after_init)
    trainer_module.Trainer(config, resolve_env("cpu"))
    assert seen == [True]


CPU_ENV = DistributedEnv(
    rank=0, world_size=1, local_rank=0, local_world_size=1, device=torch.device("cpu"), backend="gloo"
)


def _ebc_sharder(sharders):
    (sharder,) = [s for s in sharders if isinstance(s, EmbeddingBagCollectionSharder)]
    return sharder


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("row_split", [False, True])
def test_sharders_lock_cache_lines_under_the_prefetch_pipeline_only(pipeline, row_split):
    """--pipeline prefetch hands planner and DistributedModelParallel sharders with
    prefetch_pipeline=True (FBGEMM's cache-line locking); other pipelines don't."""
    extra = ["--sharding_type", "t_cat_0=row_wise"] if row_split else []
    config = parse_config(TINY_RUN + ["--pipeline", pipeline, *extra], "dlrm_main.py", "")
    model = build_dlrm_train(config.model, dense_device=torch.device("cpu"))
    sharder = _ebc_sharder(prepare_sharding(config, CPU_ENV, model).sharders)
    assert isinstance(sharder, RowSplitsOnCpuSharder) == row_split
    assert sharder.fused_params == ({"prefetch_pipeline": True} if pipeline == "prefetch" else None)


def _sharded_ebc(prefetch: bool) -> DistributedModelParallel:
    """One fused table, sharded on CPU with the sharders a run with or without
    --pipeline prefetch gets (needs the process group of `one_process`)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=10, feature_names=["f"])],
        device=torch.device("meta"),
    )
    plan = construct_module_sharding_plan(
        ebc, {"t": table_wise(rank=0, compute_kernel="fused")}, world_size=1, device_type="cpu"
    )
    return DistributedModelParallel(
        ebc,
        device=torch.device("cpu"),
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        plan=ShardingPlan({"": plan}),
        sharders=build_sharders(prefetch_pipeline=prefetch),
    )


def _kernels(dmp: DistributedModelParallel) -> list:
    return [m.emb_module for lookup in dmp.module._lookups for m in lookup._emb_modules]


@pytest.mark.parametrize("prefetch", [False, True])
def test_prefetch_pipeline_reaches_the_fbgemm_kernel(one_process, prefetch):
    """The sharders' fused parameter is what FBGEMM's kernel is built with."""
    assert [k.prefetch_pipeline for k in _kernels(_sharded_ebc(prefetch))] == [prefetch]


@pytest.mark.parametrize("prefetch", [False, True])
def test_cache_lines_locked_by_no_grad_forwards_are_released(one_process, prefetch):
    """FBGEMM has no cache on CPU (its locking counter is empty here): the counter is
    set to what a CUDA kernel with a cache holds after evaluation batches (lines
    locked by forwards that had no backward). The locking kernel's counter is zeroed;
    a kernel that does not lock is left alone; a kernel without a cache is skipped."""
    dmp = _sharded_ebc(prefetch)
    (kernel,) = _kernels(dmp)
    assert kernel.lxu_cache_locking_counter.numel() == 0
    assert release_cache_line_locks(dmp) == 0
    kernel.lxu_cache_locking_counter = torch.full((4, 32), 3, dtype=torch.int32)  # 4 cache sets of 32 ways
    assert release_cache_line_locks(dmp) == int(prefetch)
    assert torch.equal(kernel.lxu_cache_locking_counter, torch.full((4, 32), 0 if prefetch else 3, dtype=torch.int32))


def _plan(**kernels: str) -> dict:
    return {
        table: {"sharding_type": "table_wise", "compute_kernel": kernel, "shards": []}
        for table, kernel in kernels.items()
    }


@pytest.mark.parametrize(
    "pipeline, plan, within_epoch, refusal",
    [
        ("semi_sync", _plan(a="fused", b="fused_uvm"), True, None),
        (
            "semi_sync",
            _plan(a="fused", b="fused_uvm_caching", c="fused_uvm_caching"),
            False,
            "--pipeline semi_sync runs forward(i+1) before the embedding backward of batch i and needs every table "
            "on the fused or fused_uvm kernel; the plan has b, c on fused_uvm_caching "
            "(pass --compute_kernel fused or fused_uvm, or use --pipeline sparse_dist)",
        ),
        ("semi_sync", _plan(a="dense", b="key_value"), False, "the plan has a on dense; b on key_value"),
        (
            "prefetch",
            _plan(a="fused_uvm_caching", b="dense"),
            True,
            "--pipeline prefetch with --validation_freq_within_epoch: validation would run on the cache locations "
            "prefetched for the next training batch (a on fused_uvm_caching); validate at epoch end only, "
            "or use --pipeline sparse_dist",
        ),
        ("prefetch", _plan(a="fused_uvm_caching"), False, None),  # epoch-end validation: the pipeline has drained
        ("prefetch", _plan(a="fused", b="fused_uvm", c="dense"), True, None),  # no cache
        ("sparse_dist", _plan(a="fused_uvm_caching"), True, None),
        ("base", _plan(a="fused_uvm_caching"), True, None),
    ],
)
def test_pipelines_refuse_plans_whose_caches_they_would_corrupt(pipeline, plan, within_epoch, refusal):
    if refusal is None:
        check_plan_for_pipeline(pipeline, plan, within_epoch)
    else:
        with pytest.raises(BadInput) as e:
            check_plan_for_pipeline(pipeline, plan, within_epoch)
        assert refusal in str(e.value) and "\n" not in str(e.value)


def test_semi_sync_refuses_the_cache_the_planner_picks_when_hbm_runs_short():
    """Planned for 2 GPUs of 64 MiB (a plan for hardware this machine does not have),
    the 26 tables do not fit in HBM: the planner chooses fused_uvm_caching by itself,
    which semi_sync refuses; with enough HBM the plan is fused and accepted."""
    config = parse_config(
        [
            "--num_embeddings",
            "100000",
            "--embedding_dim",
            "16",
            "--dense_arch_layer_sizes",
            "8,16",
            "--over_arch_layer_sizes",
            "8,1",
        ],
        "dlrm_main.py",
        "",
    )
    model = build_dlrm_train(config.model, dense_device=torch.device("meta"))
    kernels = {}
    for hbm in (64 * 2**20, 2**30):
        plan, _ = plan_with_estimates(
            model,
            build_sharders(),
            PlannerConfig(world_size=2, local_world_size=2, compute_device="cuda", batch_size=512, hbm_cap_bytes=hbm),
        )
        kernels[hbm] = plan_summary(plan)
    assert "fused_uvm_caching" in {p["compute_kernel"] for p in kernels[64 * 2**20].values()}
    with pytest.raises(BadInput, match="on fused_uvm_caching"):
        check_plan_for_pipeline("semi_sync", kernels[64 * 2**20], False)
    assert {p["compute_kernel"] for p in kernels[2**30].values()} <= {"fused", "dense"}


def test_semi_sync_start_batch_flag(capsys):
    assert parse_config(TINY_RUN, "dlrm_main.py", "").semi_sync_start_batch == 900  # torchrec's default
    config = parse_config(TINY_RUN + ["--pipeline", "semi_sync", "--semi_sync_start_batch", "0"], "dlrm_main.py", "")
    assert config.semi_sync_start_batch == 0
    with pytest.raises(SystemExit) as e:
        parse_config(TINY_RUN + ["--semi_sync_start_batch", "-1"], "dlrm_main.py", "")
    assert e.value.code == 2
    assert capsys.readouterr().err == "dlrm_main.py: error: --semi_sync_start_batch must be 0 or more, got -1\n"


def _tiny_plan_file(tmp_path, device: str, kernel: str, prefetch_pipeline) -> str:
    """A plan file for TINY_RUN's tables on one rank of ``device``: every table
    table-wise on ``kernel``, with ``cache_params.prefetch_pipeline`` set to
    ``prefetch_pipeline`` (None: no cache_params)."""
    model = parse_config(TINY_RUN, "dlrm_main.py", "").model
    saved = plan_request(
        PlanRequest(
            model.sparse_feature_names,
            model.num_embeddings_per_feature,
            model.embedding_dim,
            "fp32",
            "sgd",
            PlannerConfig(
                world_size=1,
                local_world_size=1,
                compute_device=device,
                batch_size=4,
                hbm_cap_bytes=2**30,
                ddr_cap_bytes=2**32,
            ),
        )
    )
    for ps in next(iter(saved.plan.plan.values())).values():  # type: ignore[union-attr]
        ps.compute_kernel = kernel
        ps.cache_params = None if prefetch_pipeline is None else CacheParams(prefetch_pipeline=prefetch_pipeline)
    path = str(tmp_path / "plan.json")
    write_plan(path, saved)
    return path


def test_evaluation_releases_the_cache_lines_it_locks(one_process, tmp_path):
    """A plan file that asks for cache-line locking gives kernels that lock (on CPU
    too, minus the cache). Each locking kernel's counter is set to what CUDA forwards
    without backward leave; after an evaluation every one is back to 0."""
    import training.trainer as trainer_module
    from training.distributed import resolve_env

    config = parse_config(
        TINY_RUN + ["--sharding_plan", _tiny_plan_file(tmp_path, "cpu", "fused", True)], "dlrm_main.py", ""
    )
    trainer = trainer_module.Trainer(config, resolve_env("cpu"))
    kernels = [
        k
        for lookup in trainer.model.module.model.sparse_arch.embedding_bag_collection._lookups
        for k in lookup.modules()
        if getattr(k, "prefetch_pipeline", False)
    ]
    assert kernels
    for kernel in kernels:
        kernel.lxu_cache_locking_counter = torch.full((4, 32), 2, dtype=torch.int32)
    trainer.evaluate("validation")
    assert all(not k.lxu_cache_locking_counter.any() for k in kernels)


@pytest.mark.parametrize(
    "prefetch_pipeline, pipeline_prefetches, refused",
    [
        (False, True, True),
        (False, False, False),  # no prefetching pipeline: locking is not needed
        (True, True, False),
        (None, True, False),  # unset: the sharders' prefetch_pipeline=True holds
    ],
)
def test_plan_file_cannot_turn_cache_line_locking_off_under_prefetch(
    tmp_path, prefetch_pipeline, pipeline_prefetches, refused
):
    """A plan's cache_params.prefetch_pipeline replaces the sharders' fused parameter
    (torchrec distributed/utils.py): false would switch locking off under --pipeline
    prefetch, so such a plan file is refused, one line naming the file and table."""
    path = _tiny_plan_file(tmp_path, "cuda", "fused_uvm_caching", prefetch_pipeline)
    config = parse_config(TINY_RUN, "dlrm_main.py", "")
    model = build_dlrm_train(config.model, dense_device=torch.device("meta"))

    def prepare():
        return prepare_sharding_setup(
            model,
            config.model.table_names,
            4,
            "fp32",
            torch.device("cuda"),
            1,
            1,
            plan_path=path,
            prefetch_pipeline=pipeline_prefetches,
        )

    if not refused:
        assert prepare().loaded_plan is not None
        return
    with pytest.raises(PlanMismatchError) as e:
        prepare()
    assert str(e.value) == (
        f"{path}: table t_cat_0 (fused_uvm_caching) sets cache_params.prefetch_pipeline false, "
        "which turns off the cache-line locking the prefetch pipeline needs: set it true or "
        "remove it"
    )


def test_prefetch_pipeline_orders_input_dist_after_prefetch_while_torchrec_does_not():
    """torchrec 1.6.1's, 1.8.0's and 1.9.2's prefetch pipeline starts the input dist of batch
    i+2 with no wait on the prefetch stream (upstream PR 4191, open): --pipeline prefetch
    uses `FencedPrefetchPipeline`. This is the one place that checks the pinned torchrec:
    when it fails, torchrec orders the streams itself and the subclass can go."""
    upstream = inspect.getsource(PrefetchTrainPipelineSparseDist)
    assert "wait_stream(self._prefetch_stream)" not in upstream and "_fence_prefetch" not in upstream
    fenced = inspect.getsource(FencedPrefetchPipeline._fence_input_dist)
    assert "self._data_dist_stream.wait_stream(self._prefetch_stream)" in fenced
    assert "FencedPrefetchPipeline}[kind]" in inspect.getsource(build_pipeline)


class FenceLog(FencedPrefetchPipeline):
    """The fenced pipeline, logging each fence and each prefetch's recorded context."""

    def __init__(self, *args, log: list, **kwargs) -> None:
        self.log = log
        super().__init__(*args, **kwargs)

    def _fence_input_dist(self) -> None:
        self.log.append("fence")
        super()._fence_input_dist()

    def _record_prefetched_on_data_dist(self, context) -> None:
        if context is not None:
            self.log.append("prefetched")
        super()._record_prefetched_on_data_dist(context)


def test_every_input_dist_of_the_pinned_torchrec_passes_the_fence(monkeypatch):
    """Whatever hook this torchrec's prefetch pipeline starts an input dist with
    (1.8, 1.9: ``start_sparse_data_dist(batch, context)``; 1.6: its own
    ``_start_sparse_data_dist(batch)``), the fence comes first, and every prefetch's
    inputs are recorded (1.6 passes ``_prefetch`` the batch, 1.8 and 1.9 the context).
    Run by each stack's CI leg against its own torchrec."""
    import torchrec.distributed.train_pipeline.train_pipelines as upstream

    log: list = []
    start_data_dist = upstream._start_data_dist

    def logged_start_data_dist(pipelined_modules, batch, *args, **kwargs):
        log.append(("input dist", batch))
        return start_data_dist(pipelined_modules, batch, *args, **kwargs)

    monkeypatch.setattr(upstream, "_start_data_dist", logged_start_data_dist)
    model = AutocastProbe()
    pipeline = FenceLog(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"), log=log)
    steps = _run_to_end(pipeline, _streamless_batches(4))
    dists = [at for at, event in enumerate(log) if isinstance(event, tuple)]
    # every batch's input dist started (1.6.1 starts the first one twice while filling)
    assert steps == 4 and len({id(log[at][1]) for at in dists}) == 4, log
    assert all(log[at - 1] == "fence" for at in dists), log
    assert log.count("prefetched") == 4, log


def test_prefetched_context_follows_the_torchrec_layout():
    """torchrec 1.8/1.9 hand ``_prefetch`` a context, 1.6 a batch (its prefetched inputs
    in the pipeline's one context) or None past the last batch."""
    from torchrec.distributed.train_pipeline.pipeline_context import PrefetchTrainPipelineContext

    model = AutocastProbe()
    pipeline = FencedPrefetchPipeline(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"))
    own = PrefetchTrainPipelineContext()
    pipeline._context = own  # 1.6.1's single context (1.8 keeps one too, for its deprecated path)
    handed = PrefetchTrainPipelineContext()
    assert prefetched_context(pipeline, handed) is handed
    assert prefetched_context(pipeline, next(_batches(1))) is own
    assert prefetched_context(pipeline, None) is None


def test_semi_sync_tables_train_at_their_own_step_rate(one_process):
    """The schedule sets the step's rate before ``progress``; FBGEMM's fused kernels take
    it at the optimizer's ``zero_grad``/``step``, which semi_sync runs after the
    embedding backward: `ScheduledSemiSyncPipeline` hands it over just before. (torchrec's
    semi_sync needs CUDA streams to run whole; its embedding backward is called here.)"""
    from torchrec.distributed.train_pipeline.pipeline_context import EmbeddingTrainPipelineContext
    from torchrec.optim.keyed import CombinedOptimizer

    dmp = _sharded_ebc(prefetch=False)
    (kernel,) = _kernels(dmp)
    optimizer = CombinedOptimizer([dmp.fused_optimizer])
    pipeline = ScheduledSemiSyncPipeline(dmp, optimizer, torch.device("cpu"), execute_all_batches=True)
    for lr in (0.5, 0.125):
        for group in optimizer.param_groups:
            group["lr"] = lr  # what training/lr_schedule.py's apply does before the step
        assert kernel.get_learning_rate() != lr
        pipeline.embedding_backward(EmbeddingTrainPipelineContext())
        assert kernel.get_learning_rate() == lr
    assert re.search(r"ScheduledSemiSyncPipeline\(\s*model", inspect.getsource(build_pipeline))


@pytest.mark.parametrize(
    "torchrec_version, world_size, refused",
    [
        ("1.6.1", 2, True),
        ("1.8.0", 8, True),
        ("1.8.0", 1, False),
        ("1.9.2", 8, False),
        ("1.10.0", 2, False),
        ("1.9.0.dev20251101+cu130", 2, False),
    ],
)
def test_semi_sync_above_one_gpu_needs_torchrec_1_9(torchrec_version, world_size, refused):
    """Before torchrec 1.9 (PR 4497) semi_sync's embedding lookup is not ordered after
    the input all-to-all it reads: refused above one GPU, in one line."""
    cuda = torch.device("cuda", 0)
    if not refused:
        check_pipeline_supported("semi_sync", cuda, world_size, torchrec_version)
        check_pipeline_supported("sparse_dist", cuda, world_size, torchrec_version)
        return
    with pytest.raises(BadInput) as e:
        check_pipeline_supported("semi_sync", cuda, world_size, torchrec_version)
    assert str(e.value) == (
        f"--pipeline semi_sync on {world_size} GPUs needs torchrec 1.9 or newer (torchrec "
        f"{torchrec_version} looks embeddings up before their input all-to-all is done): use "
        "the torch2.14 stack, one GPU, or --pipeline sparse_dist"
    )
    check_pipeline_supported("prefetch", cuda, world_size, torchrec_version)  # only semi_sync


class StreamlessBatch(Batch):
    """A batch that skips CPU streams when recorded on one: torchrec 1.6.1's prefetch
    pipeline records the batch on the current stream even on CPU, where a tensor's
    ``record_stream`` refuses a CPU stream (1.8 and 1.9 do not record it there)."""

    def record_stream(self, stream) -> None:
        if not isinstance(stream, torch.cpu.Stream):
            super().record_stream(stream)

    def to(self, device: torch.device, non_blocking: bool = False) -> "StreamlessBatch":
        moved = super().to(device, non_blocking)
        return StreamlessBatch(moved.dense_features, moved.sparse_features, moved.labels)


def _streamless_batches(count: int):
    for batch in _batches(count):
        yield StreamlessBatch(batch.dense_features, batch.sparse_features, batch.labels)


def test_fenced_prefetch_pipeline_without_streams_trains_as_torchrec():
    """On CPU (no streams) the fence is skipped: same steps and weights as torchrec's."""
    weights = []
    for cls in (PrefetchTrainPipelineSparseDist, FencedPrefetchPipeline):
        torch.manual_seed(0)
        model = AutocastProbe()
        pipeline = cls(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"))
        batches = _streamless_batches(3)
        torch.manual_seed(1)
        _run_to_end(pipeline, batches)
        weights.append((len(model.seen), model.linear.weight.detach().clone()))
    assert weights[0][0] == weights[1][0] == 3 and torch.equal(weights[0][1], weights[1][1])


@pytest.mark.parametrize(
    "start_batch, steps_done, expected",
    [
        (900, 0, 900),
        (900, 300, 600),
        (900, 900, 0),
        (900, 5000, 0),
        (0, 7, 0),
    ],
)
def test_semi_sync_resumed_run_synchronizes_only_the_remaining_steps(start_batch, steps_done, expected):
    """A new pipeline counts batches from 0; --semi_sync_start_batch counts the run's
    steps, so a run resumed at step s passes what is left."""
    assert semi_sync_start_after(start_batch, steps_done) == expected


def test_amp_evaluation_runs_under_the_training_autocast(one_process, monkeypatch):
    """--amp trains and evaluates under bf16 autocast (an fp32 evaluation of a bf16 run
    ran at fp32's speed): the logits evaluation scores are bf16, their metrics those of
    fp32 logits to bf16's precision; without --amp they are fp32."""
    import training.trainer as trainer_module
    from training.distributed import resolve_env
    from training.metrics import BinaryClassificationMetrics

    scored = []
    update = BinaryClassificationMetrics.update
    monkeypatch.setattr(
        BinaryClassificationMetrics,
        "update",
        lambda self, logits, *rest: (scored.append(logits.dtype), update(self, logits, *rest))[1],
    )
    config = parse_config(TINY_RUN + ["--amp", "--limit_val_batches", "4"], "dlrm_main.py", "")
    trainer = trainer_module.Trainer(config, resolve_env("cpu"))
    trainer.fit()
    scored.clear()
    with_amp = trainer.evaluate("validation")
    assert scored and set(scored) == {torch.bfloat16}
    trainer.config = dataclasses.replace(config, dense_precision="fp32")
    trainer.train_pipeline = trainer._pipeline(config.pipeline, amp=False)
    scored.clear()
    in_fp32 = trainer.evaluate("validation")
    assert scored and set(scored) == {torch.float32}
    assert with_amp is not None and in_fp32 is not None and with_amp["num_samples"] == 16
    assert with_amp["log_loss"] == pytest.approx(in_fp32["log_loss"], rel=1e-2)
    # bf16 logits tie close scores: a few of the AUROC's 63 positive/negative pairs change.
    assert with_amp["auroc"] == pytest.approx(in_fp32["auroc"], abs=4 / 63)


@pytest.mark.parametrize("every", [1, 4])
def test_divergence_watch_checks_every_n_steps_on_cuda(one_process, monkeypatch, every):
    """The watch reads the losses back (a host sync) every step on CPU, every
    DIVERGENCE_WATCH_EVERY_CUDA steps on CUDA: a diverging run stops at the first check
    after its first non-finite loss, and names that step."""
    import training.trainer as trainer_module
    from training.distributed import resolve_env

    assert trainer_module.divergence_watch_every(torch.device("cpu")) == 1
    assert trainer_module.divergence_watch_every(torch.device("cuda")) == trainer_module.DIVERGENCE_WATCH_EVERY_CUDA > 1
    monkeypatch.setattr(trainer_module, "divergence_watch_every", lambda device: every)
    config = parse_config(
        TINY_RUN
        + [
            "--limit_train_batches",
            "12",
            "--optimizer",
            "sgd",
            "--learning_rate",
            "1e30",
            "--log_every_n_steps",
            "100",
        ],
        "dlrm_main.py",
        "",
    )
    trainer = trainer_module.Trainer(config, resolve_env("cpu"))
    with pytest.raises(trainer_module.NonFiniteLossError) as error:
        trainer.fit()
    first = int(re.search(r"at step (\d+)", str(error.value)).group(1))
    assert first < every or every == 1
    assert trainer.step == (first + 1 if every == 1 else every)  # steps count from 0 in the message


def test_install_check_runs_fbgemm_table_batched_lookup_and_update():
    """scripts/check_install.py checks FBGEMM's training kernel, not only a sparse op:
    a table-batched lookup's sums and its fused SGD update against torch, on the GPU
    when there is one (the check the install script makes there), else on the CPU."""
    from scripts.check_install import table_batched_lookup_and_update

    table_batched_lookup_and_update(torch.device("cpu"))
    if torch.cuda.is_available():
        table_batched_lookup_and_update(torch.device("cuda", 0))


def test_process_group_binds_the_rank_gpu_on_cuda_only():
    """init_process_group gets device_id = the rank's GPU on CUDA, nothing on CPU (gloo)."""
    from training.distributed import group_device

    cuda_env = dataclasses.replace(
        CPU_ENV, rank=3, world_size=4, local_rank=1, local_world_size=2, device=torch.device("cuda", 1), backend="nccl"
    )
    assert group_device(cuda_env) == torch.device("cuda", 1)
    assert group_device(CPU_ENV) is None


def test_table_init_uses_the_rank_share_of_the_cores_not_torchrun_one_thread():
    """torchrun sets OMP_NUM_THREADS=1; the tables are filled on the rank's share of the
    cores it may run on (its affinity), whatever torch's thread count is."""
    from training.distributed import rank_cpu_share, usable_cores

    assert [rank_cpu_share(n, cores=16) for n in (1, 2, 8, 16, 32)] == [16, 8, 2, 1, 1]
    assert usable_cores() == len(os.sched_getaffinity(0)) and rank_cpu_share(1) == usable_cores()
