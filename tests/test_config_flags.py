"""Flags declared once on the config classes: every flag parses into its field, the
recipes' precedence, docs/flags.md against the parsers, the plan CLI taking the
training flags, and the packages' import direction."""

import ast
import dataclasses
import os

import pytest

from common.config_flags import config_values, flag_of, flags_of, variant_fields
from data.criteo_layout import NUM_SPARSE_FEATURES
from sharding_plans import cli as plan_cli
from training.flags import FLAG_GROUPS, config_from_args, entry_point_parser
from training.recipes import DCNV2, RECIPES, SMALL_DATA

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ("dlrm_main.py", "dcnv2_main.py")


def _sample(item, default):
    """A value of the flag's type other than its default, and its command-line text."""
    if item.is_switch:
        return True, []
    if item.spec.choices is not None:
        value = next(c for c in reversed(item.spec.choices) if c != default)
    elif item.value_type == list[int]:
        value = [3, 5, 7]
    elif item.value_type is int:
        value = (default or 0) + 7
    elif item.value_type is float:
        value = (default or 0.0) + 0.25
    else:
        value = "some/path"
    text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return value, [text]


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("config_class, item", [(c, f) for c in dict.fromkeys(c for _, c, _ in FLAG_GROUPS)
                                                 for f in flags_of(c)],
                         ids=lambda v: getattr(v, "option", getattr(v, "__name__", "")))
def test_every_flag_parses_into_its_field_and_nothing_else(script, config_class, item):
    """Generated over every flag: the command line's value lands in its field, every
    other field keeps the entry point's default (the flags' names and list syntax are
    the public example's; tests/test_flags.py checks its command lines end to end).
    A variant's flag (an interaction's) is given with the choice of its variant and
    lands in the variant's config."""
    parser = entry_point_parser(script)
    layers = DCNV2.overrides if script == "dcnv2_main.py" else ()
    choice = _choosing_variant_of(config_class, item)
    defaults = config_values(config_class, parser.parse_args(choice), layers)
    holder = defaults if item.within is None else dataclasses.asdict(defaults[item.within])
    value, text = _sample(item, holder[item.field.name])
    parsed = config_values(config_class, parser.parse_args([*choice, item.option, *text]), layers)
    if item.within is None:
        chosen_variant = {name: (spec.classes[value] if spec.selector == item.field.name else type(defaults[name]))
                          for name, spec in variant_fields(config_class)}
        assert {name: type(parsed[name]) for name in chosen_variant} == chosen_variant
        assert {**parsed, **dict.fromkeys(chosen_variant)} == {**defaults, item.field.name: value,
                                                              **dict.fromkeys(chosen_variant)}
    else:
        assert parsed == {**defaults, item.within: dataclasses.replace(defaults[item.within], **{item.field.name: value})}


def _choosing_variant_of(config_class, item) -> list[str]:
    """The flags choosing the variant whose class declares ``item`` (none for a flag of
    the class's own)."""
    for name, spec in variant_fields(config_class):
        if item.within == name:
            variant = next(choice for choice, variant_class in spec.classes.items()
                           if item.field in dataclasses.fields(variant_class))
            return [flag_of(config_class, spec.selector).option, variant]
    return []


def test_every_flag_is_in_one_help_section():
    sections = [(c, name) for _, c, fields in FLAG_GROUPS
                for name in (fields if fields is not None else [f.field.name for f in flags_of(c)])]
    every = [(c, f.field.name) for c in dict.fromkeys(c for _, c, _ in FLAG_GROUPS) for f in flags_of(c)]
    assert sorted(sections, key=str) == sorted(every, key=str)
    titles = [g.title for g in entry_point_parser("dlrm_main.py")._action_groups]
    assert titles[2:] == list(dict.fromkeys(title for title, _, _ in FLAG_GROUPS))  # after argparse's own two


def test_the_adagrad_alias():
    parser = entry_point_parser("dlrm_main.py")
    assert config_from_args(parser.parse_args(["--adagrad"])).optim.optimizer == "adagrad"
    assert config_from_args(parser.parse_args([])).optim.optimizer == "sgd"


