"""A baseline in one command: hashed logistic regression on the trainer's data.

    python -m training.baseline --in_memory_binary_criteo_path DIR [--epochs 1] [--log_path baseline.jsonl]

It takes the training entry points' data flags (every data source, its split, its
batching and row limits), their table-size flags (``--num_embeddings``,
``--max_table_rows``, ...) and ``--recipe`` (for those flags), so the rows it trains,
validates and tests on, and the table row each id falls in, are the deep model's:
the same loaders (data/batching/loaders.py, the sources' id hashing and dense transform). The
model is one weight per table row (an embedding of width 1, summed over a bag), one
per numerical feature and a bias, trained on one CPU process with Adagrad (or SGD) on
sparse gradients. It validates after every epoch, keeps the epoch with the best
validation AUROC, and tests that epoch's weights.

Its metrics are the trainer's (`training.metrics.BinaryClassificationMetrics`), and
``--log_path`` gets the trainer's JSON-lines records (training/run_log.py): ``config``,
``train`` per interval, ``eval`` per evaluation and ``summary``, so that
``python -m training.report baseline.jsonl run.jsonl`` draws both runs. A training
flag that has no meaning for a logistic regression (the model's, the sharding's,
checkpoints') is refused in one line, exit 2 (docs/quality.md).
"""

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.cli import OneLineParser, print_bad_input, run_cli
from common.config_flags import FlagError, add_flags, check_choices, config_values, flag, option
from common.errors import BadInput
from common.library_noise import quiet_benign_library_messages
from common.run_log_file import TestedModel
from common.sigterm import Terminated, raise_on_sigterm
from data.config import DataConfig
from models.config import TableSizes
from recipes import RECIPES
from training.config import TrainConfig
from training.failures import EXIT_NON_FINITE_LOSS, EXIT_TERMINATED

PROG = "python -m training.baseline"
OPTIMIZERS = ("adagrad", "sgd")
# The training entry points' run flags the baseline takes (TrainConfig's fields).
RUN_FIELDS = ("epochs", "seed", "auroc_bins", "log_path", "log_every_n_steps", "print_progress")
# The model's name in the config record (what training.report labels the run with).
MODEL_NAME = "logistic_regression"


class NonFiniteLoss(Exception):
    """The loss became NaN or infinite: exit 3, as the trainer's."""


@dataclass
class BaselineFlags:
    """The baseline's own flags: how the logistic regression learns."""

    learning_rate: float = flag(
        0.05,
        help="the logistic regression's learning rate (its own: the deep model's --learning_rate does not carry over)",
    )
    optimizer: str = flag(
        "adagrad",
        choices=OPTIMIZERS,
        help="adagrad (one rate per weight: rare ids learn as fast as frequent ones) or sgd",
    )

    def validate(self) -> None:
        check_choices(self)
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise FlagError(f"{option(self, 'learning_rate')} must be positive, got {self.learning_rate}")


@dataclass
class BaselineConfig:
    """What one baseline run reads and does."""

    data: DataConfig
    tables: TableSizes
    table_rows: list[int]  # resolved: rows of each categorical feature's table
    sparse_feature_names: list[str]
    num_dense_features: int
    flags: BaselineFlags
    run: dict[str, Any]  # RUN_FIELDS
    recipe: str | None = None


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--recipe",
        choices=list(RECIPES),
        default=None,
        help="the data and table-size flags (and --epochs) of a training recipe; flags given win",
    )
    add_flags(
        parser.add_argument_group("what to run"),
        TrainConfig,
        exclude=[name for name in _train_fields() if name not in RUN_FIELDS],
    )
    add_flags(parser.add_argument_group("data (as the training entry points')"), DataConfig)
    add_flags(parser.add_argument_group("table sizes (as the training entry points')"), TableSizes)
    add_flags(parser.add_argument_group("the logistic regression"), BaselineFlags)
    return parser


def _train_fields() -> list[str]:
    from common.config_flags import flags_of

    return [item.field.name for item in flags_of(TrainConfig)]


