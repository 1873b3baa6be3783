"""The training loop: build, shard, train with the sparse-dist pipeline, evaluate.

Read top to bottom: `Trainer.__init__` builds everything from the config in named
steps (data -> model on the meta device -> process group -> plan ->
DistributedModelParallel and optimizers -> loaders -> checkpointing), `fit`
runs the epochs, `evaluate` runs a split through its own pipeline.
"""

import contextlib
import dataclasses
import itertools
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torchrec.distributed import TrainPipelineSparseDist
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.train_pipeline.train_pipelines import TrainPipeline
from torchrec.distributed.types import ShardingEnv

from checkpoints.collective import all_gather
from checkpoints.directory import checkpoint_to_load, export_role
from checkpoints.load import load_checkpoint
from checkpoints.meta import CheckpointMeta, WarmStartOrigin
from checkpoints.opened import read_meta
from checkpoints.save import CheckpointManager, check_writable, lock_checkpoint_dir
from common.byte_sizes import format_bytes
from common.calibration import Calibration
from common.config_flags import Overrides, flag_of
from common.errors import BadInput
from data.config import BatchLoader
from data.parquet.id_sketch import sketch_facts, widened
from data.sources import DataSource
from data.sources.types import FeedJob
from models import build_dlrm_train
from models.arch import align_to_sharded_embeddings, compile_dense_part
from models.embedding_optimizer import attach_fused_embedding_optimizer
from models.zch import reserve_history, zch_summary, zch_tables
from sharding_plans import PlannerConfig, format_sharding_plan, plan_summary
from sharding_plans.rules import check_embedding_weight_decay, check_reshardable
from training.calibration import LogitHistogram
from training.checkpoint_policy import MinuteCadence, RestorePoint, find_restore_point
from training.config import OptimizerConfig, TrainConfig
from training.distributed import DistributedEnv, gather_peak_memory, init_process_group, rank_cpu_share
from training.divergence import diverged, miscalibration_warning
from training.early_stopping import BestModel, load_weights
from training.embedding_init import init_embedding_tables, torchrec_table_init_skipped
from training.id_frequencies import IdFrequencies
from training.lr_schedule import WarmupPolyDecaySchedule
from training.metrics import BinaryClassificationMetrics
from training.optimizers import build_combined_optimizer
from training.pipelines import (
    build_pipeline,
    check_compile_supported,
    check_dense_precision,
    check_pipeline_supported,
    check_plan_for_pipeline,
    check_validation_handover,
    cpu_has_bf16_units,
    release_cache_line_locks,
    semi_sync_start_after,
)
from training.plan_memory import PlanMemoryProbe
from training.recipes import STABLE_OPTIMIZER
from training.run_log import RunLog, StepClock, TestedModel, format_metrics
from training.sharding import prepare_sharding
from training.startup_report import StartupReport
from training.warm_start import WarmStart, find_warm_start, leading_rows, origin_sketch_bits


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


class DivergedError(RuntimeError):
    """The run ended with finite figures no better than a constant predictor's, or a
    training loss grown by orders of magnitude (training/divergence.py)."""


# The losses are checked over the run's first steps more often than once per logged
# interval: a diverging start, the usual case, is caught within a few steps. On CPU
# every step; on CUDA every `DIVERGENCE_WATCH_EVERY_CUDA` steps, since each check reads
# the losses back to the host, a sync that stalls the GPU's queue (at DLRMv2's speed
# one sync a step cost more than the step).
DIVERGENCE_WATCH_STEPS = 100
DIVERGENCE_WATCH_EVERY_CUDA = 10


def divergence_watch_every(device: torch.device) -> int:
    """Steps between two checks of the divergence watch on ``device``."""
    return DIVERGENCE_WATCH_EVERY_CUDA if device.type == "cuda" else 1


def divergence_advice(optim: OptimizerConfig) -> str:
    """What to do about a non-finite loss: with the public example's optimizer flags
    left at their defaults, they are the likely cause, and the flags that train."""
    public = {name: flag_of(OptimizerConfig, name).default for name in STABLE_OPTIMIZER.values}
    if any(getattr(optim, name) != value for name, value in public.items()):
        return "lower --learning_rate or check the input data"
    defaults = " ".join(f"{option} {value}" for option, value in Overrides(OptimizerConfig, **public).options().items())
    stable = " ".join(f"{option} {value}" for option, value in STABLE_OPTIMIZER.options().items())
    return f"the likely cause is the public example's defaults ({defaults}); these train: {stable}"


@dataclass
class RunResult:
    """What a finished run reports (rank 0 has the same values as every rank)."""

    steps: int
    train_losses: list[float] = field(default_factory=list)
    validation: dict[str, float] | None = None
    test: dict[str, float] | None = None
    records_per_sec: float = 0.0  # training records (all ranks) per second, evaluation excluded
    best_step: int | None = None  # the best validation's step (early stopping, or best.json's)
    best_validation: dict[str, float] | None = None
    stopped_early: bool = False
    target_reached: bool | None = None  # --validation_auroc: None without a target
    time_to_target_s: float | None = None  # from the start of training, evaluation included
    records_to_target: int | None = None  # training records (all ranks) until then
    # --rolling_windows: {window: its metrics} of the windows this process evaluated
    windows: dict[int, dict[str, float]] = field(default_factory=dict)
    window_steps: dict[int, int] = field(default_factory=dict)  # {window: the step its model is from}
    test_model: TestedModel | None = None  # which model `test` is of
    final_test: dict[str, float] | None = None  # the final weights', when the best was tested too
    export_step: int | None = None  # the checkpoint serving.export takes from --checkpoint_dir


