"""Command-line flags -> `TrainConfig`.

The parser is built from the config classes' fields (`common.config_flags`): the flag
names, meanings and list syntax are the public TorchRec DLRM example's, so existing
command lines keep working. Defaults come in layers: the fields', the entry point's
recipe (dcnv2_main.py's `training.recipes.DCNV2`), ``--recipe`` (the `recipes`
package, typed here by the config classes below), then the command line. Bad input ends in one line on stderr and exit code 2.
"""

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn

from common.cli import OneLineParser
from common.config_flags import FlagError, Overrides, add_flags, config_values, flags_of, given, option
from common.errors import BadInput
from data.config import DataConfig
from data.profile import SizingFlags
from data.sources import DATA_PATH_FIELDS, DataSource, FeatureDescription
from models.config import AUTO, ModelConfig, TableSizes
from recipes import RECIPES, Recipe
from sharding_plans.types import ShardingFlags
from training.config import (
    CheckpointConfig,
    EarlyStoppingConfig,
    InferenceBenchmarkConfig,
    OptimizerConfig,
    ReferenceEvaluation,
    TrainConfig,
)
from training.failures import report_bad_input
from training.recipes import DCNV2

# The recipe each entry point starts from (its defaults).
ENTRY_POINT_RECIPES = {"dlrm_main.py": None, "dcnv2_main.py": DCNV2}
_ENTRY_DEST = "entry_point_recipe"

# The parser's flag groups, in --help order, by what a user decides: (section, config
# class, its fields in that section; None: all of them). A section may take fields of
# several classes; every flag is in one section (tests/common/test_config_flags.py).
FLAG_GROUPS: list[tuple[str, type, tuple[str, ...] | None]] = [
    ("what to run", TrainConfig, ("mode", "epochs", "seed", "device")),
    ("data", DataConfig, None),
    ("model", ModelConfig, None),
    ("table sizes", TableSizes, None),
    ("table sizes", SizingFlags, None),
    ("optimizers and regularization", OptimizerConfig, None),
    ("optimizers and regularization", TrainConfig, ("dropout",)),
    (
        "speed and precision",
        TrainConfig,
        ("dense_precision", "compile", "allow_tf32", "pipeline", "semi_sync_start_batch"),
    ),
    (
        "evaluation",
        TrainConfig,
        ("validation_freq_within_epoch", "auroc_bins", "validation_auroc", "calibrate", "allow_divergence"),
    ),
    ("evaluation", ReferenceEvaluation, None),
    ("early stopping and the best model", EarlyStoppingConfig, None),
    ("checkpoints", CheckpointConfig, None),
    ("sharding (see python -m sharding_plans plan)", TrainConfig, ("sharding_plan", "print_sharding_plan")),
    ("sharding (see python -m sharding_plans plan)", ShardingFlags, None),
    (
        "logs and progress",
        TrainConfig,
        (
            "log_path",
            "log_every_n_steps",
            "print_progress",
            "print_lr",
            "tensorboard_dir",
            "collect_multi_hot_freqs_stats",
        ),
    ),
    ("inference benchmark (--mode inference_benchmark)", InferenceBenchmarkConfig, None),
]
_CONFIG_CLASSES = tuple(dict.fromkeys(config_class for _, config_class, _ in FLAG_GROUPS))
# The flags that size the tables (--max_table_rows caps them, whatever sized them).
_SIZING_FLAGS = ("num_embeddings_per_feature", "num_embeddings")


class _JobParser(OneLineParser):
    """Bad flags are the same on every rank: rank 0 of the job says so, every rank exits 2."""

    def error(self, message: str) -> NoReturn:
        raise SystemExit(report_bad_input(self.prog, message))


def recipe_overrides(recipe: Recipe) -> tuple[Overrides, ...]:
    """A recipe's values typed by the training flags' config classes."""
    return recipe.overrides(_CONFIG_CLASSES)


def _recipe_help() -> str:
    return "; ".join(recipe.describe() for recipe in RECIPES.values())