def _not_for_the_baseline(unknown: Sequence[str]) -> str:
    """The one line for flags the baseline does not take: the training flags among
    them named as such, anything else as argparse would."""
    from training.flags import entry_point_parser

    training = entry_point_parser("dlrm_main.py")._option_string_actions
    names = [arg.split("=", 1)[0] for arg in unknown if arg.startswith("--")]
    deep = [name for name in names if name in training]
    if deep and len(deep) == len(names):
        return (
            f"{', '.join(deep)}: {'a flag' if len(deep) == 1 else 'flags'} of the deep model's training, "
            f"which the baseline (a logistic regression on one CPU process) does not have; it takes the data, "
            f"table-size and run flags ({PROG} --help)"
        )
    return f"unrecognized arguments: {' '.join(unknown)}"


def parse_config(argv: Sequence[str] | None) -> BaselineConfig:
    """The validated config; exits 2 with one line on bad flags."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(_not_for_the_baseline(unknown))
    try:
        return _config(args)
    except BadInput as e:
        parser.error(str(e))


def _config(args: argparse.Namespace) -> BaselineConfig:
    from training.flags import _chosen_recipe_layers

    layers = _chosen_recipe_layers(args)  # the recipe's values of the flags this parser has
    run = config_values(TrainConfig, args, layers, exclude=[n for n in _train_fields() if n not in RUN_FIELDS])
    for name in ("epochs", "log_every_n_steps"):
        if run[name] <= 0:
            raise FlagError(f"--{name} must be positive, got {run[name]}")
    data = DataConfig(**config_values(DataConfig, args, layers), seed=run["seed"])
    if data.rolling_windows is not None:
        raise FlagError(
            f"{option(data, 'rolling_windows')}: the baseline trains once on the training split and "
            "tests once (run it on each window's data instead)"
        )
    source = data.validate()  # the run's source (asked again below: the same object)
    tables = TableSizes(**config_values(TableSizes, args, layers))
    tables.validate()
    flags = BaselineFlags(**config_values(BaselineFlags, args, layers))
    flags.validate()
    try:
        features = source.describe()
    except BadInput as e:
        raise FlagError(f"{option(data, source.path_field)}: {e}") from e
    cardinalities = list(features.cardinalities) if features.cardinalities is not None else None
    return BaselineConfig(
        data=data,
        tables=tables,
        table_rows=tables.resolve(len(features.sparse_feature_names), cardinalities),
        sparse_feature_names=list(features.sparse_feature_names),
        num_dense_features=features.num_dense_features,
        flags=flags,
        run=run,
        recipe=args.recipe,
    )


class HashedLogisticRegression:
    """One weight per row of every feature's table (ids already hashed or taken modulo
    the table's size by the loader), summed over each row's ids, plus one weight per
    numerical feature and a bias: the logit. Built lazily so that --help needs no torch.

    Args:
        table_rows: rows of each feature's table.
        num_dense: numerical features.
        feature_names: the categorical features, in the order of ``table_rows`` (the
            batches' keys must come in this order).
    """

    def __init__(self, table_rows: list[int], num_dense: int, feature_names: list[str]) -> None:
        import torch

        self.feature_names = feature_names
        self.offsets = torch.tensor([0, *table_rows[:-1]], dtype=torch.int64).cumsum(0)
        # Zeros: the first logits are 0 (p = 0.5), and an id never seen keeps weight 0.
        self.ids = torch.nn.EmbeddingBag(sum(table_rows), 1, mode="sum", sparse=True)
        torch.nn.init.zeros_(self.ids.weight)
        self.dense = torch.nn.Linear(num_dense, 1) if num_dense else None
        if self.dense is not None:
            torch.nn.init.zeros_(self.dense.weight)
            torch.nn.init.zeros_(self.dense.bias)
        self.bias = torch.nn.Parameter(torch.zeros(1))

    def parameters(self) -> tuple[list[Any], list[Any]]:
        """(sparse-gradient parameters, dense ones)."""
        dense = [self.bias] + (list(self.dense.parameters()) if self.dense is not None else [])
        return [self.ids.weight], dense

    def logits(self, batch: Any) -> Any:
        import torch

        kjt = batch.sparse_features
        if kjt.keys() != self.feature_names:  # the loaders' order is the description's: kept so
            raise RuntimeError(f"batch features {kjt.keys()} are not the described {self.feature_names}")
        lengths = kjt.lengths()
        rows = len(batch.labels)
        num_features = len(self.offsets)
        # Each id moves to its feature's part of the one weight vector.
        per_value = self.offsets.repeat_interleave(rows).repeat_interleave(lengths.to(torch.int64))
        bag_offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0).to(torch.int64)[:-1]])
        # Bag f * rows + i holds feature f's ids of row i (KJT's key-major order).
        bags = self.ids(kjt.values().to(torch.int64) + per_value, bag_offsets)
        logit = bags.view(num_features, rows).sum(0) + self.bias
        if self.dense is not None:
            logit = logit + self.dense(batch.dense_features).view(-1)
        return logit

    def state(self) -> list[Any]:
        return [p.detach().clone() for group in self.parameters() for p in group]

    def load(self, state: list[Any]) -> None:
        for p, saved in zip([p for group in self.parameters() for p in group], state):
            p.data.copy_(saved)


def _optimizers(model: HashedLogisticRegression, flags: BaselineFlags) -> list[Any]:
    import torch

    sparse, dense = model.parameters()
    if flags.optimizer == "sgd":
        return [torch.optim.SGD(sparse, lr=flags.learning_rate), torch.optim.SGD(dense, lr=flags.learning_rate)]
    return [torch.optim.Adagrad(sparse, lr=flags.learning_rate), torch.optim.Adagrad(dense, lr=flags.learning_rate)]


def _loss(logits: Any, batch: Any, weighted: bool) -> Any:
    import torch.nn.functional as F

    if not weighted:
        return F.binary_cross_entropy_with_logits(logits, batch.labels.float())
    losses = F.binary_cross_entropy_with_logits(logits, batch.labels.float(), reduction="none")
    return (batch.weights * losses).sum() / batch.weight_normalizer


def evaluate(
    model: HashedLogisticRegression,
    loader: Any,
    stage: str,
    step: int,
    config: BaselineConfig,
    log: Any,
    tested: TestedModel | None = None,
) -> dict[str, float] | None:
    """Runs one split through the trainer's metrics; prints and records them as the
    trainer's evaluations (an ``eval`` record, with the ``tested`` model's fields as a
    test record has them). None when the split has no batches."""
    import torch

    from training.metrics import BinaryClassificationMetrics
    from training.run_log import format_metrics

    if len(loader) == 0:
        return None
    weighted = config.data.weight_column is not None
    metrics = BinaryClassificationMetrics(torch.device("cpu"), config.run["auroc_bins"], weighted)
    started = time.perf_counter()
    with torch.no_grad():
        for batch in loader:
            metrics.update(model.logits(batch), batch.labels, *([batch.weights] if weighted else []))
    values = metrics.compute()
    seconds = time.perf_counter() - started
    rate = values["num_samples"] / seconds if seconds > 0 else float("nan")
    log.print(
        f"{format_metrics(stage, values)}, calibration {values['calibration']:.4f}, "
        f"{values['num_samples']} samples (step {step})"
    )
    log.record(
        "eval",
        stage=stage,
        step=step,
        **(tested.fields() if tested else {}),
        **values,
        records_per_sec=rate,
        seconds=seconds,
    )
    return values


def run(config: BaselineConfig) -> dict[str, Any]:
    """Trains, validates after each epoch, tests the best epoch's weights. Returns the
    summary record's fields."""
    import torch

    from training.run_log import RunLog

    torch.manual_seed(config.run["seed"])
    # The sparse gradients' tensors are torch's own, well formed: say so explicitly
    # (Adagrad warns of the unchecked invariants otherwise).
    torch.sparse.check_sparse_tensor_invariants.disable()
    source = config.data.validate()  # the one `_config` built and checked
    dataset = source.open(check_values=True)
    loaders = source.loaders(dataset, config.table_rows, 0, 1)
    log = RunLog(True, config.run["log_path"], progress=config.run["print_progress"] or sys.stderr.isatty())
    try:
        return _fit(config, loaders, log)
    finally:
        log.close()


