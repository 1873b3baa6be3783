"""Command-line flags -> `TrainConfig`.

The flag names, meanings and list syntax are the public TorchRec DLRM example's, so
existing command lines keep working; the additions are documented in the README.
Bad input ends in one line on stderr and exit code 2.
"""

import argparse
from typing import Any, Dict, List, NoReturn, Optional, Sequence, Tuple

from common.cli import OneLineParser, int_list
from common.errors import BadInput
from data.config import DATASET_NAMES, DataConfig
from data.criteo_layout import DENSE_FEATURE_NAMES, SPARSE_FEATURE_NAMES, read_metadata
from data.feature_spec import FeatureSpec
from models.config import EMBEDDING_PRECISIONS, INTERACTION_TYPES, ModelConfig
from sharding_plans.constraints import ShardingConstraints
from training.config import (
    DENSE_OPTIMIZERS,
    DEVICES,
    MODES,
    OPTIMIZERS,
    PIPELINES,
    SEMI_SYNC_START_BATCH,
    EARLY_STOPPING_METRICS,
    CheckpointConfig,
    EarlyStoppingConfig,
    InferenceBenchmarkConfig,
    OptimizerConfig,
    TrainConfig,
)
from training.failures import report_bad_input

DEFAULT_NUM_EMBEDDINGS = 100_000


class FlagError(BadInput):
    """A flag's value is wrong; the message names the flag."""


def _store_true(parser: argparse.ArgumentParser, name: str, help: str) -> None:
    parser.add_argument(f"--{name}", action="store_true", help=help)


class _JobParser(OneLineParser):
    """Bad flags are the same on every rank: rank 0 of the job says so, every rank exits 2."""

    def error(self, message: str) -> NoReturn:
        raise SystemExit(report_bad_input(self.prog, message))