def build_parser(prog: str, description: str, entry_recipe: Recipe | None = None) -> argparse.ArgumentParser:
    """The flags of both entry points; ``entry_recipe``: the entry point's defaults
    (None: DLRM's, the fields' own).

    Example::

        args = build_parser("dcnv2_main.py", "", DCNV2).parse_args(["--recipe", "small_data"])
        config = config_from_args(args)
    """
    parser = _JobParser(prog=prog, description=description)
    layers = recipe_overrides(entry_recipe) if entry_recipe else ()
    parser.add_argument(
        "--recipe",
        choices=list(RECIPES),
        default=None,
        help=f"defaults for a situation (flags given win over them): {_recipe_help()}",
    )
    groups: dict = {}
    for title, config_class, fields in FLAG_GROUPS:
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        group = groups[title]
        exclude = () if fields is None else [f.field.name for f in flags_of(config_class) if f.field.name not in fields]
        add_flags(group, config_class, layers, exclude=exclude)
    parser.set_defaults(**{_ENTRY_DEST: entry_recipe.name if entry_recipe else None})
    return parser


def entry_point_parser(script: str) -> argparse.ArgumentParser:
    """The parser of ``dlrm_main.py`` or ``dcnv2_main.py``, with its defaults."""
    return build_parser(script, "", ENTRY_POINT_RECIPES[script])


def _describe_data(source: DataSource) -> FeatureDescription:
    """The features of the data the (validated) flags name; the source's errors (a
    spec or metadata.json) as the flag naming it."""
    data = source.config
    try:
        return source.describe()
    except BadInput as e:
        raise FlagError(f"{option(data, source.path_field)}: {e}") from e


def _layers(args: argparse.Namespace) -> tuple[Overrides, ...]:
    """The recipes' overrides, the entry point's first (the later wins)."""
    entry = {r.name: r for r in ENTRY_POINT_RECIPES.values() if r}.get(getattr(args, _ENTRY_DEST, None) or "")
    return (recipe_overrides(entry) if entry else ()) + _chosen_recipe_layers(args)


def _chosen_recipe_layers(args: argparse.Namespace) -> tuple[Overrides, ...]:
    """The ``--recipe``'s overrides; table sizes given on the command line (by either
    flag) replace the recipe's."""
    recipe = RECIPES.get(args.recipe or "")
    if recipe is None:
        return ()
    sized = any(given(args, TableSizes, name) for name in _SIZING_FLAGS)
    return tuple(layer for layer in recipe_overrides(recipe) if not (sized and layer.config_class is TableSizes))


