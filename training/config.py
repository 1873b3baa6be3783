"""The one configuration object a training run is driven by.

Every flag of the entry points is a field here (or in the model's, data's and
sharding's configs), declared once with its default and help (`common.config_flags`).
"""

import os
from dataclasses import dataclass, field
from typing import Any

from common.calibration import CALIBRATION_METHODS
from common.config_flags import FlagError, check_choices, flag, option
from common.run_log_file import check_appendable
from common.url_paths import check_url_path
from data.config import DataConfig
from data.profile import SizingFlags
from models.config import ModelConfig, TableSizes
from models.embedding_optimizer_config import EMBEDDING_OPTIMIZERS, EmbeddingOptimizerConfig
from sharding_plans.constraints import SEQUENCE_SHARDING_TYPES
from sharding_plans.types import ShardingConstraints, ShardingFlags

OPTIMIZERS = EMBEDDING_OPTIMIZERS
DENSE_OPTIMIZERS = ("sgd", "adagrad", "adam")
DEVICES = ("auto", "cpu", "cuda")
MODES = ("train", "validate", "test", "inference_benchmark")
PIPELINES = ("sparse_dist", "semi_sync", "prefetch", "base")
DENSE_PRECISIONS = ("fp32", "bf16")
# torchrec's default: TrainPipelineSemiSync synchronizes every step before this batch.
SEMI_SYNC_START_BATCH = 900
# float32 probabilities in [0.5, 1) are 2^-24 apart: more bins split no more pairs
# there, while the histogram (2 x bins int64, training/binned_auroc.py) grows past
# 256 MiB per rank, and the all-reduce and the AUROC's sums with it.
MAX_AUROC_BINS = 1 << 24


@dataclass
class OptimizerConfig(EmbeddingOptimizerConfig):
    """Optimizers and learning-rate schedule: the fused embedding optimizer's flags
    (`EmbeddingOptimizerConfig`), the dense (MLP) optimizer's and the schedule's
    (training/lr_schedule.py)."""

    dense_optimizer: str | None = flag(
        None, choices=DENSE_OPTIMIZERS, help="MLP optimizer (default: sgd with --optimizer sgd, else adagrad)"
    )
    lr_warmup_steps: int = flag(0, help="linear warm-up steps")
    lr_decay_start: int = flag(0, help="step at which polynomial decay starts")
    lr_decay_steps: int = flag(0, help="steps of power-2 polynomial decay (0: none)")
    lr_decay_floor: float = flag(0.0, help="final LR after decay, as a fraction of --learning_rate")
    weight_decay: float = flag(0.0, help="L2 weight decay of the dense (MLP) optimizer")

    @property
    def resolved_dense_optimizer(self) -> str:
        if self.dense_optimizer is not None:
            return self.dense_optimizer
        return "sgd" if self.optimizer == "sgd" else "adagrad"

    def validate(self) -> None:
        super().validate()
        for name in ("lr_warmup_steps", "lr_decay_start", "lr_decay_steps"):
            if getattr(self, name) < 0:
                raise FlagError(f"{option(self, name)} must not be negative, got {getattr(self, name)}")
        if self.lr_decay_steps > 0 and self.lr_decay_start < self.lr_warmup_steps:
            raise FlagError(
                f"{option(self, 'lr_decay_start')} ({self.lr_decay_start}) must not come before the end of "
                f"warm-up ({option(self, 'lr_warmup_steps')} {self.lr_warmup_steps})"
            )
        if not 0.0 <= self.lr_decay_floor <= 1.0:
            raise FlagError(f"{option(self, 'lr_decay_floor')} must be in [0, 1], got {self.lr_decay_floor}")
        if not self.weight_decay >= 0.0:
            raise FlagError(f"{option(self, 'weight_decay')} must not be negative, got {self.weight_decay}")


