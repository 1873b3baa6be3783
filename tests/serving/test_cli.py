"""The serving CLIs' flags, declared on config dataclasses (common/config_flags.py):
every flag parses into its field and nothing else, the parser's defaults are the
fields', a flag without a default is required (one line, exit 2)."""

import pytest

from common.config_flags import flags_of
from serving import export, predict, quality_gate, serve
from serving.cli import parse_config, serving_parser
from tests.support.flag_values import other_value

# Each command's config classes, in the order its parser adds them.
COMMANDS = {
    "export": [export.ExportConfig],
    "predict": [predict.PredictConfig],
    "quality_gate": [quality_gate.GateConfig],
    "serve": [serve.ServeConfig, serve.HttpLimits],
}
# Flags parsed by a function of their own: (command-line text, value).
PARSED = {"quantize": ("int8", ["int8"]), "keep_columns": ("label,cat_3", ["label", "cat_3"]), "max_bag_size": ("9", 9)}


def _required(config_classes) -> list[str]:
    """Command-line values for every required flag (a path: they all take one)."""
    return [
        text
        for c in config_classes
        for item in flags_of(c)
        if item.required
        for text in (item.option, f"/some/{item.name}")
    ]


def _sample(item, default):
    """A value other than the default, and its command-line text."""
    if item.field.name in PARSED:
        text, value = PARSED[item.field.name]
        return value, [text]
    return other_value(item, default)


def _parse(command: str, argv: list[str]) -> list:
    return parse_config(serving_parser(command, f"python -m serving.{command}"), COMMANDS[command], argv)


@pytest.mark.parametrize(
    "command, config_class, item",
    [
        (command, c, item)
        for command, classes in COMMANDS.items()
        for c in classes
        for item in flags_of(c)
        if not item.required
    ],
    ids=lambda v: getattr(v, "option", getattr(v, "__name__", v)),
)
def test_every_serving_flag_parses_into_its_field_and_nothing_else(command, config_class, item):
    required = _required(COMMANDS[command])
    defaults = _parse(command, required)
    index = COMMANDS[command].index(config_class)
    assert defaults[index] == config_class(
        **{f.field.name: getattr(defaults[index], f.field.name) for f in flags_of(config_class) if f.required}
    )  # the fields' defaults
    value, text = _sample(item, getattr(defaults[index], item.field.name))
    parsed = _parse(command, [*required, item.option, *text])
    expected = list(defaults)
    expected[index] = config_class(**{**vars(defaults[index]), item.field.name: value})
    assert parsed == expected


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_required_flag_is_one_line_and_exit_2(command, capsys):
    required = _required(COMMANDS[command])
    assert required, "every serving command takes a path"
    with pytest.raises(SystemExit) as exit_:
        _parse(command, required[2:])  # the first required flag left out
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"the following arguments are required: {required[0]}" in err, err