def test_command_line_beats_recipe_beats_entry_point_default():
    dcnv2 = entry_point_parser("dcnv2_main.py")
    small = config_from_args(dcnv2.parse_args(["--recipe", "small_data"]))
    settings = SMALL_DATA.options()
    assert small.model.interaction_type == "dcn"  # the entry point's kind stays
    assert (small.model.embedding_dim, small.model.dense_arch_layer_sizes, small.model.interaction.dcn_low_rank_dim) == (
        settings["--embedding_dim"], settings["--dense_arch_layer_sizes"], settings["--dcn_low_rank_dim"])  # > entry point
    assert (small.optim.optimizer, small.optim.learning_rate, small.dropout, small.epochs) == (
        settings["--optimizer"], settings["--learning_rate"], settings["--dropout"], settings["--epochs"])
    assert (small.early_stopping.patience, small.data.batch_size) == (
        settings["--early_stopping_patience"], settings["--batch_size"])
    given = config_from_args(dcnv2.parse_args(["--recipe", "small_data", "--embedding_dim", "32",
                                               "--dense_arch_layer_sizes", "64,32", "--optimizer", "sgd"]))
    assert (given.model.embedding_dim, given.optim.optimizer) == (32, "sgd")  # command line > recipe
    assert given.recipe == "small_data"
    assert "--embedding_dim" not in given.recipe_settings
    assert given.recipe_settings["--dropout"] == settings["--dropout"]
    dlrm = config_from_args(entry_point_parser("dlrm_main.py").parse_args(["--recipe", "small_data"]))
    assert dlrm.model.interaction_type == "original" and dlrm.model.embedding_dim == 16
    assert config_from_args(dcnv2.parse_args([])).recipe is None
    # The recipe's patience counts for the flags that need one.
    assert config_from_args(dcnv2.parse_args(["--recipe", "small_data", "--early_stopping_metric", "ne"])
                            ).early_stopping.metric == "ne"


def test_recipes_size_models_and_never_change_their_kind():
    for recipe in RECIPES.values():
        assert all("interaction_type" not in layer for layer in recipe.overrides), recipe.name


def test_help_lists_what_each_recipe_sets(capsys):
    with pytest.raises(SystemExit):
        entry_point_parser("dlrm_main.py").parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for recipe in RECIPES.values():
        for option, value in recipe.options().items():
            text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
            assert f"{option} {text}" in out


def test_docs_flags_md_matches_the_parsers():
    from scripts import flag_docs
    from scripts.generated_docs import replace_block

    with open(flag_docs.FLAGS_DOC) as f:
        doc = f.read()
    assert replace_block(doc, flag_docs.BEGIN, flag_docs.END, flag_docs.flag_tables()) == doc, (
        "docs/flags.md is out of date: run python scripts/flag_docs.py --write")


PLAN = ["plan", "--compute_device", "cpu", "--ddr_gb", "4", "--no_search"]
TRAINING = ["--num_embeddings", "1000", "--embedding_dim", "16", "--dense_arch_layer_sizes", "32,16",
            "--over_arch_layer_sizes", "8,1", "--interaction_type", "dcn", "--dcn_low_rank_dim", "4",
            "--adagrad", "--learning_rate", "0.1", "--max_table_rows", "100", "--sharding_type", "table_wise"]


def test_the_plan_cli_takes_the_training_command_line(capsys):
    config = config_from_args(entry_point_parser("dlrm_main.py").parse_args(TRAINING))
    assert plan_cli.main(PLAN + TRAINING) == 0
    out = capsys.readouterr().out
    assert "t_cat_25" in out and "100    16" in out  # the capped rows and the width of the training run
    assert config.model.num_embeddings_per_feature == [100] * NUM_SPARSE_FEATURES
    assert plan_cli.main(PLAN + TRAINING + ["--dense_arch_layer_sizes", "32,8"]) == 2
    err = capsys.readouterr().err
    assert "the last --dense_arch_layer_sizes value (8) must equal --embedding_dim (16)" in err


# Packages and the packages they must not import.
FORBIDDEN = {
    "sharding_plans": ("training", "serving", "sweeps"),
    "models": ("training", "serving", "sweeps", "sharding_plans"),
    "data": ("training", "serving", "sweeps", "sharding_plans", "models"),
    "common": ("training", "serving", "sweeps", "sharding_plans", "models", "data"),
    "torchx_components": ("torch",),
    "aws_component.py": ("torch",),
}


def _imports(path: str):
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


@pytest.mark.parametrize("package", list(FORBIDDEN))
def test_no_package_imports_upward(package):
    root = os.path.join(REPO, package)
    files = [root] if root.endswith(".py") else [os.path.join(d, f) for d, _, fs in os.walk(root)
                                                   for f in fs if f.endswith(".py")]
    assert files
    arrows = [(os.path.relpath(path, REPO), name) for path in files for name in _imports(path)
              if name.split(".")[0] in FORBIDDEN[package]]
    assert arrows == []