@dataclass
class CheckpointConfig:
    """Where checkpoints go (step_<N> directories), when they are saved, and what a
    run loads: the full state to resume, or only a checkpoint's weights."""

    checkpoint_dir: str | None = flag(None, help="directory of checkpoints (any iopath path)")
    checkpoint_every_n_steps: int | None = flag(None, help="save a checkpoint every N steps")
    checkpoint_every_n_minutes: float | None = flag(
        None,
        help="save a checkpoint at the first step M minutes after the previous one (or the start), by rank 0's clock",
    )
    checkpoint_at_epoch_end: bool = flag(False, help="save a checkpoint after every epoch")
    keep_last_n_checkpoints: int = flag(
        0,
        help="complete checkpoints to keep (0: all; never the best)",
        name="keep_last_n",
        former_names=("keep_last_n_checkpoints",),
    )
    async_checkpoint: bool = flag(
        False,
        help="write checkpoints in the background while training continues (staged to host memory, one save in flight)",
    )
    resume: bool = flag(
        False, help="continue from the newest complete checkpoint in --checkpoint_dir (from scratch when there is none)"
    )
    restore_checkpoint_path: str | None = flag(None, help="load only the weights of this checkpoint")
    warm_start: str | None = flag(
        None,
        help="start a new run (step 0) from this checkpoint's weights (a directory: the checkpoint export takes); "
        "its tables may grow",
    )
    warm_start_optimizer: bool = flag(False, help="with --warm_start: carry its optimizer state too")

    @property
    def saving(self) -> bool:
        return (
            self.checkpoint_every_n_steps is not None
            or self.checkpoint_every_n_minutes is not None
            or self.checkpoint_at_epoch_end
        )

    def validate(self) -> None:
        if self.checkpoint_every_n_steps is not None and self.checkpoint_every_n_steps <= 0:
            raise FlagError(
                f"{option(self, 'checkpoint_every_n_steps')} must be positive, got {self.checkpoint_every_n_steps}"
            )
        if self.checkpoint_every_n_minutes is not None and not self.checkpoint_every_n_minutes > 0:
            raise FlagError(
                f"{option(self, 'checkpoint_every_n_minutes')} must be positive, got {self.checkpoint_every_n_minutes}"
            )
        if self.keep_last_n_checkpoints < 0:
            raise FlagError(
                f"{option(self, 'keep_last_n_checkpoints')} must not be negative, got {self.keep_last_n_checkpoints}"
            )
        for name, needed in (
            ("checkpoint_every_n_steps", self.checkpoint_every_n_steps is not None),
            ("checkpoint_every_n_minutes", self.checkpoint_every_n_minutes is not None),
            ("checkpoint_at_epoch_end", self.checkpoint_at_epoch_end),
            ("async_checkpoint", self.async_checkpoint),
            ("resume", self.resume),
        ):
            if needed and not self.checkpoint_dir:
                raise FlagError(f"{option(self, name)} needs {option(self, 'checkpoint_dir')}")
        for name in ("checkpoint_dir", "restore_checkpoint_path", "warm_start"):  # iopath paths: printed and recorded
            check_url_path(getattr(self, name) or "", option(self, name), FlagError)
        if self.resume and self.restore_checkpoint_path:
            raise FlagError(
                f"give {option(self, 'resume')} (full state) or {option(self, 'restore_checkpoint_path')} "
                "(weights only), not both"
            )
        self._check_warm_start()

    def check_zch_cadence(self, eviction_interval: int) -> None:
        """--id_hashing zch: a resume is exact only from a checkpoint at a multiple of
        --zch_eviction_interval (the ids recorded since the last admission are not module
        state, docs/zch.md): a step cadence that is not one is refused (the minute
        cadence waits for the next multiple, training/trainer.py)."""
        every = self.checkpoint_every_n_steps
        if every is not None and every % eviction_interval:
            raise FlagError(
                f"{option(self, 'checkpoint_every_n_steps')} {every} must be a multiple of "
                f"--zch_eviction_interval {eviction_interval} under --id_hashing zch: a checkpoint between two "
                "admissions loses the ids recorded since the last one, so a resume from it would not be exact"
            )

    def _check_warm_start(self) -> None:
        """--warm_start starts a new run: refuses what would load other weights or mix its
        checkpoints with the run it starts from. (With --resume, a checkpoint of this run
        in --checkpoint_dir wins: a warm-started run killed midway continues itself.)"""
        warm = option(self, "warm_start")
        if self.warm_start_optimizer and not self.warm_start:
            raise FlagError(f"{option(self, 'warm_start_optimizer')} needs {warm}")
        if not self.warm_start:
            return
        if self.restore_checkpoint_path:
            raise FlagError(
                f"give {warm} (a new run from a checkpoint's weights) or "
                f"{option(self, 'restore_checkpoint_path')} (the weights of this run's model), not both"
            )
        if self.checkpoint_dir:
            start, directory = _normalized(self.warm_start), _normalized(self.checkpoint_dir)
            parent, name = start.rsplit("/", 1)
            if directory == start or (directory == parent and name.startswith("step_")):
                raise FlagError(
                    f"{warm} {self.warm_start} starts a new run: give it a {option(self, 'checkpoint_dir')} of "
                    f"its own, not {self.checkpoint_dir}, which holds the checkpoint it starts from"
                )


