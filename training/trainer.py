"""The training loop: build, shard, train with the sparse-dist pipeline, evaluate.

Read top to bottom: `Trainer.__init__` builds everything from the config (model on
the meta device -> plan -> DistributedModelParallel -> optimizers -> loaders), `fit`
runs the epochs, `evaluate` runs a split through its own pipeline.
"""

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional

import torch
import torch.distributed as dist
from torchrec.distributed import TrainPipelineSparseDist
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv

from data.config import BatchLoader, build_loaders, open_dataset
from models import build_dlrm_train
from models.interaction import align_to_sharded_embeddings
from sharding_plans import PlannerConfig, format_sharding_plan
from training.config import TrainConfig
from training.distributed import DistributedEnv, init_process_group
from training.embedding_init import init_embedding_tables
from training.lr_schedule import WarmupPolyDecaySchedule
from training.metrics import BinaryClassificationMetrics
from training.optimizers import attach_fused_embedding_optimizer, build_combined_optimizer
from training.run_log import RunLog
from training.sharding import prepare_sharding


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


@dataclass
class RunResult:
    """What a finished run reports (rank 0 has the same values as every rank)."""

    steps: int
    train_losses: List[float] = field(default_factory=list)
    validation: Optional[Dict[str, float]] = None
    test: Optional[Dict[str, float]] = None