def _checkpoint_layers(args: argparse.Namespace, layers: tuple[Overrides, ...]) -> tuple[Overrides, ...]:
    """--mode validate|test: what the evaluated checkpoint records of its run (model,
    table sizes, data, optimizers), as defaults that the flags given override.
    A data path given on the command line replaces the recorded one."""
    mode = config_values(TrainConfig, args, layers)["mode"]
    if mode not in ("validate", "test"):
        return ()
    flags = CheckpointConfig(**config_values(CheckpointConfig, args, layers))
    if not (flags.restore_checkpoint_path or flags.checkpoint_dir) or flags.warm_start:
        return ()  # TrainConfig.validate says what is missing, or refuses --warm_start
    from checkpoints.opened import read_meta  # these two import torch: only when evaluating
    from training.checkpoint_policy import checkpoint_to_evaluate

    path = checkpoint_to_evaluate(flags)
    meta = read_meta(path)
    where = f"{path}/meta.json"
    data = meta.flag_values("data", DataConfig, where)
    for name in ("rolling_windows", "epoch_shares"):  # how the checkpoint was trained, not how it is evaluated
        data.pop(name, None)
    if any(given(args, DataConfig, name) for name in DATA_PATH_FIELDS):
        data = {name: value for name, value in data.items() if name not in DATA_PATH_FIELDS}
    # The sizes as training resolved them, unless table-size flags are given.
    tables = (
        {}
        if any(given(args, TableSizes, item.field.name) for item in flags_of(TableSizes))
        else {"num_embeddings_per_feature": meta.model.num_embeddings_per_feature}
    )
    return (
        Overrides(ModelConfig, **meta.flag_values("model", ModelConfig, where)),
        Overrides(TableSizes, **tables),
        Overrides(DataConfig, **data),
        Overrides(OptimizerConfig, **meta.flag_values("optim", OptimizerConfig, where)),
    )


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Builds and validates the config; raises BadInput (FlagError naming the flag)."""
    return config_and_source_from_args(args)[0]


def config_and_source_from_args(args: argparse.Namespace) -> tuple[TrainConfig, DataSource]:
    """Builds and validates the config, and the run's data source: built once from the
    flags, it describes the features here and is handed to the trainer (which opens
    it) and its start-up report. Raises BadInput (FlagError naming the flag)."""
    layers = _layers(args)
    layers += _checkpoint_layers(args, layers)

    def values(config_class: type) -> dict:
        return config_values(config_class, args, layers)

    early_stopping = EarlyStoppingConfig(**values(EarlyStoppingConfig))
    for name in ("metric", "min_delta"):
        if given(args, EarlyStoppingConfig, name) and not early_stopping.enabled:
            raise FlagError(f"{option(EarlyStoppingConfig, name)} needs {option(EarlyStoppingConfig, 'patience')}")
    tables = TableSizes(**values(TableSizes))
    tables.validate()
    run = values(TrainConfig)
    data = DataConfig(**values(DataConfig), seed=run["seed"])
    source = data.validate()  # the source's path and flags, before the source describes its features
    features = _describe_data(source)
    cardinalities = list(features.cardinalities) if features.cardinalities is not None else None
    sizing = SizingFlags(**values(SizingFlags))
    if tables.num_embeddings == AUTO:  # before the model is built: the sizes are the model's
        from training.table_sizing import auto_table_sizes

        cardinalities, sizing = auto_table_sizes(
            tables,
            sizing,
            source,
            features,
            values(ModelConfig),
            CheckpointConfig(**values(CheckpointConfig)),
            run["mode"],
        )
    else:
        for item in flags_of(SizingFlags):
            if given(args, SizingFlags, item.field.name):
                raise FlagError(
                    f"{item.option} sizes the tables of {option(tables, 'num_embeddings')} auto: give that too"
                )
    if getattr(data.source_options, "id_hashing", None) == "vocabulary":  # the tables' rows are the vocabulary's
        from training.id_vocabulary import vocabulary_table_sizes

        tables = vocabulary_table_sizes(
            tables, source, features, CheckpointConfig(**values(CheckpointConfig)), run["mode"]
        )
    validate_at_epoch_end, test_at_end = ReferenceEvaluation(**values(ReferenceEvaluation)).schedule()
    recipe = RECIPES.get(args.recipe or "")
    config = TrainConfig(
        model=ModelConfig(
            num_embeddings_per_feature=tables.resolve(len(features.sparse_feature_names), cardinalities),
            sparse_feature_names=list(features.sparse_feature_names),
            dense_in_features=features.num_dense_features,
            sequence_columns=list(features.sequence_columns),
            max_history=features.max_history or 0,
            **_zch_model_fields(data),
            **values(ModelConfig),
        ),
        data=data,
        optim=OptimizerConfig(**values(OptimizerConfig)),
        tables=tables,
        table_sizing=sizing,
        checkpoint=CheckpointConfig(**values(CheckpointConfig)),
        sharding_constraints=ShardingFlags(**values(ShardingFlags)).constraints(),
        inference_benchmark=InferenceBenchmarkConfig(**values(InferenceBenchmarkConfig)),
        early_stopping=early_stopping,
        validate_at_epoch_end=validate_at_epoch_end,
        test_at_end=test_at_end,
        recipe=recipe.name if recipe else None,
        recipe_settings=_recipe_settings(args),
        **run,
    )
    config.validate()
    return config, source


def _zch_model_fields(data: DataConfig) -> dict[str, Any]:
    """--id_hashing zch: the model's managed-collision options (models/zch.py), else none."""
    options = data.source_options
    if getattr(options, "id_hashing", None) != "zch":
        return {}
    return {"zch_eviction_policy": options.zch_eviction_policy, "zch_eviction_interval": options.zch_eviction_interval}


def _recipe_settings(args: argparse.Namespace) -> dict:
    """{--flag: value} of what the ``--recipe`` set that the command line did not."""
    return {
        name: value
        for layer in _chosen_recipe_layers(args)
        for (field_name, value), name in zip(layer.values.items(), layer.options())
        if not given(args, layer.config_class, field_name)
    }


def parse_config(
    argv: Sequence[str] | None, prog: str, description: str, entry_recipe: Recipe | None = None
) -> TrainConfig:
    """Parses argv (None: sys.argv[1:]) into a validated config, or exits 2 with one line."""
    return parse_config_and_source(argv, prog, description, entry_recipe)[0]


def parse_config_and_source(
    argv: Sequence[str] | None, prog: str, description: str, entry_recipe: Recipe | None = None
) -> tuple[TrainConfig, DataSource]:
    """`parse_config`, and the run's data source (`config_and_source_from_args`)."""
    args = build_parser(prog, description, entry_recipe).parse_args(argv)
    try:
        return config_and_source_from_args(args)
    except BadInput as e:  # a flag, or the checkpoint --mode validate|test reads
        raise SystemExit(report_bad_input(prog, str(e))) from None