def _normalized(path: str) -> str:
    """A path as two spellings of one directory compare equal (iopath URLs as given)."""
    return path.rstrip("/") if "://" in path else os.path.normpath(os.path.abspath(path))


EARLY_STOPPING_METRICS = ("auroc", "log_loss", "ne")


@dataclass
class EarlyStoppingConfig:
    """Stopping when validation stops improving, and keeping the best model; without
    a patience (None) training never stops early and keeps no best model."""

    patience: int | None = flag(
        None,
        name="early_stopping_patience",
        help="stop after N validations without improvement; test (and mark in --checkpoint_dir) the best model",
    )
    metric: str = flag(
        "auroc",
        choices=EARLY_STOPPING_METRICS,
        name="early_stopping_metric",
        help="validation metric early stopping watches: auroc (higher is better), log_loss or ne",
    )
    min_delta: float = flag(
        0.0,
        name="early_stopping_min_delta",
        help="how much the metric must beat the best so far to count as an improvement",
    )

    @property
    def enabled(self) -> bool:
        return self.patience is not None

    def validate(self) -> None:
        check_choices(self)
        if self.patience is not None and self.patience < 0:
            raise FlagError(f"{option(self, 'patience')} must not be negative, got {self.patience}")
        if not self.min_delta >= 0:
            raise FlagError(f"{option(self, 'min_delta')} must not be negative, got {self.min_delta}")


@dataclass
class InferenceBenchmarkConfig:
    """--mode inference_benchmark: forward-only timing per batch size."""

    batch_sizes: list[int] = flag(
        [1, 64, 4096],
        name="inference_benchmark_batch_sizes",
        help="rows per rank of each batch size timed by --mode inference_benchmark",
    )
    iterations: int = flag(20, name="inference_benchmark_iterations", help="timed forwards per batch size")
    warmup: int = flag(3, name="inference_benchmark_warmup", help="untimed forwards before them")

    def validate(self) -> None:
        if not self.batch_sizes or min(self.batch_sizes) <= 0:
            raise FlagError(f"{option(self, 'batch_sizes')} must be positive, got {self.batch_sizes}")
        if self.iterations <= 0:
            raise FlagError(f"{option(self, 'iterations')} must be positive, got {self.iterations}")
        if self.warmup < 0:
            raise FlagError(f"{option(self, 'warmup')} must not be negative, got {self.warmup}")


@dataclass
class ReferenceEvaluation:
    """The MLPerf DLRM-DCNv2 reference's evaluation switches. Without either, this
    project validates after every epoch and tests at the end; with one, the
    reference's schedule applies: only what is asked for."""

    evaluate_on_epoch_end: bool = flag(
        False,
        help="validate after every epoch; with this or --evaluate_on_training_end, the reference's "
        "schedule applies (default without either: validate after every epoch and test at the end)",
    )
    evaluate_on_training_end: bool = flag(False, help="evaluate the test split when training ends (see above)")

    def schedule(self) -> tuple[bool, bool]:
        """(validate at epoch end, test at the end)."""
        reference = self.evaluate_on_epoch_end or self.evaluate_on_training_end
        return self.evaluate_on_epoch_end or not reference, self.evaluate_on_training_end or not reference