class Trainer:
    """Trains one model described by a `TrainConfig` on the current process group.

    Args:
        config: the validated configuration.
        env: rank, world size and device of this process.

    Example::

        result = Trainer(config, resolve_env("auto")).fit()
    """

    def __init__(self, config: TrainConfig, env: DistributedEnv) -> None:
        self.config = config
        self.env = env
        # The data set, the model and the plan file or constraints first: bad input
        # fails before any collective.
        dataset = open_dataset(config.data)
        # Model: identical dense init on every rank and world size (seeded here),
        # tables on the meta device until sharded.
        torch.manual_seed(config.seed)
        model = build_dlrm_train(config.model, dense_device=env.device)
        attach_fused_embedding_optimizer(model.model.sparse_arch, config.optim)
        sharding = prepare_sharding(config, env, model)

        self.process_group = init_process_group(env)
        self.log = RunLog(env.is_main, config.log_path)
        if env.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = config.allow_tf32
            torch.backends.cudnn.allow_tf32 = config.allow_tf32
        plan = sharding.plan(
            model,
            PlannerConfig(
                world_size=env.world_size,
                local_world_size=env.local_world_size,
                compute_device=env.device.type,
                batch_size=config.data.batch_size,
            ),
            self.process_group,
        )
        table_shapes = {t: (rows, config.model.embedding_dim)
                        for t, rows in zip(config.model.table_names, config.model.num_embeddings_per_feature)}
        if config.print_sharding_plan:
            element_bytes = 2 if config.model.embedding_precision == "fp16" else 4
            self.log.print(format_sharding_plan(plan, env.world_size, table_shapes, element_bytes))
        self.model = DistributedModelParallel(
            module=model,
            device=env.device,
            env=ShardingEnv.from_process_group(self.process_group),
            plan=plan,
            sharders=sharding.sharders,
        )
        align_to_sharded_embeddings(self.model, env.device)
        init_embedding_tables(self.model, table_shapes, config.seed)
        self.optimizer = build_combined_optimizer(self.model, config.optim)
        self.schedule = WarmupPolyDecaySchedule(config.optim)
        self.loaders: Dict[str, BatchLoader] = build_loaders(
            config.data, dataset, config.model.num_embeddings_per_feature, env.rank, env.world_size
        )
        self.train_pipeline = self._pipeline()
        self.step = 0
        self._train_seconds = 0.0
        self._train_records = 0

    def _pipeline(self) -> TrainPipelineSparseDist:
        # Starts batch i+1's input all-to-all before batch i's forward.
        return TrainPipelineSparseDist(
            self.model, self.optimizer, self.env.device, execute_all_batches=True
        )

    def _batches(self, loader: BatchLoader) -> Iterator:
        batches: Iterator = iter(loader)
        if self.config.data.pin_memory and self.env.device.type == "cuda":
            batches = (b.pin_memory() for b in batches)
        return batches

    def fit(self) -> RunResult:
        """Trains every epoch, validates as configured, then tests. Collective."""
        config = self.config
        self.log.record("config", world_size=self.env.world_size, resolved_device=str(self.env.device),
                        **dataclasses.asdict(config))
        result = RunResult(steps=0)
        train_loader = self.loaders["train"]
        for epoch in range(config.epochs):
            train_loader.set_epoch(epoch)
            result.train_losses += self._train_epoch(epoch, train_loader, result)
            result.validation = self.evaluate("validation") or result.validation
        result.test = self.evaluate("test")
        result.steps = self.step
        self._summary(result)
        self.log.close()
        return result

    def _train_epoch(self, epoch: int, loader: BatchLoader, result: RunResult) -> List[float]:
        config = self.config
        self.model.train()
        batches = self._batches(loader)
        self.log.start_progress(len(loader), f"epoch {epoch}")
        losses: List[float] = []
        pending: List[torch.Tensor] = []  # this interval's per-step losses, not yet synced
        interval_records, interval_start = 0, time.perf_counter()
        for step_in_epoch in itertools.count():
            lr = self.schedule.apply(self.optimizer, self.step)
            try:
                loss, _, labels = self.train_pipeline.progress(batches)
            except StopIteration:
                break
            pending.append(loss.detach())
            interval_records += labels.numel() * self.env.world_size
            self.step += 1
            self.log.advance()
            if config.print_lr:
                self.log.print(f"step {self.step - 1}: lr {lr:.6g}")
            at_validation = (
                config.validation_freq_within_epoch is not None
                and (step_in_epoch + 1) % config.validation_freq_within_epoch == 0
            )
            if len(pending) == config.log_every_n_steps or at_validation:
                seconds = time.perf_counter() - interval_start
                losses += self._log_interval(epoch, pending, lr, interval_records, seconds)
                pending, interval_records = [], 0
                if at_validation:
                    result.validation = self.evaluate("validation") or result.validation
                    self.model.train()
                interval_start = time.perf_counter()
        if pending:
            seconds = time.perf_counter() - interval_start
            losses += self._log_interval(epoch, pending, lr, interval_records, seconds)
        self.log.close_progress()
        return losses

    def _log_interval(
        self, epoch: int, pending: List[torch.Tensor], lr: float, records: int, seconds: float
    ) -> List[float]:
        """Averages the interval's losses over ranks, stops on a non-finite one, logs."""
        step_losses = torch.stack(pending).double()
        if self.env.world_size > 1:
            # Embedding gradients are divided by the world size: the loss of the
            # equivalent single-process run is the mean of the ranks' losses.
            dist.all_reduce(step_losses)
            step_losses /= self.env.world_size
        values = step_losses.cpu().tolist()
        first_step = self.step - len(values)
        for offset, value in enumerate(values):
            if not torch.isfinite(torch.tensor(value)):
                raise NonFiniteLossError(
                    f"training loss is {value} at step {first_step + offset} (epoch {epoch}): "
                    "lower --learning_rate or check the input data"
                )
        self._train_seconds += seconds
        self._train_records += records
        mean_loss = sum(values) / len(values)
        rate = records / seconds if seconds > 0 else float("nan")
        self.log.print(
            f"epoch {epoch} step {self.step} | loss {mean_loss:.5f} | lr {lr:.6g} | "
            f"{rate:,.0f} records/s"
        )
        self.log.record("train", step=self.step, epoch=epoch, loss=mean_loss, lr=lr,
                        records_per_sec=rate, records=records, seconds=seconds, step_losses=values)
        return values

    def evaluate(self, stage: str) -> Optional[Dict[str, float]]:
        """Runs the "validation" or "test" split; None when it has no batches. Collective."""
        loader = self.loaders[stage]
        if len(loader) == 0:
            return None
        self.model.eval()
        self.train_pipeline.detach()
        pipeline = self._pipeline()
        metrics = BinaryClassificationMetrics(self.env.device)
        batches = self._batches(loader)
        with torch.no_grad():
            while True:
                try:
                    _, logits, labels = pipeline.progress(batches)
                except StopIteration:
                    break
                metrics.update(logits, labels)
        pipeline.detach()
        self.train_pipeline.attach(self.model)
        values = metrics.compute()
        self.log.print(
            f"{stage}: AUROC {values['auroc']:.4f} | log loss {values['log_loss']:.4f} | "
            f"accuracy {values['accuracy']:.4f} | {values['num_samples']} samples (step {self.step})"
        )
        self.log.record("eval", stage=stage, step=self.step, **values)
        return values

    def _summary(self, result: RunResult) -> None:
        rate = self._train_records / self._train_seconds if self._train_seconds > 0 else 0.0
        self.log.print(
            f"done: {result.steps} steps, {self._train_records} records in "
            f"{self._train_seconds:.1f} s of training ({rate:,.0f} records/s, evaluation excluded)"
        )
        self.log.record("summary", steps=result.steps, train_seconds=self._train_seconds,
                        records_per_sec=rate, validation=result.validation, test=result.test)