def build_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The flags of both entry points, with DLRM's defaults (callers may `set_defaults`)."""
    p = _JobParser(prog=prog, description=description)
    a = p.add_argument
    # Run length and batching (public example names).
    a("--epochs", type=int, default=1, help="passes over the training split")
    a("--batch_size", type=int, default=32, help="training rows per rank per step")
    _store_true(p, "drop_last_training_batch", "drop the last partial training batch")
    a("--test_batch_size", type=int, default=None, help="validation/test rows per rank (default --batch_size)")
    a("--limit_train_batches", type=int, default=None, help="training batches per epoch at most")
    a("--limit_val_batches", type=int, default=None, help="validation batches at most")
    a("--limit_test_batches", type=int, default=None, help="test batches at most")
    # Data.
    a("--dataset_name", choices=DATASET_NAMES, default="criteo_1t", help="which Criteo data set the files are")
    a("--in_memory_binary_criteo_path", default=None,
      help="directory of day_{i}_{dense,sparse,labels}.npy files; without it, uniform random data")
    a("--synthetic_multi_hot_criteo_path", default=None,
      help="directory of the MLPerf DLRM-DCNv2 multi-hot layout (day_{i}_sparse_multi_hot.npz)")
    a("--dataset_path", default=None,
      help="PATH/feature_spec.yaml of a split_binary data set (any numbers of numerical and categorical features)")
    _store_true(p, "mmap_mode", "read batches lazily from memory-mapped files instead of loading this rank's rows")
    _store_true(p, "pin_memory", "pin host batches (CUDA)")
    _store_true(p, "shuffle_batches", "shuffle the order of training batches every epoch")
    _store_true(p, "shuffle_training_set", "visit training rows in one random order (same on every rank)")
    a("--multi_hot_sizes", type=int_list, default=None,
      help="expand one-hot data into multi-hot bags of these sizes (26 values)")
    a("--multi_hot_distribution_type", choices=["uniform", "pareto"], default=None,
      help="offsets of the extra ids in a bag (default uniform)")
    # Model.
    a("--num_embeddings", type=int, default=None,
      help=f"rows of every table when --num_embeddings_per_feature is not given (default "
           f"{DEFAULT_NUM_EMBEDDINGS}, or the data's metadata.json cardinalities)")
    a("--num_embeddings_per_feature", type=int_list, default=None, help="rows of each table, comma-separated (26 values)")
    # Table-size sweeps (python -m sweeps): one cap for every table, however it was sized.
    a("--max_table_rows", type=int, default=None,
      help="cap every table at N rows; ids at or above a table's size are taken modulo it (default: no cap)")
    a("--embedding_dim", type=int, default=64, help="width of every embedding table")
    a("--dense_arch_layer_sizes", type=int_list, default=[512, 256, 64], help="bottom MLP sizes")
    a("--over_arch_layer_sizes", type=int_list, default=[512, 512, 256, 1], help="top MLP sizes (end in 1)")
    a("--interaction_type", choices=INTERACTION_TYPES, default="original",
      help="original (DLRM dot products), dcn (DCNv2 cross net) or projection")
    a("--interaction_branch1_layer_sizes", type=int_list, default=[2048, 2048], help="projection branch 1 sizes")
    a("--interaction_branch2_layer_sizes", type=int_list, default=[2048, 2048], help="projection branch 2 sizes")
    a("--dcn_num_layers", type=int, default=3, help="DCN cross layers")
    a("--dcn_low_rank_dim", type=int, default=512, help="rank of each DCN cross layer")
    a("--embedding_precision", choices=EMBEDDING_PRECISIONS, default="fp32",
      help="table weights in fp32 or fp16 (fp16 halves table memory)")
    # Optimisation.
    a("--learning_rate", type=float, default=15.0, help="base learning rate")
    a("--optimizer", choices=OPTIMIZERS, default=None, help="fused embedding optimizer (default sgd)")
    _store_true(p, "adagrad", "alias of --optimizer adagrad (public example flag)")
    a("--dense_optimizer", choices=DENSE_OPTIMIZERS, default=None,
      help="MLP optimizer (default: sgd with --optimizer sgd, else adagrad)")
    a("--eps", type=float, default=1e-8, help="epsilon of Adagrad/Adam")
    a("--lr_warmup_steps", type=int, default=0, help="linear warm-up steps")
    a("--lr_decay_start", type=int, default=0, help="step at which polynomial decay starts")
    a("--lr_decay_steps", type=int, default=0, help="steps of power-2 polynomial decay (0: none)")
    a("--lr_decay_floor", type=float, default=0.0, help="final LR after decay, as a fraction of --learning_rate")
    a("--weight_decay", type=float, default=0.0, help="L2 weight decay of the dense (MLP) optimizer")
    a("--embedding_weight_decay", type=float, default=0.0,
      help="L2 weight decay of the looked-up embedding rows (FBGEMM's L2 mode; --optimizer rowwise_adagrad)")
    a("--dropout", type=float, default=0.0, help="dropout after the over arch's hidden layers in training")
    # Run.
    a("--seed", type=int, default=None, help="seeds model init, data order and random data (default 0)")
    a("--validation_freq_within_epoch", type=int, default=None, help="validate every N training steps")
    a("--log_every_n_steps", type=int, default=100, help="steps per progress line / JSON record")
    a("--auroc_bins", type=int, default=None,
      help="AUROC from a histogram of this many probability bins, with its error bound "
           "(default: exact, keeping every prediction)")
    a("--log_path", default=None, help="JSON-lines log file written by rank 0")
    _store_true(p, "print_lr", "print the learning rate every step")
    _store_true(p, "print_sharding_plan", "print the sharding plan and per-rank memory")
    _store_true(p, "allow_tf32", "allow TF32 matmuls (CUDA Ampere or newer)")
    a("--device", choices=DEVICES, default="auto", help="cuda when available with auto")
    a("--mode", choices=MODES, default="train",
      help="train, evaluate a checkpoint on validation/test data, or inference_benchmark")
    a("--inference_benchmark_batch_sizes", type=int_list, default=[1, 64, 4096],
      help="rows per rank of each batch size timed by --mode inference_benchmark")
    a("--inference_benchmark_iterations", type=int, default=20, help="timed forwards per batch size")
    a("--inference_benchmark_warmup", type=int, default=3, help="untimed forwards before them")
    _store_true(p, "amp", "bf16 autocast of the forward (fast on GPUs; a note says when this CPU is slower in bf16)")
    a("--pipeline", choices=PIPELINES, default="sparse_dist",
      help="train pipeline: sparse_dist (default), base, or the CUDA-only semi_sync and prefetch")
    a("--semi_sync_start_batch", type=int, default=SEMI_SYNC_START_BATCH,
      help=f"--pipeline semi_sync synchronizes every step before this batch (default {SEMI_SYNC_START_BATCH}, torchrec's)")
    a("--tensorboard_dir", default=None, help="write TensorBoard event files here (rank 0)")
    # Early stopping and the best model.
    a("--early_stopping_patience", type=int, default=None,
      help="stop after N validations without improvement; test (and mark in --checkpoint_dir) the best model")
    a("--early_stopping_metric", choices=EARLY_STOPPING_METRICS, default=None,
      help="validation metric early stopping watches: auroc (default; higher is better), log_loss or ne")
    a("--early_stopping_min_delta", type=float, default=None,
      help="how much the metric must beat the best so far to count as an improvement (default 0)")
    # The MLPerf DLRM-DCNv2 reference's flags (README: "MLPerf reference flags").
    a("--validation_auroc", type=float, default=None,
      help="stop at the first validation whose AUROC reaches this; report the time and records it took")
    _store_true(p, "evaluate_on_epoch_end",
                "validate after every epoch; with this or --evaluate_on_training_end, the reference's "
                "schedule applies (default without either: validate after every epoch and test at the end)")
    _store_true(p, "evaluate_on_training_end", "evaluate the test split when training ends (see above)")
    _store_true(p, "print_progress", "show the progress bar even when stderr is not a terminal")
    _store_true(p, "collect_multi_hot_freqs_stats",
                "count every table's ids in the training batches; write multi_hot_freqs_rank_<r>.npz per rank")
    # Checkpoints.
    a("--checkpoint_dir", default=None, help="directory of checkpoints (any iopath path)")
    a("--checkpoint_every_n_steps", type=int, default=None, help="save a checkpoint every N steps")
    _store_true(p, "checkpoint_at_epoch_end", "save a checkpoint after every epoch")
    a("--keep_last_n_checkpoints", type=int, default=0, help="complete checkpoints to keep (0: all)")
    _store_true(p, "resume", "continue from the newest complete checkpoint in --checkpoint_dir")
    a("--restore_checkpoint_path", default=None, help="load only the weights of this checkpoint")
    # Sharding (see `python -m sharding_plans plan`).
    a("--sharding_plan", default=None, help="use this plan file (python -m sharding_plans plan --output) instead of planning")
    a("--sharding_type", default=None,
      help="data_parallel|table_wise|row_wise|column_wise|table_row_wise|table_column_wise, for every table "
           "or per table: t_cat_0=row_wise,t_cat_1=table_wise")
    a("--compute_kernel", default=None, help="dense|fused|fused_uvm|fused_uvm_caching, for every table or per table")
    return p


