"""Flags declared once on the config classes: every flag parses into its field, the
recipes' precedence, docs/flags.md against the parsers and the plan CLI taking the
training flags (the packages' import direction: tests/test_architecture.py)."""

import ast
import dataclasses
import os
import re
import textwrap
from dataclasses import dataclass

import pytest

from common.cli import OneLineParser, positive_int
from common.config_flags import config_values, flag, flag_of, flags_of, parse_flags, variant_fields
from data.binary.criteo_layout import NUM_SPARSE_FEATURES
from data.sources import SOURCES
from recipes import RECIPES, SMALL_DATA
from sharding_plans import cli as plan_cli
from tests.support.flag_values import other_value
from training.flags import FLAG_GROUPS, config_from_args, entry_point_parser, recipe_overrides
from training.recipes import DCNV2

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = ("dlrm_main.py", "dcnv2_main.py")


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize(
    "config_class, item",
    [(c, f) for c in dict.fromkeys(c for _, c, _ in FLAG_GROUPS) for f in flags_of(c)],
    ids=lambda v: getattr(v, "option", getattr(v, "__name__", "")),
)
def test_every_flag_parses_into_its_field_and_nothing_else(script, config_class, item):
    """Generated over every flag: the command line's value lands in its field, every
    other field keeps the entry point's default (the flags' names and list syntax are
    the public example's; tests/training/test_flags.py checks its command lines end to end).
    A variant's flag (an interaction's) is given with the choice of its variant and
    lands in the variant's config."""
    parser = entry_point_parser(script)
    layers = recipe_overrides(DCNV2) if script == "dcnv2_main.py" else ()
    choice = _choosing_variant_of(config_class, item)
    defaults = config_values(config_class, parser.parse_args(choice), layers)
    holder = defaults if item.within is None else dataclasses.asdict(defaults[item.within])
    value, text = other_value(item, holder[item.field.name])
    parsed = config_values(config_class, parser.parse_args([*choice, item.option, *text]), layers)
    if item.within is None:
        chosen_variant = {
            name: (spec.classes[value] if spec.selector == item.field.name else type(defaults[name]))
            for name, spec in variant_fields(config_class)
        }
        assert {name: type(parsed[name]) for name in chosen_variant} == chosen_variant
        assert {**parsed, **dict.fromkeys(chosen_variant)} == {
            **defaults,
            item.field.name: value,
            **dict.fromkeys(chosen_variant),
        }
    else:
        assert parsed == {
            **defaults,
            item.within: dataclasses.replace(defaults[item.within], **{item.field.name: value}),
        }


def _choosing_variant_of(config_class, item) -> list[str]:
    """The flags choosing the variant whose class declares ``item`` (none for a flag of
    the class's own)."""
    for name, spec in variant_fields(config_class):
        if item.within == name:
            variant = next(
                choice
                for choice, variant_class in spec.classes.items()
                if item.field in dataclasses.fields(variant_class)
            )
            if not isinstance(spec.selector, str):  # a data source: chosen by giving its path
                path_field = SOURCES[variant].path_field
                return [] if path_field is None else [flag_of(config_class, path_field).option, "/x"]
            return [flag_of(config_class, spec.selector).option, variant]
    return []


def test_every_flag_is_in_one_help_section():
    sections = [
        (c, name)
        for _, c, fields in FLAG_GROUPS
        for name in (fields if fields is not None else [f.field.name for f in flags_of(c)])
    ]
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
    assert (
        small.model.embedding_dim,
        small.model.dense_arch_layer_sizes,
        small.model.interaction.dcn_low_rank_dim,
    ) == (
        settings["--embedding_dim"],
        settings["--dense_arch_layer_sizes"],
        settings["--dcn_low_rank_dim"],
    )  # > entry point
    assert (small.optim.optimizer, small.optim.learning_rate, small.dropout, small.epochs) == (
        settings["--optimizer"],
        settings["--learning_rate"],
        settings["--dropout"],
        settings["--epochs"],
    )
    assert (small.early_stopping.patience, small.data.batch_size) == (
        settings["--early_stopping_patience"],
        settings["--batch_size"],
    )
    given = config_from_args(
        dcnv2.parse_args(
            [
                "--recipe",
                "small_data",
                "--embedding_dim",
                "32",
                "--dense_arch_layer_sizes",
                "64,32",
                "--optimizer",
                "sgd",
            ]
        )
    )
    assert (given.model.embedding_dim, given.optim.optimizer) == (32, "sgd")  # command line > recipe
    assert given.recipe == "small_data"
    assert "--embedding_dim" not in given.recipe_settings
    assert given.recipe_settings["--dropout"] == settings["--dropout"]
    dlrm = config_from_args(entry_point_parser("dlrm_main.py").parse_args(["--recipe", "small_data"]))
    assert dlrm.model.interaction_type == "original" and dlrm.model.embedding_dim == 16
    assert config_from_args(dcnv2.parse_args([])).recipe is None
    # The recipe's patience counts for the flags that need one.
    assert (
        config_from_args(
            dcnv2.parse_args(["--recipe", "small_data", "--early_stopping_metric", "ne"])
        ).early_stopping.metric
        == "ne"
    )