class Trainer:
    """Trains one model described by a `TrainConfig` on the current process group.

    Args:
        config: the validated configuration.
        env: rank, world size and device of this process.

    Example::

        result = Trainer(config, resolve_env("auto")).fit()
    """

    def __init__(self, config: TrainConfig, env: DistributedEnv, source: DataSource | None = None) -> None:
        self.config = config
        self.env = env
        # The data set, the checkpoint, the model and the plan file or constraints
        # first: bad input fails on every rank alike, before any collective. The run's
        # one source: the flags built it (a config checked already gives it back).
        self.source = source if source is not None else config.data.validate()
        window_loaders = self._open_data()
        restore = find_restore_point(config)
        warm = find_warm_start(config, restore)
        saves_checkpoints = self._check_the_run_can_be_done()
        startup = StartupReport(config, env, self.source)
        startup.before_setup(self._dataset)  # what is being built, before the seconds (or minutes) it takes
        self.source.check_values(self._dataset)
        model = self._build_model()
        resumed_plan = restore.meta.plan if restore and restore.full else None
        sharding = prepare_sharding(config, env, model, resumed_plan)
        self._join_the_process_group()
        self._join_the_feed(restore)
        plan, table_shapes = self._plan_the_sharding(model, sharding, resumed_plan, restore, warm)
        self._shard_the_model(model, plan, sharding, table_shapes, restore)
        self.loaders: dict[str, BatchLoader] = window_loaders or self.source.loaders(
            self._dataset, config.model.num_embeddings_per_feature, env.rank, env.world_size
        )
        self._loaded_window = 0 if window_loaders else None
        self._start_the_counters()
        self._build_the_checkpointing(saves_checkpoints)
        if restore is not None:
            self.restore_from(restore)
        elif warm is not None:
            self.warm_start_from(warm)
        elif config.checkpoint.resume:
            self.log.print(
                f"--resume: {config.checkpoint.checkpoint_dir} holds no complete checkpoint; training "
                "starts from scratch"
            )
        self.train_pipeline = self._pipeline(config.pipeline, config.amp)  # after the restored step
        # Counted once: with --rolling_windows the windows differ in length, and a
        # denominator recomputed per window moved mid-run.
        self.total_train_steps = self._total_train_steps()
        startup.after_setup(self.plan, self.loaders, self.log, total_steps=self.total_train_steps)
        self.log.record_config(config, env.world_size, str(env.device))  # whatever the work (--mode)
        # Last, so that nothing above can fail with the lock held; released by `fit`
        # (or `release_checkpoint_dir` when it fails).
        directory = config.checkpoint.checkpoint_dir
        self._checkpoint_lock = (
            lock_checkpoint_dir(directory, env.rank)  # type: ignore[arg-type]
            if saves_checkpoints
            else None
        )

    # The build steps of `__init__`, in its order.

    def _open_data(self) -> dict[str, BatchLoader] | None:
        """Describes and opens the data (values are checked after the start-up block:
        that reads every file); with --rolling_windows N, returns the loaders of
        window 0, so that a source without time windows is refused before any
        collective (`_load_window` moves on)."""
        self.data_source, self.data_features = self.source.name, self.source.describe()  # what checkpoints record
        self._dataset = self.source.open(check_values=False)
        # What serving needs of the data, recorded with every checkpoint: an export never opens it.
        self.serving_layout, self.serving_facts = self.source.serving_layout, self.source.serving_facts(self._dataset)
        self.rolling_windows = self.config.data.rolling_windows
        self._loaded_window: int | None = None
        return self._window_loaders(0) if self.rolling_windows else None

    def _check_the_run_can_be_done(self) -> bool:
        """Refuses a checkpoint directory it cannot write and a pipeline, precision or
        compile this device cannot run; returns whether the run saves checkpoints.
        Training with a checkpoint directory always saves there: at the end, at each
        new best validation, and at the cadence the saving flags set."""
        config, env = self.config, self.env
        saves_checkpoints = bool(config.checkpoint.checkpoint_dir) and config.mode == "train"
        if saves_checkpoints:
            check_writable(config.checkpoint.checkpoint_dir)  # type: ignore[arg-type]
        check_pipeline_supported(config.pipeline, env.device, env.world_size)
        check_validation_handover(
            config.pipeline,
            env.world_size,
            histories=bool(config.model.sequence_columns),
            within_epoch=config.validation_freq_within_epoch is not None,
            zch=getattr(config.data, "id_hashing", None) == "zch",
        )
        check_dense_precision(config.dense_precision, env.device, cpu_has_bf16_units())
        check_compile_supported(config.compile)
        return saves_checkpoints

    def _build_model(self) -> torch.nn.Module:
        """The training model: identical dense init on every rank, world size and
        device (seeded here), tables on the meta device until sharded."""
        config = self.config
        torch.manual_seed(config.seed)
        self.weighted = config.data.weight_column is not None  # weighted loss and metrics
        model = build_dlrm_train(
            config.model, dense_device=self.env.device, dropout=config.dropout, weighted=self.weighted
        )
        attach_fused_embedding_optimizer(model.model.sparse_arch, config.optim)
        return model

    def _join_the_process_group(self) -> None:
        """The process group (the first collective), the run log, and the device's
        matmul settings."""
        config, env = self.config, self.env
        self.process_group = init_process_group(env)
        self.log = RunLog(
            env.is_main, config.log_path, config.tensorboard_dir, progress=config.print_progress or sys.stderr.isatty()
        )
        if not config.model.has_dense_arch:
            self.log.print(
                f"the data has no numerical features: no bottom MLP (--dense_arch_layer_sizes is not "
                f"used), the {config.model.interaction_type} interaction runs over the "
                f"{len(config.model.sparse_feature_names)} embeddings alone"
            )
        if env.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = config.allow_tf32
            torch.backends.cudnn.allow_tf32 = config.allow_tf32

    def _join_the_feed(self, restore: RestorePoint | None) -> None:
        """Tells the source what the job is (`data.sources.types.FeedJob`): with a gloo
        group of its own when its loaders agree on batches (the feed's collectives stay off
        the training group's NCCL stream and never interleave with its collectives)."""
        env = self.env
        group = dist.new_group(backend="gloo") if env.world_size > 1 and self.source.uses_feed_group else None
        resumed = restore.meta if restore and restore.full else None
        note = self.source.join_job(
            FeedJob(
                env.device.type,
                env.local_world_size,
                group,
                resumed.world_size if resumed else None,
                resumed.data.epoch_shares if resumed else None,
                env.world_size,
            )
        )
        if note:
            self.log.print(note)

    def _plan_the_sharding(
        self,
        model: torch.nn.Module,
        sharding: Any,
        resumed_plan: dict | None,
        restore: RestorePoint | None,
        warm: WarmStart | None,
    ) -> tuple[Any, dict[str, tuple[int, int]]]:
        """(the sharding plan, {table: (rows, dim)}); the plan checked against the
        pipeline, the weight decay and the plan of a checkpoint whose optimizer state
        it loads (resumed, or warm-started with --warm_start_optimizer)."""
        config, env = self.config, self.env
        plan, self.plan_estimates = sharding.plan(
            model,
            PlannerConfig(
                world_size=env.world_size,
                local_world_size=env.local_world_size,
                compute_device=env.device.type,
                batch_size=config.data.batch_size,
            ),
            self.process_group,
        )
        self.plan = plan_summary(plan)
        check_plan_for_pipeline(config.pipeline, self.plan, config.validation_freq_within_epoch is not None)
        # every rank has the plan
        check_embedding_weight_decay(self.plan, env.device, config.optim.embedding_weight_decay)
        if resumed_plan is not None:
            check_reshardable(resumed_plan, self.plan, f"checkpoint {restore.path}")  # type: ignore[union-attr]
        if warm is not None and warm.optimizer:
            check_reshardable(
                warm.checkpoint.meta.plan,
                self.plan,
                f"--warm_start {warm.checkpoint.path}",
                weights_only="warm-start without --warm_start_optimizer",
            )
        table_shapes = {
            t: (rows, config.model.embedding_dim)
            for t, rows in zip(config.model.table_names, config.model.num_embeddings_per_feature)
        }
        if config.print_sharding_plan:
            self.log.print(
                format_sharding_plan(plan, env.world_size, table_shapes, config.model.embedding_bytes_per_element)
            )
        return plan, table_shapes

    def _shard_the_model(
        self,
        model: torch.nn.Module,
        plan: Any,
        sharding: Any,
        table_shapes: dict[str, tuple[int, int]],
        restore: RestorePoint | None,
    ) -> None:
        """The sharded model, its tables initialised (unless restored), its optimizer
        and learning-rate schedule; what the tables and their optimizer state take is
        measured from here to the first step."""
        config, env = self.config, self.env
        plan_memory = PlanMemoryProbe(env.device)
        self._plan_memory: PlanMemoryProbe | None = plan_memory  # None once logged
        # TorchRec's two draws of every shard are skipped: the tables are overwritten
        # next, by the seeded init or by the checkpoint.
        with torchrec_table_init_skipped():
            self.model = DistributedModelParallel(
                module=model,
                device=env.device,
                env=ShardingEnv.from_process_group(self.process_group),
                plan=plan,
                sharders=sharding.sharders,
            )
        # The rank's share of the cores, not torch's threads: torchrun sets OMP_NUM_THREADS=1,
        # which on CUDA (no CPU thread setting) would fill the tables on one core.
        init_threads = rank_cpu_share(env.local_world_size)
        if restore is None and init_embedding_tables(self.model, table_shapes, config.seed, init_threads) != len(
            table_shapes
        ):
            raise RuntimeError("the seeded init did not find every embedding table in the sharded model")
        # After the seeded init: the probe's lookup loads row 0 into a UVM cache
        # (fused_uvm_caching), which would otherwise keep serving torchrec's init of it.
        align_to_sharded_embeddings(self.model, env.device)
        release_cache_line_locks(self.model)  # the probe's lookup had no backward
        self.zch = zch_tables(self.model)  # --id_hashing zch: the managed-collision tables, else None
        if self.zch is not None:
            # Sized for the global batch's ids (any shard may receive them all); a step
            # with more (multi-hot bags) grows the record (models/zch.py).
            reserve_history(self.zch.collection, config.data.batch_size * env.world_size)
        if config.compile:
            compile_dense_part(self.model)  # after the alignment, which changes the interaction's index buffers
        self.optimizer = build_combined_optimizer(self.model, config.optim)
        plan_memory.built()
        self.schedule = WarmupPolyDecaySchedule(config.optim)

    def _start_the_counters(self) -> None:
        """Where training stands: step, data position, what was saved and validated."""
        config = self.config
        self.step = 0
        self.start_epoch, self.start_batch = 0, 0  # where training (re)starts in the data
        self._saved_step = -1
        self._saved_path = ""
        self._validated_step = -1
        # --calibrate: (step, fit) of the last validation; checkpoints of that step store the fit
        self._calibration: tuple[int, Calibration | None] | None = None
        self._stop_training = False  # early stopping or the AUROC target ended training
        self._stop_position = (0, 0)  # (epoch, batch) training continues at after the last validation
        self._fit_start = 0.0
        self.frequencies = (
            IdFrequencies(
                config.model.sparse_feature_names, config.model.table_names, config.model.num_embeddings_per_feature
            )
            if config.collect_multi_hot_freqs_stats
            else None
        )
        self.epoch = 0
        self.stage = "training"  # or the split being evaluated, or "saving step N"
        self._train_seconds = 0.0
        self._train_records = 0

    def _build_the_checkpointing(self, saves_checkpoints: bool) -> None:
        """The checkpoint manager, the minute cadence and the best model's keeper."""
        flags, rank = self.config.checkpoint, self.env.rank
        self.checkpoints = (
            CheckpointManager(
                flags.checkpoint_dir,  # type: ignore[arg-type]
                flags.keep_last_n_checkpoints,
                rank,
                flags.async_checkpoint,
            )
            if saves_checkpoints
            else None
        )
        self.minute_cadence = (
            MinuteCadence(flags.checkpoint_every_n_minutes)
            if saves_checkpoints and flags.checkpoint_every_n_minutes
            else None
        )
        self.best = BestModel(self.config.early_stopping, self.checkpoints, rank)
        self.weights_step: int | None = None  # the step of the checkpoint whose weights were loaded
        self.weights_path: str | None = None  # and its path
        self.warm_start_origin: WarmStartOrigin | None = None  # what this run was warm-started from

    def release_checkpoint_dir(self) -> None:
        """Lets another run save into --checkpoint_dir."""
        if self._checkpoint_lock is not None:
            self._checkpoint_lock.release()
            self._checkpoint_lock = None

    def restore_from(self, restore: RestorePoint) -> None:
        """Loads weights, and with ``full`` the optimizer state, step and data position."""
        state = {"model": self.model.state_dict()}
        seen = self.source.seen_ids()
        recorded = (restore.meta.serving_facts or {}).get("id_sketch")
        # The filters hold the ids the checkpoint's training read too (a resumed run's, an
        # evaluated model's: --mode test counts against them), when it saved filters of
        # these sizes (a run resized since starts them afresh).
        if (
            seen is not None
            and isinstance(recorded, dict)
            and [recorded.get("bits", {}).get(n) for n in seen.names] == seen.bits
        ):
            state["id_sketch"] = {n: torch.zeros(b // 8, dtype=torch.uint8) for n, b in zip(seen.names, seen.bits)}
        if restore.full:
            self.optimizer.init_state()  # lazy optimizer state must exist to load into
            state["optim"] = self.optimizer.state_dict()
        load_checkpoint(restore.checkpoint, state, self.env.rank, restore_rng=restore.full)
        self.model.load_state_dict(state["model"])
        self._log_restored_zch(restore.path)
        if "id_sketch" in state:
            seen.merge([state["id_sketch"][n].numpy() for n in seen.names])
        self.weights_step, self.weights_path = restore.meta.step, restore.path
        if not restore.full:
            self.log.print(f"loaded the weights of {restore.path}")
            return
        self.warm_start_origin = restore.meta.warm_start  # a warm-started run, resumed, still is one
        self.optimizer.load_state_dict(state["optim"])
        meta = restore.meta
        global_batch = self.config.data.batch_size * self.env.world_size
        if meta.global_batch_size != global_batch:
            raise BadInput(
                f"checkpoint {restore.path} was trained with a global batch of "
                f"{meta.global_batch_size} rows, this run has {global_batch}: "
                "the data position cannot carry over"
            )
        if meta.rolling_windows != self.rolling_windows:
            raise BadInput(
                f"checkpoint {restore.path} was trained with --rolling_windows {meta.rolling_windows}, "
                f"this run has {self.rolling_windows}: its position in the data cannot carry over"
            )
        self.step, self.start_epoch, self.start_batch = meta.step, meta.epoch, meta.batch_in_epoch
        if not self._at_admission():
            self.log.print(
                f"--id_hashing zch: step {self.step} is no multiple of --zch_eviction_interval "
                f"{self.config.model.zch_eviction_interval}: the ids read since the last admission are not in "
                "the checkpoint, so the next admission counts only those read from here"
            )
        self._saved_step, self._saved_path = meta.step, restore.path  # this step needs no new save
        if meta.early_stopping:
            self.best.stopping.load_state_dict(meta.early_stopping)
        self.log.print(
            f"resumed from {restore.path}: step {self.step}, {self._pass_name(self.start_epoch)}, "
            f"batch {self.start_batch}"
        )

    def warm_start_from(self, warm: WarmStart) -> None:
        """Loads the weights (and with --warm_start_optimizer the optimizer state) of the
        checkpoint a new run starts from: the rows a grown table shares with it, the
        others as the seeded init left them. The step, data position, learning-rate
        schedule, early stopping and random generators stay those of a fresh run."""
        state = {"model": self.model.state_dict()}
        if warm.optimizer:
            self.optimizer.init_state()  # lazy optimizer state must exist to load into
            state["optim"] = self.optimizer.state_dict()
        flat = leading_rows(state, warm.grown)
        seen = self.source.seen_ids()
        # The origin's seen-id filters carry too: an id is unseen only when no model of
        # the lineage read it (a grown table's larger filter holds the origin's tiled).
        origin_bits = origin_sketch_bits(warm.checkpoint.meta, seen)
        origin_sketch = {n: torch.zeros(b // 8, dtype=torch.uint8) for n, b in origin_bits.items()}
        flat.update({f"id_sketch.{n}": t for n, t in origin_sketch.items()})
        load_checkpoint(warm.checkpoint, flat, self.env.rank, restore_rng=False)
        self.model.load_state_dict(state["model"])
        self._log_restored_zch(warm.checkpoint.path)  # zch: the remapping carried with the weights
        if warm.optimizer:
            self.optimizer.load_state_dict(state["optim"])
        if seen is not None and origin_sketch:
            seen.merge(widened([origin_sketch[n].numpy() for n in seen.names], seen.bits))
        self.warm_start_origin = origin = warm.origin
        grown = ", ".join(f"{table} {was} -> {now} rows" for table, (was, now) in warm.grown.items())
        carried = "weights and optimizer state" if warm.optimizer else "weights (the optimizers start fresh)"
        resumed = (
            f"--resume: {self.config.checkpoint.checkpoint_dir} holds no complete checkpoint yet; "
            if self.config.checkpoint.resume
            else ""
        )
        self.log.print(
            f"{resumed}warm start from {origin.describe()}: its {carried}"
            f"{f'; grown tables: {grown}' if grown else ''}; step, learning-rate schedule and early stopping "
            "start afresh"
        )
        self.log.record(
            "warm_start",
            path=origin.path,
            step=origin.step,
            meta_sha256=origin.meta_sha256,
            origin_run_id=origin.run_id,  # "run_id" is this run's, in every record
            optimizer=warm.optimizer,
            grown_tables={table: list(rows) for table, rows in warm.grown.items()},
        )

    def _seen_ids(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The filters of the ids every rank's training loader has read, OR-ed over the
        ranks (collective), as checkpoint state, and the serving facts with their own
        (data/parquet/id_sketch.py: serving counts the ids they lack as unseen)."""
        vocabulary = self.source.vocabulary() if hasattr(self.source, "vocabulary") else None
        if vocabulary is not None:  # --id_hashing vocabulary: the same on every rank, saved as it is
            state = {"id_vocabulary": {n: torch.from_numpy(keys) for n, keys in vocabulary.state().items()}}
            return state, {**(self.serving_facts or {}), "id_vocabulary": vocabulary.facts()}
        seen = self.source.seen_ids()
        if seen is None:
            return {}, self.serving_facts
        seen.merge(self._or_over_ranks(seen.packed()))
        sketches = seen.sketches()
        state = {"id_sketch": {name: torch.from_numpy(s.packed) for name, s in zip(seen.names, sketches)}}
        return state, {**(self.serving_facts or {}), "id_sketch": sketch_facts(seen.names, sketches)}

    def _or_over_ranks(self, packed: list[Any]) -> list[Any]:
        """Each filter's bytes OR-ed over the ranks (collective), one filter at a time:
        gloo reduces them bitwise; NCCL has no bitwise reduction, so every rank gathers
        the filter's copies (world size x its bytes, on the device) and ORs them."""
        if self.env.world_size == 1:
            return packed
        merged = []
        for bits in packed:
            tensor = torch.from_numpy(bits).to(self.env.device)
            if self.env.backend == "gloo":
                dist.all_reduce(tensor, op=dist.ReduceOp.BOR, group=self.process_group)
            else:
                every = torch.empty((self.env.world_size, len(bits)), dtype=torch.uint8, device=self.env.device)
                dist.all_gather_into_tensor(every, tensor, group=self.process_group)
                tensor = every[0]
                for row in every[1:]:
                    tensor = tensor | row
            merged.append(tensor.cpu().numpy())
        return merged

    def save_checkpoint(self, epoch: int, batch_in_epoch: int) -> str:
        """Saves everything needed to continue at (epoch, batch_in_epoch); returns its
        path. Collective."""
        assert self.checkpoints is not None
        start = time.perf_counter()
        seen_state, serving_facts = self._seen_ids()
        meta = CheckpointMeta(
            step=self.step,
            epoch=epoch,
            batch_in_epoch=batch_in_epoch,
            world_size=self.env.world_size,
            config=dataclasses.asdict(self.config),
            plan=self.plan,
            run_id=self.log.run_id,
            early_stopping=self.best.stopping.state_dict(),
            data_source=self.data_source,
            data_features=self.data_features,
            serving_layout=self.serving_layout,
            serving_facts=serving_facts,
            calibration=self._calibration_of_this_step(),
            warm_start=self.warm_start_origin,
        )
        state = {"model": self.model.state_dict(), "optim": self.optimizer.state_dict(), **seen_state}
        with self.in_stage(f"saving step {self.step}"):
            path = self.checkpoints.save(state, meta)
        self._saved_step, self._saved_path = self.step, path
        if self.minute_cadence is not None:
            self.minute_cadence.restart()
        seconds = time.perf_counter() - start
        done = "staged, writing in the background," if self.checkpoints.asynchronous else "saved"
        self.log.print(f"checkpoint {path} {done} in {seconds:.1f} s (step {self.step})")
        self.log.record(
            "checkpoint", step=self.step, path=path, seconds=seconds, background=self.checkpoints.asynchronous
        )
        return path

    def _pipeline(self, kind: str, amp: bool) -> TrainPipeline:
        return build_pipeline(
            kind,
            self.model,
            self.optimizer,
            self.env.device,
            amp,
            semi_sync_start_after(self.config.semi_sync_start_batch, self.step),
        )

    def _batches(self, loader: BatchLoader) -> Iterator:
        batches: Iterator = iter(loader)
        if self.config.data.pin_memory and self.env.device.type == "cuda":
            batches = (b.pin_memory() for b in batches)
        return batches

    def _pass_name(self, epoch: int) -> str:
        """``epoch 2``, or with --rolling_windows ``window 2`` (one pass per window)."""
        return f"{'window' if self.rolling_windows else 'epoch'} {epoch}"

    def _window_loaders(self, window: int) -> dict[str, BatchLoader]:
        """--rolling_windows: {"train": window ``window``, "validation": the next one}."""
        assert self.rolling_windows is not None
        return self.source.window_loaders(
            self._dataset,
            window,
            self.rolling_windows + 1,
            self.config.model.num_embeddings_per_feature,
            self.env.rank,
            self.env.world_size,
        )

    def _total_train_steps(self) -> int:
        """The run's training steps from step 0: every epoch's, or with --rolling_windows
        N the sum of the N training windows' (each its own length)."""
        if self.rolling_windows:
            return sum(len(self._window_loaders(w)["train"]) for w in range(self.rolling_windows))
        return self.config.epochs * len(self.loaders["train"])

    def _load_window(self, window: int, first_batch: int) -> None:
        """Makes window ``window`` the training split and the next one validation."""
        if self._loaded_window != window:
            self.loaders = self._window_loaders(window)
            self._loaded_window = window
        steps = len(self.loaders["train"])
        self.log.print(f"window {window}: training on {steps} batches, then evaluating on window {window + 1}")

    def fit(self) -> RunResult:
        """Trains every epoch, validates as configured, then tests. Collective."""
        config = self.config
        result = RunResult(steps=0)
        self._fit_start = time.perf_counter()
        # --rolling_windows N: pass k trains window k and validates on window k + 1.
        passes = self.rolling_windows or config.epochs
        self.clock = StepClock(self.total_train_steps)
        if config.validation_auroc is not None:
            result.target_reached = False
        for epoch in range(self.start_epoch, passes):
            if self.best.stopping.should_stop:  # resumed from a run that had stopped early
                self.best.stopped_early = True
                break
            self.epoch = epoch
            first_batch = self.start_batch if epoch == self.start_epoch else 0
            if self.rolling_windows:
                self._load_window(epoch, first_batch)
            train_loader = self.loaders["train"]
            train_loader.set_epoch(epoch, first_batch)
            result.train_losses += self._train_epoch(epoch, first_batch, train_loader, result)
            if self._stop_training:
                break
            # Validation before the checkpoint, so the checkpoint records what it decided.
            if config.validate_at_epoch_end and self._validated_step != self.step:
                self._validate(result, epoch + 1, 0)
            at_end = config.checkpoint.checkpoint_at_epoch_end or self.rolling_windows  # every window end
            if self.checkpoints and at_end and self._saved_step != self.step:
                self.save_checkpoint(epoch + 1, 0)
            if self._stop_training:
                break
        if self.checkpoints and self._saved_step != self.step:
            # Continues where training stopped: after the last epoch, or at the
            # validation that stopped it.
            self.save_checkpoint(*(self._stop_position if self._stop_training else (passes, 0)))
        if self.checkpoints:
            self.checkpoints.wait()  # every checkpoint complete before testing (the best) and returning
        if self.frequencies is not None:
            path = self.frequencies.save(os.getcwd(), self.env.rank)
            self.log.print(f"id frequencies of the training batches: {path} (one file per rank)")
        result.stopped_early = self.best.stopped_early
        self._test_at_end(result)
        result.steps = self.step
        self._summary(result)
        self._warn_miscalibration(result)
        self._check_divergence(result)
        self.log.close()
        self.release_checkpoint_dir()
        return result

    def _test_at_end(self, result: RunResult) -> None:
        """Tests the final weights and, when the run kept a better model, that one too,
        last: the checkpoint serving.export takes from --checkpoint_dir (the one best.json
        marks; `checkpoint_to_load`, the export's own choice), or without a directory
        early stopping's best kept in memory. Each line says which model it is. The
        model is left as fit always left it: the best weights with early stopping, else
        the final ones. Collective."""
        stopping = self.best.stopping
        if self.config.early_stopping.enabled or self.checkpoints is not None:
            result.best_step, result.best_validation = stopping.best_step, stopping.best_validation
        export = checkpoint_to_load(self.checkpoints.directory, "--checkpoint_dir") if self.checkpoints else None
        if export is not None:
            result.export_step = read_meta(export).step
        if not self.config.test_at_end or self.rolling_windows:  # the windows' evaluations are the test
            return
        if len(self.loaders["test"]) == 0:  # --limit_test_batches 0: nothing to test, no model to load
            return
        final = TestedModel("final", self.step, result.export_step == self.step)
        best = (
            result.export_step
            if export is not None
            else (stopping.best_step if self.config.early_stopping.enabled else None)
        )
        if best is None or best == self.step:  # no better model: one test, marked only with a checkpoint dir
            result.test_model = final
            result.test = self.evaluate("test", model=final, say_model=export is not None)
            return
        result.final_test = self.evaluate("test", model=final)
        if export is not None:
            load_weights(self.model, export, self.env.rank)
        else:
            self.best.restore(self.model, self.step)
        validation = (
            f" (validation {self.config.early_stopping.metric} {stopping.best_value:.4f})"
            if stopping.best_step == best and stopping.best_value is not None
            else ""
        )
        self.log.print(f"testing the best weights: step {best}{validation}")
        result.test_model = TestedModel("best", best, export is not None)
        result.test = self.evaluate("test", weights_step=best, model=result.test_model)
        if not self.config.early_stopping.enabled:
            load_weights(self.model, self._saved_path, self.env.rank)  # the final checkpoint, saved above

    def _train_epoch(self, epoch: int, first_batch: int, loader: BatchLoader, result: RunResult) -> list[float]:
        config = self.config
        every = config.checkpoint.checkpoint_every_n_steps
        self.model.train()
        batches = self._batches(loader)
        if self.frequencies is not None:
            batches = self.frequencies.counting(batches)
        self.log.start_progress(len(loader), self._pass_name(epoch), initial=first_batch)
        losses: list[float] = []
        pending: list[torch.Tensor] = []  # this interval's per-step losses, not yet synced
        unwatched = 0  # steps of the divergence watch not yet checked
        watch_every = divergence_watch_every(self.env.device)
        interval_records, interval_start = 0, time.perf_counter()
        for step_in_epoch in itertools.count(first_batch):
            lr = self.schedule.apply(self.optimizer, self.step)
            try:
                loss, _, labels, *_ = self.train_pipeline.progress(batches)  # weighted: and the weights
            except StopIteration:
                break
            pending.append(loss.detach())
            interval_records += labels.numel() * self.env.world_size
            self.step += 1
            if self._plan_memory is not None:
                self._log_plan_memory(self._plan_memory)
            if self.step <= DIVERGENCE_WATCH_STEPS:
                unwatched = min(unwatched + 1, len(pending))  # a logged interval was checked there
                if unwatched >= watch_every or self.step == DIVERGENCE_WATCH_STEPS:
                    self._check_finite(self._mean_over_ranks(pending[-unwatched:]), epoch)
                    unwatched = 0
            self.log.advance()
            if config.print_lr:
                self.log.print(f"step {self.step - 1}: lr {lr:.6g}")
            # The epoch's last batch is validated by the epoch's end, after any
            # checkpoint of this step: a checkpoint at (epoch, last batch) then never
            # holds that validation, and a run resumed from it validates once, as the
            # uninterrupted run did (not a second time, which early stopping would count).
            at_validation = (
                config.validation_freq_within_epoch is not None
                and (step_in_epoch + 1) % config.validation_freq_within_epoch == 0
                and not (config.validate_at_epoch_end and step_in_epoch + 1 == len(loader))
            )
            at_checkpoint = self.checkpoints is not None and (
                (every is not None and self.step % every == 0)
                or (self.minute_cadence is not None and self._at_admission() and self.minute_cadence.due())
            )
            if len(pending) == config.log_every_n_steps or at_validation or at_checkpoint:
                seconds = time.perf_counter() - interval_start
                losses += self._log_interval(epoch, pending, lr, interval_records, seconds)
                pending, interval_records, unwatched = [], 0, 0
                if at_validation:
                    self._validate(result, epoch, step_in_epoch + 1)
                    self.model.train()
                if at_checkpoint and self._saved_step != self.step:
                    self.save_checkpoint(epoch, step_in_epoch + 1)
                if self._stop_training:
                    break
                interval_start = time.perf_counter()
        if pending:
            seconds = time.perf_counter() - interval_start
            losses += self._log_interval(epoch, pending, lr, interval_records, seconds)
        self.log.close_progress()
        return losses

    def _log_interval(
        self, epoch: int, pending: list[torch.Tensor], lr: float, records: int, seconds: float
    ) -> list[float]:
        """Averages the interval's losses over ranks, stops on a non-finite one, logs."""
        values = self._mean_over_ranks(pending)
        self._check_finite(values, epoch)
        self._train_seconds += seconds
        self._train_records += records
        mean_loss = sum(values) / len(values)
        rate = records / seconds if seconds > 0 else float("nan")
        peaks = gather_peak_memory(self.env)
        top = max(range(len(peaks)), key=peaks.__getitem__)
        position, eta = self.clock.tick(self.step, len(values), seconds)
        self.log.print(
            f"{self._pass_name(epoch)} {position} | loss {mean_loss:.5f} | lr {lr:.6g} | "
            f"{rate:,.0f} records/s | peak mem {format_bytes(peaks[top])} (rank {top})"
        )
        self.log.record(
            "train",
            step=self.step,
            epoch=epoch,
            loss=mean_loss,
            lr=lr,
            total_steps=self.clock.total_steps,
            eta_seconds=eta,
            records_per_sec=rate,
            records=records,
            seconds=seconds,
            step_losses=values,
            peak_memory_bytes=peaks,
        )
        self._log_zch()
        return values

    def _at_admission(self) -> bool:
        """Whether a checkpoint of this step resumes exactly: always, but under
        --id_hashing zch only at a multiple of --zch_eviction_interval (docs/zch.md)."""
        return self.zch is None or self.step % self.config.model.zch_eviction_interval == 0

    def _log_zch(self) -> None:
        """--id_hashing zch: per feature live ids, admitted, evicted and the lookups that
        read a default row since the last line, over every rank (collective)."""
        if self.zch is None:
            return
        group = self.process_group if self.env.world_size > 1 else None
        report = self.zch.statistics.report(self.zch.collection, group)
        self.log.print(zch_summary(report))
        self.log.record(
            "zch",
            step=self.step,
            features={
                name: {**dataclasses.asdict(s), "collision_share": s.collision_share} for name, s in report.items()
            },
        )

    def _log_restored_zch(self, path: str) -> None:
        """--id_hashing zch: the live ids a checkpoint brought (the next line's admitted and
        evicted count from them). Collective."""
        if self.zch is None:
            return
        group = self.process_group if self.env.world_size > 1 else None
        live = {name: s.live_ids for name, s in self.zch.statistics.report(self.zch.collection, group).items()}
        self.log.print(f"zch tables of {path}: live ids " + ", ".join(f"{n} {c}" for n, c in live.items()))
        self.log.record("zch_restored", path=path, live_ids=live)

    def _log_plan_memory(self, probe: PlanMemoryProbe) -> None:
        """After the first step: the plan's estimate beside what every rank measured. Collective."""
        self._plan_memory = None
        record = probe.measure(self.env, self.plan_estimates)
        self.log.print(record.line())
        self.log.record("plan_memory", step=self.step, ratios=record.ratios, **dataclasses.asdict(record))

    def _mean_over_ranks(self, pending: list[torch.Tensor]) -> list[float]:
        """The losses of the last ``len(pending)`` steps, each the mean over ranks. Collective."""
        step_losses = torch.stack(pending).double()
        if self.env.world_size > 1:
            # Embedding gradients are divided by the world size: the loss of the
            # equivalent single-process run is the mean of the ranks' losses.
            dist.all_reduce(step_losses)
            step_losses /= self.env.world_size
        return step_losses.cpu().tolist()

    def _check_finite(self, values: list[float], epoch: int) -> None:
        """Raises NonFiniteLossError for the first non-finite loss of the last
        ``len(values)`` steps (every rank alike: the values are the ranks' means)."""
        first_step = self.step - len(values)
        for offset, value in enumerate(values):
            if not math.isfinite(value):
                raise NonFiniteLossError(
                    f"training loss is {value} at step {first_step + offset} (epoch {epoch}): "
                    f"{divergence_advice(self.config.optim)}"
                )

    def _validate(self, result: RunResult, epoch: int, batch_in_epoch: int) -> None:
        """Validates, keeps the best model, and ends training (``_stop_training``) on
        early stopping or the AUROC target. (epoch, batch_in_epoch) is where a
        checkpoint saved now continues. Collective."""
        values = self.evaluate("validation")
        self._validated_step = self.step
        self._stop_position = (epoch, batch_in_epoch)
        if values is None:
            return
        result.validation = values
        if self.rolling_windows:  # each window is evaluated on other rows: no best model across them
            result.windows[self.epoch + 1] = values
            result.window_steps[self.epoch + 1] = self.step
            return
        target = self.config.validation_auroc
        if target is not None and values["auroc"] >= target:
            result.target_reached = True
            result.time_to_target_s = time.perf_counter() - self._fit_start
            result.records_to_target = self._train_records
            self._stop_training = True
            self.log.print(
                f"validation AUROC {values['auroc']:.5f} reached the target {target} at step {self.step}: "
                f"{result.time_to_target_s:.1f} s and {result.records_to_target} training records"
            )
        stop = self.best.observe(
            self.step,
            values,
            self.model,
            save=lambda: (
                self._saved_path if self._saved_step == self.step else self.save_checkpoint(epoch, batch_in_epoch)
            ),
        )
        if stop:
            self._stop_training = True
            self.log.print(
                f"early stopping at step {self.step}: validation {self.config.early_stopping.metric} "
                f"has not improved for {self.best.stopping.validations_without_improvement} validations "
                f"(best {self.best.stopping.best_value:.4f} at step {self.best.stopping.best_step})"
            )

    def evaluate(
        self, stage: str, weights_step: int | None = None, model: TestedModel | None = None, say_model: bool = True
    ) -> dict[str, float] | None:
        """Runs the "validation" or "test" split; None when it has no batches. Collective.

        ``weights_step``: the step the model's weights are from, when not the current one;
        ``model``: which model it is, for the line (``test (best, step 38, the one export
        takes): ...``, unless not ``say_model``: there was no choice) and the record's
        ``model`` and ``exported``."""
        loader = self.loaders[stage]
        if len(loader) == 0:
            return None
        self.stage = stage
        self.model.eval()
        # The evaluation pipeline rewrites the sharded modules' forwards too: hand them over.
        handover = isinstance(self.train_pipeline, TrainPipelineSparseDist)
        if handover:
            self.train_pipeline.detach()
        # Under the training's autocast (--amp: bf16): an fp32 evaluation of a bf16
        # model ran at fp32's speed, several times slower at DLRMv2's size. The logits
        # then carry bf16's 8 significant bits: close scores tie in the AUROC.
        pipeline = self._pipeline("base" if self.config.pipeline == "base" else "sparse_dist", amp=self.config.amp)
        metrics = BinaryClassificationMetrics(self.env.device, self.config.auroc_bins, self.weighted)
        calibrating = stage == "validation" and self.config.calibrate != "none" and weights_step is None
        histogram = LogitHistogram(self.env.device) if calibrating else None
        self.source.unseen_counts(stage)  # counted from here: this evaluation's rows
        if self.zch is not None:
            self.zch.statistics.take_unseen()  # likewise (this rank's counts only: no collective)
        seen = self.source.seen_ids()
        if seen is not None:  # against every rank's training ids (collective)
            seen.merge(self._or_over_ranks(seen.packed()))
        batches = self._batches(loader)
        self.log.start_evaluation_progress(len(loader), stage)
        started = time.perf_counter()
        with torch.no_grad():
            while True:
                try:
                    _, logits, labels, *weights = pipeline.progress(batches)
                except StopIteration:
                    break
                metrics.update(logits, labels, *weights)
                if histogram is not None:
                    histogram.update(logits, labels, *weights)
                self.log.advance_evaluation()
        self.log.close_evaluation_progress()
        if handover:
            pipeline.detach()  # type: ignore[attr-defined]
            self.train_pipeline.attach(self.model)  # type: ignore[attr-defined]
        release_cache_line_locks(self.model)  # evaluation's forwards had no backward
        values = metrics.compute()
        seconds = time.perf_counter() - started  # the pipeline's batches and the metrics' sync included
        rate = values["num_samples"] / seconds if seconds > 0 else float("nan")
        step = self.step if weights_step is None else weights_step
        # --rolling_windows: validation is the window after the one just trained
        window = {"window": self.epoch + 1} if self.rolling_windows and stage == "validation" else {}
        binned = f" (binned, within {values['auroc_error_bound']:.1e})" if "auroc_error_bound" in values else ""
        weighted = f" (weighted by {self.config.data.weight_column})" if self.weighted else ""
        which = f" ({model.text()})" if model is not None and say_model else ""
        self.log.print(
            f"{stage}{which}{''.join(f' (window {w})' for w in window.values())}{weighted}: AUROC {values['auroc']:.4f}{binned} | log loss {values['log_loss']:.4f} | "
            f"accuracy {values['accuracy']:.4f} | NE {values['ne']:.4f} | calibration {values['calibration']:.4f} | "
            f"positive rate {values['positive_rate']:.4f} | {values['num_samples']} samples (step {step}) | "
            f"{rate:,.0f} records/s"
        )
        tested = (model or TestedModel("", step, False)).fields() if stage == "test" or model is not None else {}
        unseen = self._unseen_shares(stage)
        self.log.record(
            "eval",
            stage=stage,
            step=step,
            **window,
            **tested,
            **values,
            **({"unseen_share_by_feature": unseen} if unseen is not None else {}),
            records_per_sec=rate,
            seconds=seconds,
        )
        if unseen:
            self.log.print(
                f"{stage}: "
                + ("ids without a row" if self.zch is not None else "ids the training has not read")
                + " (unseen at serving): "
                + ", ".join(f"{name} {share:.2%}" for name, share in unseen.items())
            )
        if histogram is not None:
            self._fit_calibration(histogram, step)
        statistics = self.source.statistics(self.loaders["train"])
        if statistics is not None:
            fields, line = statistics
            self.log.record("data_statistics", stage=stage, step=step, **fields)
            self.log.print(line)
        self.stage = "training"
        return values

    def _unseen_shares(self, stage: str) -> dict[str, float] | None:
        """{feature: share of the evaluation's ids the training loaders had not read} of
        the features with some, over every rank (collective); None when not counted."""
        if self.zch is not None:  # the ids without a row when evaluated (never admitted, or evicted)
            group = self.process_group if self.env.world_size > 1 else None
            taken = self.zch.statistics.take_unseen(group)
            return {name: unseen / total for name, (unseen, total) in taken.items() if unseen and total}
        counts = self.source.unseen_counts(stage)
        seen = self.source.seen_ids()
        if counts is None or seen is None or not seen.holds_any():  # no training ids known: no count
            return None
        names, _, _ = counts
        gathered = all_gather(counts[1:])  # every rank's (its own included)
        unseen, ids = sum(u for u, _ in gathered), sum(i for _, i in gathered)
        return {name: float(n) / float(total) for name, n, total in zip(names, unseen, ids) if n and total}

    def _fit_calibration(self, histogram: LogitHistogram, step: int) -> None:
        """--calibrate: fits on this validation (collective), for the checkpoints of ``step``."""
        fitted = histogram.fit(self.config.calibrate, step)
        self._calibration = (step, fitted)
        if fitted is None:
            self.log.print("calibration: the validation split has one class only: nothing fitted")
            return
        self.log.print(f"calibration: {fitted.describe()}")
        self.log.record("calibration", **dataclasses.asdict(fitted))

    def _calibration_of_this_step(self) -> Calibration | None:
        """The --calibrate fit of the validation at the current step (the weights it was
        fitted on), else None: a checkpoint stores only the fit of its own weights."""
        if self._calibration is None or self._calibration[0] != self.step:
            return None
        return self._calibration[1]

    def evaluate_checkpoint(self) -> dict[str, float] | None:
        """--mode validate|test: evaluates the loaded weights on that split. Collective."""
        stage = "validation" if self.config.mode == "validate" else "test"
        model = None
        if self.weights_path is not None and self.weights_step is not None:
            kind, exported = export_role(self.weights_path)
            model = TestedModel(kind, self.weights_step, exported)
        values = self.evaluate(stage, weights_step=self.weights_step, model=model)
        self.log.close()
        return values

    @contextlib.contextmanager
    def in_stage(self, stage: str) -> Iterator[None]:
        """Inside the block the run is at ``stage`` (what `position`, so a failure or
        SIGTERM, reports); after it, at the stage before. An exception leaves the stage
        as it was when it was raised, for the report."""
        previous, self.stage = self.stage, stage
        yield
        self.stage = previous

    def position(self) -> str:
        """Where the run is, for error messages: ``step 37 (epoch 0, training)``, where
        step is the number of training steps completed."""
        return f"step {self.step} (epoch {self.epoch}, {self.stage})"

    def _final_evaluation(self, result: RunResult) -> tuple[str, dict[str, float]] | None:
        """(stage, metrics) of the run's last evaluation: the test split (the model export
        takes, when the final weights were tested too), else the last validation
        (window); None without one."""
        final = next(
            (
                (stage, values)
                for stage, values in (("test", result.test), ("validation", result.validation))
                if values is not None
            ),
            None,
        )
        if final is not None and self.rolling_windows and result.windows and final[0] == "validation":
            final = (f"window {max(result.windows)}", final[1])
        return final

    def _warn_miscalibration(self, result: RunResult) -> None:
        final = self._final_evaluation(result)
        warning = miscalibration_warning(*final, self.config.calibrate) if final else None
        if warning:
            self.log.print(warning)

    def _check_divergence(self, result: RunResult) -> None:
        """Raises DivergedError when the finished run diverged (every rank alike: the
        losses and metrics are the ranks' means and sums); with --allow_divergence,
        a warning line instead. Recorded in the run log either way."""
        reason = diverged(result.train_losses, self._final_evaluation(result), self.source.labels_carry_signal)
        if reason is None:
            return
        allowed = self.config.allow_divergence
        self.log.record("diverged", reason=reason, allowed=allowed)
        if not allowed:
            raise DivergedError(
                f"the run diverged: {reason}: {divergence_advice(self.config.optim)} "
                f"({flag_of(TrainConfig, 'allow_divergence').option}: exit 0 with a warning)"
            )
        self.log.print(f"warning: the run diverged: {reason} ({flag_of(TrainConfig, 'allow_divergence').option})")

    def _summary(self, result: RunResult) -> None:
        rate = self._train_records / self._train_seconds if self._train_seconds > 0 else 0.0
        result.records_per_sec = rate
        peaks = gather_peak_memory(self.env)
        best = ""
        tested = result.test_model is not None and result.test_model.step == result.best_step
        if result.best_step is not None:
            best = (
                f" | best step {result.best_step} (validation {self.config.early_stopping.metric} "
                f"{self.best.stopping.best_value:.4f}{', stopped early' if result.stopped_early else ''}"
                f"{'; tested' if tested else ''})"
            )
        evaluated = self._closing_figures(result)
        self.log.print(
            f"done: {result.steps} steps, {self._train_records} records in {self._train_seconds:.1f} s of training "
            f"({rate:,.0f} records/s, evaluation excluded) | {evaluated or 'no window evaluated'}{best} | "
            "peak memory " + ", ".join(f"rank {r}: {format_bytes(b)}" for r, b in enumerate(peaks))
        )
        self.log.record(
            "summary",
            steps=result.steps,
            train_seconds=self._train_seconds,
            records_per_sec=rate,
            validation=result.validation,
            test=result.test,
            peak_memory_bytes=peaks,
            best_step=result.best_step,
            best_validation=result.best_validation,
            stopped_early=result.stopped_early,
            target_reached=result.target_reached,
            time_to_target_s=result.time_to_target_s,
            records_to_target=result.records_to_target,
            windows=[
                {
                    "window": w,
                    **v,
                    "step": result.window_steps[w],
                    "exported": result.window_steps[w] == result.export_step,
                }
                for w, v in result.windows.items()
            ]
            if self.rolling_windows
            else None,
            test_model=(
                None if result.test_model is None else {**result.test_model.fields(), "step": result.test_model.step}
            ),
            final_test=result.final_test,
            export_step=result.export_step,
        )

    def _closing_figures(self, result: RunResult) -> str:
        """The done line's figures, each saying which model it is once there is a
        choice (a best model kept, or a checkpoint directory to export from): ``test
        (best, step 38, the one export takes) AUROC ... | test (final, step 57) AUROC ...``."""
        if self.rolling_windows:

            def window(w: int) -> str:
                exported = result.window_steps[w] == result.export_step
                return f"window {w}" + (f" (step {result.window_steps[w]}, the one export takes)" if exported else "")

            return " | ".join(format_metrics(window(w), v) for w, v in result.windows.items())
        tested = result.test_model
        if tested is None or (result.final_test is None and result.export_step is None):
            return format_metrics("test", result.test)
        line = format_metrics(f"test ({tested.text()})", result.test)
        if result.final_test is not None:
            final = TestedModel("final", result.steps, result.export_step == result.steps)
            line += " | " + format_metrics(f"test ({final.text()})", result.final_test)
        return line