@dataclass
class TrainConfig:
    """Everything a run needs: model, data, optimizers and the run's own options (its
    flag fields' help says what each is).

    Args:
        model: the architecture (tables sized from the data when not given).
        data: data source and batching.
        optim: optimizers and LR schedule.
        tables: the table-size flags (the model's sizes are already resolved and
            capped from them; the loaders take ids modulo the capped sizes).
        checkpoint: checkpoint saving and loading.
        sharding_constraints: sharding types and kernels the planner may use.
        inference_benchmark: batch sizes and iterations of --mode inference_benchmark.
        early_stopping: stop when validation stops improving; test the best model.
        validate_at_epoch_end: validate after every epoch.
        test_at_end: evaluate the test split when training ends.
        recipe: the ``--recipe`` the run was given, or None.
        recipe_settings: {flag: value} of what the recipe set (the command line's
            flags win over it).
    """

    model: ModelConfig
    data: DataConfig
    optim: OptimizerConfig = field(default_factory=OptimizerConfig)
    epochs: int = flag(1, help="passes over the training split")
    tables: TableSizes = field(default_factory=TableSizes)
    table_sizing: SizingFlags = field(default_factory=SizingFlags)
    seed: int = flag(0, help="seeds model init, data order and random data")
    validation_freq_within_epoch: int | None = flag(None, help="validate every N training steps")
    log_every_n_steps: int = flag(100, help="steps per progress line / JSON record")
    auroc_bins: int | None = flag(
        None,
        help="AUROC from a histogram of this many probability bins, with its "
        "error bound (default: exact, keeping every prediction)",
    )
    log_path: str | None = flag(None, help="JSON-lines log file written by rank 0")
    print_lr: bool = flag(False, help="print the learning rate every step")
    print_sharding_plan: bool = flag(False, help="print the sharding plan and per-rank memory")
    allow_tf32: bool = flag(False, help="allow TF32 matmuls (CUDA Ampere or newer)")
    device: str = flag("auto", choices=DEVICES, help="cuda when available with auto")
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    mode: str = flag(
        "train", choices=MODES, help="train, evaluate a checkpoint on validation/test data, or inference_benchmark"
    )
    dense_precision: str = flag(
        "fp32",
        choices=DENSE_PRECISIONS,
        alias=("amp", "bf16"),
        help="bf16: autocast of the MLPs and interaction (the tables keep "
        "--embedding_precision); on CPU it needs bf16 units (AVX-512 BF16 or AMX)",
    )
    compile: bool = flag(
        False,
        help="torch.compile the MLPs and interaction (the sharded embeddings stay eager); "
        "the first steps of each batch shape compile",
    )
    pipeline: str = flag(
        "sparse_dist",
        choices=PIPELINES,
        help="train pipeline: sparse_dist (default), base, or the CUDA-only semi_sync and prefetch",
    )
    semi_sync_start_batch: int = flag(
        SEMI_SYNC_START_BATCH,
        help="--pipeline semi_sync synchronizes every step before this batch (torchrec's default)",
    )
    tensorboard_dir: str | None = flag(None, help="write TensorBoard event files here (rank 0)")
    sharding_plan: str | None = flag(
        None, help="use this plan file (python -m sharding_plans plan --output) instead of planning"
    )
    sharding_constraints: ShardingConstraints = field(default_factory=ShardingConstraints)
    inference_benchmark: InferenceBenchmarkConfig = field(default_factory=InferenceBenchmarkConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    validation_auroc: float | None = flag(
        None, help="stop at the first validation whose AUROC reaches this; report the time and records it took"
    )
    validate_at_epoch_end: bool = True
    test_at_end: bool = True
    calibrate: str = flag(
        "none",
        choices=CALIBRATION_METHODS,
        help="fit a calibration of the probabilities on each validation (platt: a logistic fit "
        "on the logit; isotonic: pool-adjacent-violators); the checkpoints store it and "
        "the exported model applies it (none: the model's own probabilities)",
    )
    allow_divergence: bool = flag(
        False,
        help="exit 0 (with a warning) from a run that ends no better than a "
        "constant predictor or whose loss grew 100-fold (else exit code 4)",
    )
    print_progress: bool = flag(False, help="show the progress bar even when stderr is not a terminal")
    collect_multi_hot_freqs_stats: bool = flag(
        False, help="count every table's ids in the training batches; write multi_hot_freqs_rank_<r>.npz per rank"
    )
    dropout: float = flag(0.0, help="dropout after the over arch's hidden layers in training")
    recipe: str | None = None
    recipe_settings: dict[str, Any] = field(default_factory=dict)

    @property
    def amp(self) -> bool:
        """Whether the dense part's forward runs under bf16 autocast."""
        return self.dense_precision == "bf16"

    def _check_zch(self) -> None:
        """--id_hashing zch: one line where this stack's torchrec lacks the managed-collision
        modules, or where the run asks what they cannot do (docs/zch.md)."""
        if getattr(self.data, "id_hashing", None) != "zch":
            return
        from models.zch import zch_unavailable

        missing = zch_unavailable()
        if missing:
            raise FlagError(missing)
        zch = option(self.data, "id_hashing") + " zch"
        if self.model.sequence_columns:
            raise FlagError(f"{zch} cannot be combined with --sequence_columns (histories read plain tables)")
        for table in self.model.table_names:  # the managed-collision sharder takes row_wise only (docs/zch.md)
            kind = self.sharding_constraints.sharding_type(table)
            if kind not in (None, "row_wise"):
                raise FlagError(
                    f"{option(ShardingFlags, 'sharding_type')} {kind} ({table}): {zch} tables are sharded row_wise only"
                )
        if self.sharding_plan is not None:
            raise FlagError(
                f"{zch} cannot be combined with {option(self, 'sharding_plan')} in this release: "
                "its tables are planned row_wise"
            )
        if self.optim.optimizer == "rowwise_adagrad" and self._trains_on_cpu():
            # An admitted or evicted row's optimizer state is reset by fbgemm::reset_weight_momentum,
            # which has no CPU kernel in fbgemm-gpu-cpu 1.8: the first step would fail.
            raise FlagError(
                f"{option(self.optim, 'optimizer')} rowwise_adagrad with {zch} on CPU: FBGEMM has no CPU kernel "
                "to reset an admitted or evicted row's optimizer state; use adagrad or sgd, or train on CUDA"
            )
        self.checkpoint.check_zch_cadence(self.data.zch_eviction_interval)

    def _trains_on_cpu(self) -> bool:
        """--device cpu, or auto without CUDA (as training.distributed resolves it)."""
        if self.device != "auto":
            return self.device == "cpu"
        import torch  # only here: the config is read by components that import no torch

        return not torch.cuda.is_available()

    @property
    def max_table_rows(self) -> int | None:
        return self.tables.max_table_rows

    def validate(self) -> None:
        """Raises FlagError with one line naming the offending flag."""
        self.model.validate()
        self.data.validate()
        self.optim.validate()
        self.tables.validate()
        check_choices(self)
        for name in ("epochs", "validation_freq_within_epoch", "log_every_n_steps"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise FlagError(f"{option(self, name)} must be positive, got {value}")
        if self.auroc_bins is not None and not 2 <= self.auroc_bins <= MAX_AUROC_BINS:
            raise FlagError(
                f"{option(self, 'auroc_bins')} must be in [2, {MAX_AUROC_BINS}] (2^24 bins are as fine "
                f"as float32 probabilities above 0.5, and hold 256 MiB of counts), got {self.auroc_bins}"
            )
        self.checkpoint.validate()
        if self.semi_sync_start_batch < 0:
            raise FlagError(
                f"{option(self, 'semi_sync_start_batch')} must be 0 or more, got {self.semi_sync_start_batch}"
            )
        self.inference_benchmark.validate()
        self.early_stopping.validate()
        if not 0.0 <= self.dropout < 1.0:
            raise FlagError(f"{option(self, 'dropout')} must be in [0, 1), got {self.dropout}")
        auroc = option(self, "validation_auroc")
        if self.validation_auroc is not None and not 0.0 < self.validation_auroc <= 1.0:
            raise FlagError(f"{auroc} must be in (0, 1], got {self.validation_auroc}")
        watchers = [
            name
            for name, on in (
                (option(self.early_stopping, "patience"), self.early_stopping.enabled),
                (auroc, self.validation_auroc is not None),
            )
            if on
        ]
        for name in watchers:
            if self.data.limit_val_batches == 0:
                raise FlagError(
                    f"{name} watches validation: it cannot be combined with {option(self.data, 'limit_val_batches')} 0"
                )
            if not self.validate_at_epoch_end and self.validation_freq_within_epoch is None:
                raise FlagError(
                    f"{name} watches validation, which never runs: give "
                    f"{option(ReferenceEvaluation, 'evaluate_on_epoch_end')} "
                    f"or {option(self, 'validation_freq_within_epoch')}"
                )
        if self.checkpoint.warm_start and self.mode != "train":
            raise FlagError(
                f"{option(self.checkpoint, 'warm_start')} starts a training run: {option(self, 'mode')} "
                f"{self.mode} takes a checkpoint with {option(self.checkpoint, 'restore_checkpoint_path')}"
            )
        if self.mode in ("validate", "test") and not (
            self.checkpoint.restore_checkpoint_path or self.checkpoint.checkpoint_dir
        ):
            raise FlagError(
                f"{option(self, 'mode')} {self.mode} evaluates a checkpoint: give "
                f"{option(self.checkpoint, 'restore_checkpoint_path')}, "
                f"or {option(self.checkpoint, 'checkpoint_dir')} for its newest one"
            )
        self._check_rolling_windows()
        self._check_zch()
        if self.log_path:  # before anything is written: a run appends to it
            check_appendable(self.log_path, option(self, "log_path"), FlagError)
        check_url_path(self.tensorboard_dir or "", option(self, "tensorboard_dir"), FlagError)  # may be a URL
        self.sharding_constraints.validate(self.model.table_names)
        for history, item in self.model.sequences:  # sharding_plans/sharders.py says why
            table = f"t_{item}"
            sharding = self.sharding_constraints.sharding_type(table)
            if sharding is not None and sharding not in SEQUENCE_SHARDING_TYPES:
                raise FlagError(
                    f"{option(ShardingFlags, 'sharding_type')}: table {table} serves the history {history} "
                    f"(--sequence_columns) and cannot be {sharding}: give it table_wise, row_wise or "
                    f"column_wise ({table}=table_wise,...)"
                )
        self.sharding_constraints.check_precision(
            self.model.table_names, self.model.embedding_precision, option(self.model, "embedding_precision")
        )
        if self.sharding_plan is not None and not self.sharding_constraints.empty:
            raise FlagError(
                f"{option(self, 'sharding_plan')} fixes the plan: it cannot be combined with "
                f"{option(ShardingFlags, 'sharding_type')} or {option(ShardingFlags, 'compute_kernel')}"
            )

    def _check_rolling_windows(self) -> None:
        """--rolling_windows N: one pass per window, evaluated once on the next window;
        refuses what would train or evaluate anything else (what the windows are, the
        data source's check_flags refuses first)."""
        if self.data.rolling_windows is None:
            return
        flag_name = option(self.data, "rolling_windows")
        conflicts = [
            (
                self.mode != "train",
                f"{option(self, 'mode')} {self.mode}",
                "trains window after window (evaluate a checkpoint without it)",
            ),
            (self.epochs != 1, f"{option(self, 'epochs')} {self.epochs}", "makes one pass over each window"),
            (
                self.validation_freq_within_epoch is not None,
                option(self, "validation_freq_within_epoch"),
                "evaluates each window once, on the next window, when its pass ends",
            ),
            (
                self.early_stopping.enabled,
                option(self.early_stopping, "patience"),
                "evaluates every window on different data: its metrics do not rank one model against another",
            ),
            (
                self.validation_auroc is not None,
                option(self, "validation_auroc"),
                "trains every window (a target would end the protocol early)",
            ),
            (
                not self.validate_at_epoch_end,
                f"{option(ReferenceEvaluation, 'evaluate_on_training_end')} alone",
                "evaluates each window on the next one, and has no test split",
            ),
            (
                self.data.limit_val_batches == 0,
                f"{option(self.data, 'limit_val_batches')} 0",
                "evaluates each window on the next one",
            ),
        ]
        for refused, given, why in conflicts:
            if refused:
                raise FlagError(f"{flag_name} cannot be combined with {given}: it {why}")