def test_recipes_size_models_and_never_change_their_kind():
    for recipe in RECIPES.values():
        assert "interaction_type" not in recipe.settings, recipe.name


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_recipe_trains_as_given_and_table_sizes_given_win(name):
    """Generated over every recipe: each of its flags is a training flag, and the
    config it gives both entry points is valid; table sizes given on the command line
    (either flag) replace the recipe's, a cap applies to them."""
    recipe = RECIPES[name]
    assert {layer.config_class for layer in recipe_overrides(recipe)}  # every flag typed (TypeError otherwise)
    for script in SCRIPTS:
        config = config_from_args(entry_point_parser(script).parse_args(["--recipe", name]))
        rows = recipe.settings.get("num_embeddings_per_feature")
        if rows is not None:
            assert config.model.num_embeddings_per_feature == rows
            assert config.recipe_settings["--num_embeddings_per_feature"] == rows
        given = config_from_args(entry_point_parser(script).parse_args(["--recipe", name, "--num_embeddings", "7"]))
        assert given.model.num_embeddings_per_feature == [7] * NUM_SPARSE_FEATURES
        assert "--num_embeddings_per_feature" not in given.recipe_settings
        capped = config_from_args(entry_point_parser(script).parse_args(["--recipe", name, "--max_table_rows", "9"]))
        assert max(capped.model.num_embeddings_per_feature) <= 9


def test_help_lists_what_each_recipe_sets(capsys):
    with pytest.raises(SystemExit):
        entry_point_parser("dlrm_main.py").parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for recipe in RECIPES.values():
        assert " ".join(recipe.describe().split()) in out
        assert all(option in recipe.describe() for option in recipe.options())


def test_docs_flags_md_matches_the_parsers():
    from scripts import flag_docs
    from scripts.generated_docs import replace_block

    with open(flag_docs.FLAGS_DOC) as f:
        doc = f.read()
    assert replace_block(doc, flag_docs.BEGIN, flag_docs.END, flag_docs.flag_tables()) == doc, (
        "docs/flags.md is out of date: run python scripts/flag_docs.py --write"
    )


PLAN = ["plan", "--compute_device", "cpu", "--ddr_gb", "4", "--no_search"]
TRAINING = [
    "--num_embeddings",
    "1000",
    "--embedding_dim",
    "16",
    "--dense_arch_layer_sizes",
    "32,16",
    "--over_arch_layer_sizes",
    "8,1",
    "--interaction_type",
    "dcn",
    "--dcn_low_rank_dim",
    "4",
    "--adagrad",
    "--learning_rate",
    "0.1",
    "--max_table_rows",
    "100",
    "--sharding_type",
    "table_wise",
]


def test_the_plan_cli_takes_the_training_command_line(capsys):
    config = config_from_args(entry_point_parser("dlrm_main.py").parse_args(TRAINING))
    assert plan_cli.main(PLAN + TRAINING) == 0
    out = capsys.readouterr().out
    assert "t_cat_25" in out and "100    16" in out  # the capped rows and the width of the training run
    assert config.model.num_embeddings_per_feature == [100] * NUM_SPARSE_FEATURES
    assert plan_cli.main(PLAN + TRAINING + ["--dense_arch_layer_sizes", "32,8"]) == 2
    err = capsys.readouterr().err
    assert "the last --dense_arch_layer_sizes value (8) must equal --embedding_dim (16)" in err


_ARGS_ENTRY = re.compile(r"^(\s+)([\w, ]+):")