def _fit(config: BaselineConfig, loaders: dict[str, Any], log: Any) -> dict[str, Any]:
    log.record(
        "config",
        world_size=1,
        resolved_device="cpu",
        model={"interaction_type": MODEL_NAME},
        data=_fields(config.data),
        tables=_fields(config.tables),
        optim=_fields(config.flags),
        table_rows=config.table_rows,
        recipe=config.recipe,
        **config.run,
    )
    log.print(
        f"baseline: logistic regression on {len(config.sparse_feature_names)} categorical features "
        f"({sum(config.table_rows):,} hashed weights) and {config.num_dense_features} numerical ones, "
        f"{config.flags.optimizer} at {config.flags.learning_rate}, {config.run['epochs']} epoch(s) of "
        f"{len(loaders['train'])} batches"
    )
    model = HashedLogisticRegression(config.table_rows, config.num_dense_features, config.sparse_feature_names)
    optimizers = _optimizers(model, config.flags)
    weighted = config.data.weight_column is not None
    every = config.run["log_every_n_steps"]
    step, best, best_step, validation = 0, None, None, None
    best_state = model.state()
    train_seconds = 0.0
    log.start_progress(config.run["epochs"] * len(loaders["train"]), "baseline")
    for epoch in range(config.run["epochs"]):
        loaders["train"].set_epoch(epoch)
        interval_loss, interval_steps, interval_rows, interval_start = 0.0, 0, 0, time.perf_counter()
        epoch_start = interval_start
        for batch in loaders["train"]:
            loss = _loss(model.logits(batch), batch, weighted)
            for optimizer in optimizers:
                optimizer.zero_grad()
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
            step += 1
            interval_loss += loss.item()
            interval_steps += 1
            interval_rows += len(batch.labels)
            log.advance()
            if not math.isfinite(loss.item()):
                raise NonFiniteLoss(
                    f"training loss is {loss.item()} at step {step}: lower --learning_rate "
                    f"(now {config.flags.learning_rate})"
                )
            if step % every == 0:
                seconds = time.perf_counter() - interval_start
                log.record(
                    "train",
                    step=step,
                    epoch=epoch,
                    loss=interval_loss / interval_steps,
                    lr=config.flags.learning_rate,
                    records_per_sec=interval_rows / seconds if seconds else 0.0,
                )
                interval_loss, interval_steps, interval_rows, interval_start = 0.0, 0, 0, time.perf_counter()
        train_seconds += time.perf_counter() - epoch_start
        log.close_progress()
        validation = evaluate(model, loaders["validation"], "validation", step, config, log)
        if validation is not None and (best is None or validation["auroc"] > best["auroc"]):
            best, best_step, best_state = validation, step, model.state()
        if epoch + 1 < config.run["epochs"]:
            log.start_progress(config.run["epochs"] * len(loaders["train"]), "baseline", initial=step)
    if best_step is not None:
        model.load(best_state)  # the best validation's epoch, as the trainer's export takes
    # Nothing is exported: the tested weights are the best validation's, else the last.
    tested_model = TestedModel("best", best_step, False) if best_step is not None else TestedModel("final", step, False)
    test = evaluate(model, loaders["test"], "test", tested_model.step, config, log, tested_model)
    summary = dict(
        steps=step,
        train_seconds=train_seconds,
        validation=validation,
        test=test,
        best_step=best_step,
        best_validation=best,
    )
    log.record("summary", **summary)
    tested = f" (the weights of step {best_step}, the best validation AUROC)" if best_step is not None else ""
    log.print(
        f"done: {step} steps in {train_seconds:.1f} s of training | {_closing(test) if test else 'test: none'}{tested}"
    )
    return summary


def _closing(values: dict[str, float]) -> str:
    from training.run_log import format_metrics

    return f"{format_metrics('test', values)}, calibration {values['calibration']:.4f}"


def _fields(config: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(config)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the baseline; returns the exit code (2: bad flags or data, one line)."""
    quiet_benign_library_messages()
    config = parse_config(argv)
    world_size = os.environ.get("WORLD_SIZE", "1")
    if world_size != "1":
        return print_bad_input(
            PROG, f"WORLD_SIZE is {world_size}: the baseline runs in one process (run it with python, not torchrun)"
        )
    try:
        with raise_on_sigterm():
            return run_cli(lambda: (run(config), 0)[1], PROG)
    except Terminated as e:
        print(f"{PROG}: error: stopped: {e}", file=sys.stderr, flush=True)
        return EXIT_TERMINATED
    except NonFiniteLoss as e:
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return EXIT_NON_FINITE_LOSS


if __name__ == "__main__":
    sys.exit(main())
