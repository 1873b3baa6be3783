"""The start-up block: what a run is about to do, said on rank 0 before the long set-up.

Building, planning and sharding the model and reading the data take seconds on the
shipped data and minutes on Criteo 1TB; the block says first what is being built
(model, tables, data, ranks, device, precision, where outputs go), then, once the
set-up is done, how the tables were sharded and how many steps an epoch has. The
JSON-lines log gets the same facts once, as ``{"event": "startup", ...}``:

    starting: --mode train
    model: DLRM (original interaction) | bottom MLP 13-512-256-64 | top MLP 512-512-256-1
    tables: 26 | 1,234,567 rows x 64 | 301.38 MiB of fp32 weights
    data: /data/criteo | rows: train 1,000,000, validation 50,000, test 50,000 | batch 512 per rank
    ranks: 2 (2 on this host) | device cpu (gloo) | precision fp32 MLPs, fp32 tables | pipeline sparse_dist
    outputs: JSON log runs/x.jsonl | checkpoints ckpt (at epoch end) | TensorBoard none
    sharding: 6 data_parallel/dense, 20 table_wise/fused
    steps per epoch: train 977, validation 49, test 49 | 1 epoch: 977 training steps
"""

from collections import Counter
from collections.abc import Mapping
from typing import Any

from common.byte_sizes import format_bytes
from common.url_paths import redacted
from data.config import BatchLoader
from data.sources import DataSource
from models.config import ModelConfig
from models.interactions import INTERACTIONS
from training.config import TrainConfig
from training.distributed import DistributedEnv


def _sizes(sizes: list[int]) -> str:
    return "-".join(str(s) for s in sizes)


def _model_line(model: ModelConfig) -> str:
    parts = [f"{INTERACTIONS[model.interaction_type].model_name} ({model.interaction_type} interaction)"]
    if model.has_dense_arch:
        parts.append(f"bottom MLP {model.dense_in_features}-{_sizes(model.dense_arch_layer_sizes)}")
    else:
        parts.append("no bottom MLP (no numerical features)")
    if model.interaction.describe():
        parts.append(model.interaction.describe())
    if model.sequence_columns:
        histories = ", ".join(f"{history} ({item}'s table)" for history, item in model.sequences)
        parts.append(f"histories {histories} of <= {model.max_history} by {model.sequence.describe()}")
    parts.append(f"top MLP {_sizes(model.over_arch_layer_sizes)}")
    return "model: " + " | ".join(parts)


def _table_bytes(model: ModelConfig) -> int:
    return sum(model.num_embeddings_per_feature) * model.embedding_dim * model.embedding_bytes_per_element


def _data_source(source: DataSource) -> str:
    return redacted(source.path) if source.path else "random data"


def _outputs_line(config: TrainConfig) -> str:
    flags = config.checkpoint
    when = [f"every {flags.checkpoint_every_n_steps} steps"] if flags.checkpoint_every_n_steps else []
    when += [f"every {flags.checkpoint_every_n_minutes:g} minutes"] if flags.checkpoint_every_n_minutes else []
    when += ["at epoch end"] if flags.checkpoint_at_epoch_end else []
    when += ["written in the background"] if flags.async_checkpoint else []
    if not flags.checkpoint_dir:
        checkpoints = "none (no --checkpoint_dir)"
    else:
        checkpoints = redacted(flags.checkpoint_dir) + (f" ({', '.join(when)})" if when else "")
    return (
        f"outputs: JSON log {config.log_path or 'none (no --log_path)'} | checkpoints {checkpoints} | "
        f"TensorBoard {redacted(config.tensorboard_dir or 'none')}"
    )


def _precision_line(config: TrainConfig, env: DistributedEnv) -> str:
    dense = "bf16 autocast MLPs (--dense_precision bf16)" if config.amp else "fp32 MLPs"
    if config.compile:
        dense += ", compiled (--compile)"
    if env.device.type == "cuda" and config.allow_tf32:
        dense += " with TF32 matmuls"
    return (
        f"ranks: {env.world_size} ({env.local_world_size} on this host) | device {env.device.type} "
        f"({env.backend}) | precision {dense}, {config.model.embedding_precision} tables | "
        f"pipeline {config.pipeline}"
    )