def docstring_args(docstring: str) -> set[str]:
    """The names an ``Args:`` section of a class docstring describes (``a, b: ...`` names two)."""
    names: set[str] = set()
    lines = docstring.splitlines()
    for start, line in enumerate(lines):
        if line.strip() != "Args:":
            continue
        indent = None
        for entry in lines[start + 1 :]:
            if not entry.strip():
                break
            match = _ARGS_ENTRY.match(entry)
            if indent is None and match:
                indent = match.group(1)
            if len(entry) - len(entry.lstrip()) <= len(line) - len(line.lstrip()):
                break  # the section ended
            if match and match.group(1) == indent:
                names.update(name.strip() for name in match.group(2).split(","))
    return names


def flag_fields_described_twice(source: str) -> list[tuple[str, str]]:
    """(class, field) of the dataclasses in ``source`` whose docstring's ``Args:`` describes
    a field declared with ``flag(...)``, whose help= already says what it is."""
    twice = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        flag_fields = {
            statement.target.id
            for statement in node.body
            if isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(statement.value, ast.Call)
            and isinstance(statement.value.func, ast.Name)
            and statement.value.func.id == "flag"
        }
        described = docstring_args(ast.get_docstring(node, clean=False) or "")
        twice += [(node.name, name) for name in sorted(flag_fields & described)]
    return twice


def test_flag_fields_described_twice_finds_them():
    source = textwrap.dedent('''
        @dataclass
        class Run:
            """A run.

            Args:
                epochs, seed: passes and seed.
                model: the architecture.
            """

            model: int
            epochs: int = flag(1, help="passes")
            seed: int = flag(0, help="seed")
            steps: int = flag(0, help="steps")
        ''')
    assert flag_fields_described_twice(source) == [("Run", "epochs"), ("Run", "seed")]


def test_every_flag_is_described_once_by_its_help():
    """A flag field's meaning is its help= (what --help and docs/flags.md show); the class
    docstring says what the class is for, and describes only the fields that are not flags."""
    files = []
    for d, subdirs, fs in os.walk(REPO):
        subdirs[:] = [s for s in subdirs if not s.startswith(".") and not (d == REPO and s == "tests")]  # .venv*, .git
        files += [os.path.join(d, f) for f in fs if f.endswith(".py")]
    twice = [
        (os.path.relpath(path, REPO), cls, name)
        for path in files
        for cls, name in flag_fields_described_twice(open(path).read())
    ]
    assert twice == []


@dataclass
class _CopyJob:
    """A command line of every kind of flag config_flags declares."""

    source: str = flag(help="what to copy", positional=True, metavar="SOURCE_DIR")
    output: str = flag(help="where the copy goes")
    chunk_rows: int = flag(64, help="rows per block", parse=positive_int)
    sizes: list[int] | None = flag(None, help="table sizes")
    extra_flags: list[str] = flag([], help="a flag passed on (repeat it)", name="extra")
    dry_run: bool = flag(False, help="print, copy nothing")


def test_required_positional_repeated_and_parsed_flags(capsys):
    job = parse_flags(
        OneLineParser(prog="copy"),
        _CopyJob,
        ["in", "--output", "out", "--extra=--a=1", "--extra=--b", "--sizes", "4,5"],
    )
    assert job == _CopyJob(
        source="in", output="out", chunk_rows=64, sizes=[4, 5], extra_flags=["--a=1", "--b"], dry_run=False
    )
    assert parse_flags(OneLineParser(prog="copy"), _CopyJob, ["in", "--output", "out"]).extra_flags == []
    assert _CopyJob("a", "b").extra_flags == [] and _CopyJob("a", "b").extra_flags is not _CopyJob("a", "b").extra_flags
    for argv, message in (
        (["in"], "the following arguments are required: --output"),
        (["--output", "out"], "the following arguments are required: SOURCE_DIR"),
        (["in", "--output", "out", "--chunk_rows", "0"], "argument --chunk_rows: must be positive, got 0"),
    ):
        with pytest.raises(SystemExit) as exited:
            parse_flags(OneLineParser(prog="copy"), _CopyJob, argv)
        assert exited.value.code == 2 and capsys.readouterr().err == f"copy: error: {message}\n"
    with pytest.raises(SystemExit):
        parse_flags(OneLineParser(prog="copy"), _CopyJob, ["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "SOURCE_DIR what to copy" in help_text and "--output OUTPUT where the copy goes" in help_text
    assert "rows per block (default 64)" in help_text and "(repeat it) " in help_text + " "
    assert "(default )" not in help_text and "(default None)" not in help_text
    with pytest.raises(TypeError):
        flag("x", help="a positional argument with a default", positional=True)