def _feature_layout(args: argparse.Namespace) -> Tuple[List[str], int, Optional[List[int]]]:
    """(categorical names, numerical count, cardinalities) of the data the flags name."""
    if args.dataset_path is None:
        return list(SPARSE_FEATURE_NAMES), len(DENSE_FEATURE_NAMES), None
    try:
        spec = FeatureSpec.load(args.dataset_path)
    except BadInput as e:
        raise FlagError(f"--dataset_path: {e}") from e
    return list(spec.categorical), len(spec.numerical), spec.cardinalities


def _table_sizes(args: argparse.Namespace, num_tables: int, cardinalities: Optional[List[int]]) -> List[int]:
    sizes = _uncapped_table_sizes(args, num_tables, cardinalities)
    if args.max_table_rows is None:
        return sizes
    return [min(rows, args.max_table_rows) for rows in sizes]


def _uncapped_table_sizes(args: argparse.Namespace, num_tables: int, cardinalities: Optional[List[int]]) -> List[int]:
    if args.num_embeddings_per_feature is not None:
        return list(args.num_embeddings_per_feature)
    if args.num_embeddings is not None:
        return [args.num_embeddings] * num_tables
    if cardinalities is not None:
        return cardinalities
    path = args.in_memory_binary_criteo_path or args.synthetic_multi_hot_criteo_path
    metadata = read_metadata(path) if path else None
    if metadata and "num_embeddings_per_feature" in metadata:
        return [int(v) for v in metadata["num_embeddings_per_feature"]]
    return [DEFAULT_NUM_EMBEDDINGS] * len(SPARSE_FEATURE_NAMES)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Builds and validates the config; raises FlagError naming the flag."""
    if args.num_embeddings is not None and args.num_embeddings <= 0:
        raise FlagError(f"--num_embeddings must be positive, got {args.num_embeddings}")
    if args.max_table_rows is not None and args.max_table_rows <= 0:
        raise FlagError(f"--max_table_rows must be positive, got {args.max_table_rows}")
    if args.adagrad and args.optimizer not in (None, "adagrad"):
        raise FlagError(f"--adagrad contradicts --optimizer {args.optimizer}")
    for flag in ("early_stopping_metric", "early_stopping_min_delta"):
        if getattr(args, flag) is not None and args.early_stopping_patience is None:
            raise FlagError(f"--{flag} needs --early_stopping_patience")
    seed = 0 if args.seed is None else args.seed
    reference_schedule = args.evaluate_on_epoch_end or args.evaluate_on_training_end
    sparse_names, num_dense, cardinalities = _feature_layout(args)
    try:
        config = TrainConfig(
            model=ModelConfig(
                num_embeddings_per_feature=_table_sizes(args, len(sparse_names), cardinalities),
                sparse_feature_names=sparse_names,
                dense_in_features=num_dense,
                embedding_dim=args.embedding_dim,
                interaction_type=args.interaction_type,
                dense_arch_layer_sizes=args.dense_arch_layer_sizes,
                over_arch_layer_sizes=args.over_arch_layer_sizes,
                dcn_num_layers=args.dcn_num_layers,
                dcn_low_rank_dim=args.dcn_low_rank_dim,
                interaction_branch1_layer_sizes=args.interaction_branch1_layer_sizes,
                interaction_branch2_layer_sizes=args.interaction_branch2_layer_sizes,
                embedding_precision=args.embedding_precision,
            ),
            data=DataConfig(
                in_memory_binary_criteo_path=args.in_memory_binary_criteo_path,
                synthetic_multi_hot_criteo_path=args.synthetic_multi_hot_criteo_path,
                dataset_path=args.dataset_path,
                dataset_name=args.dataset_name,
                batch_size=args.batch_size,
                test_batch_size=args.test_batch_size,
                drop_last_training_batch=args.drop_last_training_batch,
                limit_train_batches=args.limit_train_batches,
                limit_val_batches=args.limit_val_batches,
                limit_test_batches=args.limit_test_batches,
                shuffle_batches=args.shuffle_batches,
                shuffle_training_set=args.shuffle_training_set,
                mmap_mode=args.mmap_mode,
                pin_memory=args.pin_memory,
                seed=seed,
                multi_hot_sizes=args.multi_hot_sizes,
                multi_hot_distribution_type=args.multi_hot_distribution_type,
            ),
            optim=OptimizerConfig(
                optimizer=args.optimizer or ("adagrad" if args.adagrad else "sgd"),
                dense_optimizer=args.dense_optimizer,
                learning_rate=args.learning_rate,
                eps=args.eps,
                lr_warmup_steps=args.lr_warmup_steps,
                lr_decay_start=args.lr_decay_start,
                lr_decay_steps=args.lr_decay_steps,
                lr_decay_floor=args.lr_decay_floor,
                weight_decay=args.weight_decay,
                embedding_weight_decay=args.embedding_weight_decay,
            ),
            epochs=args.epochs,
            max_table_rows=args.max_table_rows,
            seed=seed,
            validation_freq_within_epoch=args.validation_freq_within_epoch,
            log_every_n_steps=args.log_every_n_steps,
            auroc_bins=args.auroc_bins,
            log_path=args.log_path,
            print_lr=args.print_lr,
            print_sharding_plan=args.print_sharding_plan,
            allow_tf32=args.allow_tf32,
            device=args.device,
            checkpoint=CheckpointConfig(
                checkpoint_dir=args.checkpoint_dir,
                checkpoint_every_n_steps=args.checkpoint_every_n_steps,
                checkpoint_at_epoch_end=args.checkpoint_at_epoch_end,
                keep_last_n_checkpoints=args.keep_last_n_checkpoints,
                resume=args.resume,
                restore_checkpoint_path=args.restore_checkpoint_path,
            ),
            mode=args.mode,
            amp=args.amp,
            pipeline=args.pipeline,
            semi_sync_start_batch=args.semi_sync_start_batch,
            tensorboard_dir=args.tensorboard_dir,
            sharding_plan=args.sharding_plan,
            sharding_constraints=ShardingConstraints.from_flags(args.sharding_type, args.compute_kernel),
            inference_benchmark=InferenceBenchmarkConfig(
                batch_sizes=args.inference_benchmark_batch_sizes,
                iterations=args.inference_benchmark_iterations,
                warmup=args.inference_benchmark_warmup,
            ),
            validation_auroc=args.validation_auroc,
            # The reference validates at epoch end and tests only when asked; ours does
            # both unless either of its flags is given.
            validate_at_epoch_end=args.evaluate_on_epoch_end or not reference_schedule,
            test_at_end=args.evaluate_on_training_end or not reference_schedule,
            print_progress=args.print_progress,
            collect_multi_hot_freqs_stats=args.collect_multi_hot_freqs_stats,
            dropout=args.dropout,
            early_stopping=EarlyStoppingConfig(
                patience=args.early_stopping_patience,
                metric=args.early_stopping_metric or "auroc",
                min_delta=args.early_stopping_min_delta or 0.0,
            ),
        )
        config.validate()
    except BadInput as e:
        raise FlagError(str(e)) from e
    return config


def parse_config(
    argv: Optional[Sequence[str]],
    prog: str,
    description: str,
    defaults: Optional[Dict[str, Any]] = None,
) -> TrainConfig:
    """Parses argv (None: sys.argv[1:]) into a validated config, or exits 2 with one line."""
    parser = build_parser(prog, description)
    if defaults:
        parser.set_defaults(**defaults)
    args = parser.parse_args(argv)
    try:
        return config_from_args(args)
    except FlagError as e:
        raise SystemExit(report_bad_input(prog, str(e)))