class StartupReport:
    """Says the start-up block on rank 0 and keeps its facts for the log record.

    Args:
        config: the run's configuration.
        env: this process's rank, world and device.
        source: the run's data source (the one the trainer opened).

    Example::

        report = StartupReport(config, env, source)
        report.before_setup(dataset)           # model, tables, data, ranks, outputs
        report.after_setup(plan, loaders, log)  # sharding and steps; the "startup" record
    """

    def __init__(self, config: TrainConfig, env: DistributedEnv, source: DataSource) -> None:
        self.config = config
        self.env = env
        self.source = source
        self.facts: dict[str, Any] = {}

    def _say(self, lines: list[str]) -> None:
        if self.env.is_main:
            print("\n".join(lines), flush=True)

    def before_setup(self, dataset: Any) -> list[str]:
        """Prints (rank 0) and returns the lines known before the model is built."""
        config, model = self.config, self.config.model
        rows = self.source.split_rows(dataset, self.env.world_size)
        times = self.source.time_ranges(dataset)
        table_bytes = _table_bytes(model)
        self.facts = {
            "mode": config.mode,
            "interaction_type": model.interaction_type,
            "num_tables": len(model.num_embeddings_per_feature),
            "table_rows": sum(model.num_embeddings_per_feature),
            "embedding_dim": model.embedding_dim,
            "table_bytes": table_bytes,
            "data": _data_source(self.source),
            "split_rows": rows,
            "split_times": times,
            "world_size": self.env.world_size,
            "device": str(self.env.device),
            "amp": config.amp,
            "compile": config.compile,
            "embedding_precision": model.embedding_precision,
            "pipeline": config.pipeline,
            "log_path": config.log_path,
            "checkpoint_dir": config.checkpoint.checkpoint_dir,
        }
        lines = [
            f"starting: --mode {config.mode}" + (f" --recipe {config.recipe}" if config.recipe else ""),
            _model_line(model),
            f"tables: {len(model.num_embeddings_per_feature)} | {sum(model.num_embeddings_per_feature):,} rows x "
            f"{model.embedding_dim} | {format_bytes(table_bytes)} of {model.embedding_precision} weights",
            f"data: {_data_source(self.source)} | rows: "
            + (", ".join(f"{s} {n:,}" for s, n in rows.items()) or "not known before reading")
            + f" | batch {config.data.batch_size} per rank",
            *(
                [
                    f"time ranges ({config.data.time_column}): "
                    + ", ".join(f"{s} {first} to before {end}" for s, (first, end) in times.items())
                ]
                if times
                else []
            ),
            _precision_line(config, self.env),
            _outputs_line(config),
        ]
        self._say(lines)
        return lines

    def after_setup(
        self,
        plan: Mapping[str, Mapping[str, Any]],
        loaders: Mapping[str, BatchLoader],
        log: Any | None = None,
        total_steps: int | None = None,
    ) -> list[str]:
        """Prints (rank 0) and returns the sharding and steps lines; writes the
        ``startup`` record to ``log`` (a `training.run_log.RunLog`). ``total_steps``:
        the run's training steps (the trainer counts every window's); default the
        epochs times the training loader's length."""
        kinds = Counter(f"{table['sharding_type']}/{table['compute_kernel']}" for table in plan.values())
        steps = {split: len(loader) for split, loader in loaders.items()}
        windows = self.config.data.rolling_windows
        epochs = windows or self.config.epochs  # --rolling_windows N: one pass over each of N windows
        total = epochs * steps["train"] if total_steps is None else total_steps
        passes = (
            f"{windows} training window{'s' if windows != 1 else ''}:"
            if windows
            else f"{epochs} epoch{'s' if epochs != 1 else ''}:"
        )
        lines = [
            "sharding: " + ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items())),
            ("steps of window 0: " if windows else "steps per epoch: ")
            + ", ".join(f"{s} {n:,}" for s, n in steps.items())
            + f" | {passes} {total:,} training steps",
        ]
        self._say(lines)
        self.facts.update(
            sharding={kind: count for kind, count in sorted(kinds.items())}, steps_per_epoch=steps, total_steps=total
        )
        if log is not None:
            log.record("startup", **self.facts)
        return lines
