"""The one configuration object a training run is driven by."""

from dataclasses import dataclass, field
from typing import List, Optional

from common.errors import BadInput
from data.config import DataConfig
from models.config import ModelConfig
from sharding_plans.constraints import ShardingConstraints, check_table_precision

OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")
DENSE_OPTIMIZERS = ("sgd", "adagrad", "adam")
DEVICES = ("auto", "cpu", "cuda")
MODES = ("train", "validate", "test", "inference_benchmark")
PIPELINES = ("sparse_dist", "semi_sync", "prefetch", "base")
# torchrec's default: TrainPipelineSemiSync synchronizes every step before this batch.
SEMI_SYNC_START_BATCH = 900


@dataclass
class OptimizerConfig:
    """Optimizers and learning-rate schedule.

    Args:
        optimizer: the fused embedding optimizer: sgd, adagrad or rowwise_adagrad.
        dense_optimizer: optimizer of the MLPs (None: sgd for sgd, adagrad otherwise).
        learning_rate: base learning rate, shared by both optimizers.
        eps: epsilon of the Adagrad variants (and Adam).
        lr_warmup_steps: linear warm-up from base/W to base over W steps.
        lr_decay_start: step at which polynomial decay begins (0 with lr_decay_steps 0: none).
        lr_decay_steps: steps of polynomial (power 2) decay down to lr_decay_floor.
        lr_decay_floor: learning rate after the decay, as a fraction of the base.
        weight_decay: L2 weight decay of the dense optimizer (wd * w added to the gradient).
        embedding_weight_decay: L2 weight decay of the embedding optimizer, applied to
            the rows a batch looks up (FBGEMM's L2 mode; rowwise_adagrad only).
    """

    optimizer: str = "sgd"
    dense_optimizer: Optional[str] = None
    learning_rate: float = 15.0
    eps: float = 1e-8
    lr_warmup_steps: int = 0
    lr_decay_start: int = 0
    lr_decay_steps: int = 0
    lr_decay_floor: float = 0.0
    weight_decay: float = 0.0
    embedding_weight_decay: float = 0.0

    @property
    def resolved_dense_optimizer(self) -> str:
        if self.dense_optimizer is not None:
            return self.dense_optimizer
        return "sgd" if self.optimizer == "sgd" else "adagrad"

    def validate(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise BadInput(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.dense_optimizer is not None and self.dense_optimizer not in DENSE_OPTIMIZERS:
            raise BadInput(
                f"--dense_optimizer must be one of {', '.join(DENSE_OPTIMIZERS)}, "
                f"got {self.dense_optimizer!r}"
            )
        if not self.learning_rate > 0:
            raise BadInput(f"--learning_rate must be positive, got {self.learning_rate}")
        if not self.eps > 0:
            raise BadInput(f"--eps must be positive, got {self.eps}")
        for flag in ("lr_warmup_steps", "lr_decay_start", "lr_decay_steps"):
            if getattr(self, flag) < 0:
                raise BadInput(f"--{flag} must not be negative, got {getattr(self, flag)}")
        if self.lr_decay_steps > 0 and self.lr_decay_start < self.lr_warmup_steps:
            raise BadInput(
                f"--lr_decay_start ({self.lr_decay_start}) must not come before the end of "
                f"warm-up (--lr_warmup_steps {self.lr_warmup_steps})"
            )
        if not 0.0 <= self.lr_decay_floor <= 1.0:
            raise BadInput(f"--lr_decay_floor must be in [0, 1], got {self.lr_decay_floor}")
        for flag in ("weight_decay", "embedding_weight_decay"):
            if not getattr(self, flag) >= 0.0:
                raise BadInput(f"--{flag} must not be negative, got {getattr(self, flag)}")
        if self.embedding_weight_decay > 0 and self.optimizer != "rowwise_adagrad":
            raise BadInput(f"--embedding_weight_decay: FBGEMM's fused {self.optimizer} kernel has no weight decay "
                             "(of the CPU and GPU kernels only rowwise_adagrad has one): use --optimizer rowwise_adagrad")


@dataclass
class CheckpointConfig:
    """Where checkpoints go and what to load.

    Args:
        checkpoint_dir: directory (any iopath path) of step_<N> checkpoints.
        checkpoint_every_n_steps: save every N training steps.
        checkpoint_at_epoch_end: save after every epoch.
        keep_last_n_checkpoints: complete checkpoints to keep (0: all).
        resume: continue from the newest complete checkpoint in checkpoint_dir
            (from scratch when there is none).
        restore_checkpoint_path: load only the weights of this checkpoint.
    """

    checkpoint_dir: Optional[str] = None
    checkpoint_every_n_steps: Optional[int] = None
    checkpoint_at_epoch_end: bool = False
    keep_last_n_checkpoints: int = 0
    resume: bool = False
    restore_checkpoint_path: Optional[str] = None

    @property
    def saving(self) -> bool:
        return self.checkpoint_every_n_steps is not None or self.checkpoint_at_epoch_end

    def validate(self) -> None:
        if self.checkpoint_every_n_steps is not None and self.checkpoint_every_n_steps <= 0:
            raise BadInput(f"--checkpoint_every_n_steps must be positive, got {self.checkpoint_every_n_steps}")
        if self.keep_last_n_checkpoints < 0:
            raise BadInput(f"--keep_last_n_checkpoints must not be negative, got {self.keep_last_n_checkpoints}")
        for flag, needed in (("checkpoint_every_n_steps", self.checkpoint_every_n_steps is not None),
                             ("checkpoint_at_epoch_end", self.checkpoint_at_epoch_end),
                             ("resume", self.resume)):
            if needed and not self.checkpoint_dir:
                raise BadInput(f"--{flag} needs --checkpoint_dir")
        if self.resume and self.restore_checkpoint_path:
            raise BadInput("give --resume (full state) or --restore_checkpoint_path (weights only), not both")


EARLY_STOPPING_METRICS = ("auroc", "log_loss", "ne")


@dataclass
class EarlyStoppingConfig:
    """Stopping when validation stops improving, and keeping the best model.

    Args:
        patience: validations without improvement before training stops (None: never
            stop early, and no best model is kept; 0 stops at the first one).
        metric: the monitored validation metric: auroc (higher is better), log_loss or
            ne (lower is better).
        min_delta: how much the metric must beat the best so far to count as improved.
    """

    patience: Optional[int] = None
    metric: str = "auroc"
    min_delta: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.patience is not None

    def validate(self) -> None:
        if self.patience is not None and self.patience < 0:
            raise BadInput(f"--early_stopping_patience must not be negative, got {self.patience}")
        if self.metric not in EARLY_STOPPING_METRICS:
            raise BadInput(f"--early_stopping_metric must be one of {', '.join(EARLY_STOPPING_METRICS)}, "
                             f"got {self.metric!r}")
        if not self.min_delta >= 0:
            raise BadInput(f"--early_stopping_min_delta must not be negative, got {self.min_delta}")


@dataclass
class InferenceBenchmarkConfig:
    """--mode inference_benchmark: forward-only timing per batch size.

    Args:
        batch_sizes: rows per rank of each timed batch size.
        iterations: timed forwards per batch size.
        warmup: untimed forwards before them.
    """

    batch_sizes: List[int] = field(default_factory=lambda: [1, 64, 4096])
    iterations: int = 20
    warmup: int = 3

    def validate(self) -> None:
        if not self.batch_sizes or min(self.batch_sizes) <= 0:
            raise BadInput(f"--inference_benchmark_batch_sizes must be positive, got {self.batch_sizes}")
        if self.iterations <= 0:
            raise BadInput(f"--inference_benchmark_iterations must be positive, got {self.iterations}")
        if self.warmup < 0:
            raise BadInput(f"--inference_benchmark_warmup must not be negative, got {self.warmup}")


@dataclass
class TrainConfig:
    """Everything a run needs: model, data, optimizers and the run's own options.

    Args:
        model: the architecture (tables sized from the data when not given).
        data: data source and batching.
        optim: optimizers and LR schedule.
        epochs: passes over the training split.
        max_table_rows: the cap every table's rows were taken down to (model's sizes
            already capped; the loaders take ids modulo them), or None.
        seed: seeds model init, data order and random data.
        validation_freq_within_epoch: validate every N training steps (and at epoch end).
        log_every_n_steps: steps per progress line and JSON record.
        auroc_bins: evaluate the AUROC from a histogram of this many bins
            (training/binned_auroc.py); None: the exact AUROC.
        log_path: JSON-lines log file (rank 0 writes it).
        print_lr: print the learning rate every step.
        print_sharding_plan: print the plan and per-rank memory.
        allow_tf32: TF32 matmuls on CUDA.
        device: auto, cpu or cuda.
        checkpoint: checkpoint saving and loading.
        mode: train, validate / test a checkpoint's weights, or inference_benchmark
            (a checkpoint's weights when one is given, else a freshly built model).
        amp: bf16 autocast of the forward (dense part).
        pipeline: sparse_dist, semi_sync, prefetch or base (training/pipelines.py).
        semi_sync_start_batch: the batch from which semi_sync runs semi-synchronously
            (before it, it synchronizes every step).
        tensorboard_dir: TensorBoard event files (rank 0).
        sharding_plan: a plan file to use instead of planning.
        sharding_constraints: sharding types and kernels the planner may use.
        inference_benchmark: batch sizes and iterations of --mode inference_benchmark.
        early_stopping: stop when validation stops improving; test the best model.
        validation_auroc: stop at the first validation whose AUROC reaches this (MLPerf's
            convergence target), reporting the time and records it took.
        validate_at_epoch_end: validate after every epoch.
        test_at_end: evaluate the test split when training ends.
        print_progress: show the progress bar even when stderr is not a terminal.
        collect_multi_hot_freqs_stats: count every table's ids in the training batches
            and write the counts per rank (training/id_frequencies.py).
        dropout: dropout after the over arch's hidden layers in training (0: none).
    """

    model: ModelConfig
    data: DataConfig
    optim: OptimizerConfig = field(default_factory=OptimizerConfig)
    epochs: int = 1
    max_table_rows: Optional[int] = None
    seed: int = 0
    validation_freq_within_epoch: Optional[int] = None
    log_every_n_steps: int = 100
    auroc_bins: Optional[int] = None
    log_path: Optional[str] = None
    print_lr: bool = False
    print_sharding_plan: bool = False
    allow_tf32: bool = False
    device: str = "auto"
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    mode: str = "train"
    amp: bool = False
    pipeline: str = "sparse_dist"
    semi_sync_start_batch: int = SEMI_SYNC_START_BATCH
    tensorboard_dir: Optional[str] = None
    sharding_plan: Optional[str] = None
    sharding_constraints: ShardingConstraints = field(default_factory=ShardingConstraints)
    inference_benchmark: InferenceBenchmarkConfig = field(default_factory=InferenceBenchmarkConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    validation_auroc: Optional[float] = None
    validate_at_epoch_end: bool = True
    test_at_end: bool = True
    print_progress: bool = False
    collect_multi_hot_freqs_stats: bool = False
    dropout: float = 0.0

    def validate(self) -> None:
        """Raises BadInput with one line naming the offending flag."""
        self.model.validate()
        self.data.validate()
        self.optim.validate()
        if self.epochs <= 0:
            raise BadInput(f"--epochs must be positive, got {self.epochs}")
        if self.validation_freq_within_epoch is not None and self.validation_freq_within_epoch <= 0:
            raise BadInput(
                f"--validation_freq_within_epoch must be positive, got {self.validation_freq_within_epoch}"
            )
        if self.log_every_n_steps <= 0:
            raise BadInput(f"--log_every_n_steps must be positive, got {self.log_every_n_steps}")
        if self.auroc_bins is not None and self.auroc_bins < 2:
            raise BadInput(f"--auroc_bins must be at least 2, got {self.auroc_bins}")
        if self.device not in DEVICES:
            raise BadInput(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        self.checkpoint.validate()
        if self.pipeline not in PIPELINES:
            raise BadInput(f"--pipeline must be one of {', '.join(PIPELINES)}, got {self.pipeline!r}")
        if self.semi_sync_start_batch < 0:
            raise BadInput(f"--semi_sync_start_batch must be 0 or more, got {self.semi_sync_start_batch}")
        if self.mode not in MODES:
            raise BadInput(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        self.inference_benchmark.validate()
        self.early_stopping.validate()
        if not 0.0 <= self.dropout < 1.0:
            raise BadInput(f"--dropout must be in [0, 1), got {self.dropout}")
        if self.validation_auroc is not None and not 0.0 < self.validation_auroc <= 1.0:
            raise BadInput(f"--validation_auroc must be in (0, 1], got {self.validation_auroc}")
        watchers = [flag for flag, on in (("--early_stopping_patience", self.early_stopping.enabled),
                                          ("--validation_auroc", self.validation_auroc is not None)) if on]
        for flag in watchers:
            if self.data.limit_val_batches == 0:
                raise BadInput(f"{flag} watches validation: it cannot be combined with --limit_val_batches 0")
            if not self.validate_at_epoch_end and self.validation_freq_within_epoch is None:
                raise BadInput(f"{flag} watches validation, which never runs: give --evaluate_on_epoch_end "
                                 "or --validation_freq_within_epoch")
        if self.mode in ("validate", "test") and not (self.checkpoint.restore_checkpoint_path or self.checkpoint.checkpoint_dir):
            raise BadInput(f"--mode {self.mode} evaluates a checkpoint: give --restore_checkpoint_path, "
                             "or --checkpoint_dir for its newest one")
        self.sharding_constraints.validate(self.model.table_names)
        for table in self.model.table_names:
            kernel = self.sharding_constraints.compute_kernel(table)
            check_table_precision(table, "data_parallel" if kernel == "dense" else
                                  self.sharding_constraints.sharding_type(table),
                                  self.model.embedding_precision, "--embedding_precision")
        if self.sharding_plan is not None and not self.sharding_constraints.empty:
            raise BadInput("--sharding_plan fixes the plan: it cannot be combined with --sharding_type or --compute_kernel")
