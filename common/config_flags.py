"""Command-line flags declared once, on the config dataclasses' fields.

A config field is a flag when it is declared with `flag`: its default, help text and
choices are in the field's metadata, and `add_flags` builds the parser's options from
them (``--<field>`` unless the metadata names the flag otherwise; ``bool`` fields
are switches, ``list[int]`` fields take ``512,256,64``, ``list[float]`` ones ``0.5,1``, ``list[str]``
fields are repeated flags, each one adding an item; a field without a default is a
required flag, or a positional argument with ``positional=True``). `Overrides` holds
values for some fields of one config class (a recipe's), checked against its fields.

A field declared with `variants` holds the config of one of several classes, the one
another flag field names (``ModelConfig.interaction``, chosen by ``--interaction_type``).
The class's flags are then the union of its own and every variant's: one parser, one
`Overrides` and one `config_values` cover them, and the values of the variants not
chosen are ignored (the public example's command lines carry them all).

Flags are added without parser defaults, so the parsed namespace holds exactly what
the command line gave; `config_values` fills in the rest, the command line winning
over the overrides, and the overrides over the fields' defaults:

    @dataclass
    class RunConfig:
        epochs: int = flag(1, help="passes over the training split")
        sizes: list[int] = flag([512, 64], help="layer sizes", name="layer_sizes")

    parser = OneLineParser()
    add_flags(parser, RunConfig)
    args = parser.parse_args(["--layer_sizes", "8,4"])
    RunConfig(**config_values(RunConfig, args, [Overrides(RunConfig, epochs=3)]))
    # RunConfig(epochs=3, sizes=[8, 4])
"""

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common.cli import float_list, int_list
from common.errors import BadInput

# How a list field's one command-line value (``512,256,64``) becomes its value.
_LIST_PARSERS: dict[Any, Callable[[str], Any]] = {list[int]: int_list, list[float]: float_list}

_FLAG = "flag"
_VARIANTS = "variants"


class FlagError(BadInput):
    """A flag's value is wrong; the message names the flag."""


@dataclass(frozen=True)
class FlagSpec:
    """What the parser and the documentation say of one config field.

    Args:
        help: one line saying what the flag does.
        choices: the values it accepts (None: any of its type).
        name: the flag's name when it is not the field's (``--adagrad`` style names of
            the public example).
        alias: (switch name, value): a switch that sets the field to the value
            (``--adagrad`` for ``--optimizer adagrad``); giving both with another
            value is refused.
        former_names: names the flag had before, still accepted as the same flag.
        metavar: what ``--help`` calls the value (None: the flag's name in capitals).
        parse: parses the command line's text, raising ``argparse.ArgumentTypeError``
            (``common.cli.positive_int``); None: the field's type.
        positional: a positional argument (named by the field) instead of ``--name``.
    """

    help: str
    choices: tuple[Any, ...] | None = None
    name: str | None = None
    alias: tuple[str, Any] | None = None
    former_names: tuple[str, ...] = ()
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    positional: bool = False


def flag(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    choices: Sequence[Any] | None = None,
    name: str | None = None,
    alias: tuple[str, Any] | None = None,
    former_names: Sequence[str] = (),
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    positional: bool = False,
) -> Any:
    """A dataclass field that is a command-line flag (a list default is copied per instance);
    without a default, the command line must give it.

    Example::

        embedding_dim: int = flag(64, help="width of every embedding table")
        output_dir: str = flag(help="where the files go")  # required
    """
    if positional and (default is not dataclasses.MISSING or alias or former_names):
        raise TypeError("a positional argument has no default, alias or former names")
    metadata = {
        _FLAG: FlagSpec(
            help,
            tuple(choices) if choices is not None else None,
            name,
            alias,
            tuple(former_names),
            metavar,
            parse,
            positional,
        )
    }
    if isinstance(default, list):
        frozen = tuple(default)
        return dataclasses.field(default_factory=lambda: list(frozen), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class VariantsSpec:
    """A `variants` field: what chooses the class, and the classes by name.

    ``selector`` is the flag field whose value names the class, or a function of the
    flags' values ({field: value}: the class's own and every variant's) returning the
    name (raising FlagError when they contradict). ``refuse_others``: None, the flags
    of the variants not chosen are ignored; else a flag of one of them set to other
    than its default is refused with the line ``refuse_others(variant, flag)`` gives.
    """

    selector: str | Callable[[Mapping[str, Any]], str]
    classes: Mapping[str, type[Any]]
    refuse_others: Callable[[str, "Flag"], str] | None = None

    def chosen(self, values: Mapping[str, Any]) -> type[Any] | None:
        """The class ``values`` choose (None when the selector names no class)."""
        key = values[self.selector] if isinstance(self.selector, str) else self.selector(values)
        return self.classes.get(key)


def variants(
    selector: str | Callable[[Mapping[str, Any]], str],
    classes: Mapping[str, type[Any]],
    refuse_others: Callable[[str, "Flag"], str] | None = None,
) -> Any:
    """A dataclass field holding the config of one of ``classes``, the one named by the
    flag field ``selector`` (whose choices are the names), or by the function
    ``selector`` of the flags' values (`VariantsSpec`). It defaults to None: the class
    fills in the chosen variant's defaults (``__post_init__``).

    Example::

        interaction: InteractionConfig = variants("interaction_type", {"dcn": DCNConfig, ...})
    """
    return dataclasses.field(default=None, metadata={_VARIANTS: VariantsSpec(selector, dict(classes), refuse_others)})


def variant_fields(config_class: type[Any]) -> list[tuple[str, VariantsSpec]]:
    """[(field name, spec)] of the class's `variants` fields."""
    return [(f.name, f.metadata[_VARIANTS]) for f in dataclasses.fields(config_class) if _VARIANTS in f.metadata]


@dataclass(frozen=True)
class Flag:
    """One flag of a config class: its field, its spec and the value type it parses.
    ``within``: the `variants` field whose classes declare it (None: the class's own)."""

    field: dataclasses.Field[Any]
    spec: FlagSpec
    value_type: Any  # int, float, str, bool, list[int], list[float] or list[str] (Optional removed)
    within: str | None = None

    @property
    def name(self) -> str:
        return self.spec.name or self.field.name

    @property
    def option(self) -> str:
        return f"--{self.name}"

    @property
    def default(self) -> Any:
        if self.field.default_factory is not dataclasses.MISSING:
            return self.field.default_factory()
        return None if self.field.default is dataclasses.MISSING else self.field.default

    @property
    def required(self) -> bool:
        """Whether the field has no default: the command line (or an override) gives it."""
        return self.field.default is dataclasses.MISSING and self.field.default_factory is dataclasses.MISSING

    @property
    def is_switch(self) -> bool:
        return self.value_type is bool

    @property
    def is_repeated(self) -> bool:
        """A ``list[str]`` field without its own ``parse``: each ``--name VALUE`` adds an
        item (with ``parse``, one value gives the whole list: ``--quantize fp16,int8``)."""
        return self.value_type == list[str] and self.spec.parse is None

    def parse_type(self) -> Callable[[str], Any]:
        if self.spec.parse is not None:
            return self.spec.parse
        if self.value_type in _LIST_PARSERS:
            return _LIST_PARSERS[self.value_type]
        return str if self.is_repeated else self.value_type


def _without_optional(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    # Optional[X] and `X | None` (types.UnionType) are the same flag
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def flags_of(config_class: type[Any]) -> list[Flag]:
    """The flags of a config class, in field order; a `variants` field's are every
    variant's, in the order of its classes."""
    hints = typing.get_type_hints(config_class)
    flags = []
    for f in dataclasses.fields(config_class):
        if _FLAG in f.metadata:
            flags.append(Flag(f, f.metadata[_FLAG], _without_optional(hints[f.name])))
        elif _VARIANTS in f.metadata:
            flags += [
                dataclasses.replace(item, within=f.name)
                for variant in f.metadata[_VARIANTS].classes.values()
                for item in flags_of(variant)
            ]
    return flags


def flag_of(config_class: type[Any], field_name: str) -> Flag:
    """The flag of one field; KeyError when the field is not a flag."""
    for item in flags_of(config_class):
        if item.field.name == field_name:
            return item
    raise KeyError(f"{config_class.__name__}.{field_name} is not a flag")


def option(config: Any, field_name: str) -> str:
    """``--name`` of a config's field, for messages: ``option(self, "embedding_dim")``."""
    return flag_of(config if isinstance(config, type) else type(config), field_name).option


def check_layer_sizes(config: Any, field_name: str, sizes: list[int]) -> None:
    """Raises FlagError unless ``sizes`` (the value of a layer-sizes flag) lists at
    least one size and only positive ones."""
    if not sizes:
        raise FlagError(f"{option(config, field_name)} must list at least one layer size")
    bad = [s for s in sizes if s <= 0]
    if bad:
        raise FlagError(f"{option(config, field_name)} sizes must be positive, got {bad[0]} in {sizes}")


def check_choices(config: Any) -> None:
    """Raises FlagError for a flag field whose value is not one of its choices (None
    passes: an optional flag not given), the chosen variant's included."""
    for name, _ in variant_fields(type(config)):
        if getattr(config, name) is not None:
            check_choices(getattr(config, name))
    for item in flags_of(type(config)):
        if item.within is not None:
            continue
        value = getattr(config, item.field.name)
        choices = item.spec.choices
        if choices is not None and value is not None and value not in choices:
            raise FlagError(f"{item.option} must be one of {', '.join(map(str, choices))}, got {value!r}")


class Overrides:
    """Values for some flag fields of one config class (a recipe's part of it).

    Args:
        config_class: the config dataclass.
        values: field name -> value; every name must be a flag of the class and every
            choice one of the flag's.

    Example::

        Overrides(ModelConfig, embedding_dim=16, dense_arch_layer_sizes=[64, 16])
    """

    def __init__(self, config_class: type[Any], **values: Any) -> None:
        flags = {f.field.name: f for f in flags_of(config_class)}
        for field_name, value in values.items():
            if field_name not in flags:
                raise TypeError(f"{config_class.__name__} has no flag field {field_name!r}")
            choices = flags[field_name].spec.choices
            if choices is not None and value not in choices:
                raise TypeError(f"{config_class.__name__}.{field_name}: {value!r} is not one of {choices}")
        self.config_class = config_class
        self.values: Mapping[str, Any] = dict(values)

    def __contains__(self, field_name: str) -> bool:
        return field_name in self.values

    def options(self) -> dict[str, Any]:
        """{``--flag``: value} of what these overrides set."""
        return {flag_of(self.config_class, name).option: value for name, value in self.values.items()}


def _describe(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def default_of(item: Flag, overrides: Sequence[Overrides], config_class: type[Any]) -> Any:
    """The flag's value when the command line does not give it: the last override
    that sets it, else the field's default."""
    for layer in reversed(overrides):
        if layer.config_class is config_class and item.field.name in layer:
            return layer.values[item.field.name]
    return item.default


def add_flags(
    parser: Any,
    config_class: type[Any],
    overrides: Sequence[Overrides] = (),
    exclude: Sequence[str] = (),
    parser_defaults: bool = False,
) -> None:
    """Adds the class's flags to ``parser`` (or an argument group), without parser
    defaults; the help ends with the default ``overrides`` give it. A field without
    a default is a required flag.

    Args:
        parser: an ``argparse`` parser or argument group.
        config_class: the config dataclass.
        overrides: the defaults' layers (an entry point's recipe), last one winning.
        exclude: field names not to add.
        parser_defaults: give the parser the defaults instead (a command without
            recipes, whose help formatter shows them: the serving CLIs).
    """
    for item in flags_of(config_class):
        if item.field.name in exclude:
            continue
        default = default_of(item, overrides, config_class)
        shown = "" if default in (None, []) or item.is_switch or parser_defaults else f" (default {_describe(default)})"
        former = [f"--{name}" for name in item.spec.former_names]
        also = f" (formerly {', '.join(former)})" if former else ""
        metavar = item.spec.metavar or (item.name.upper() if item.spec.choices is None else None)
        if item.spec.positional:
            parser.add_argument(
                item.field.name,
                type=item.parse_type(),
                choices=item.spec.choices,
                metavar=item.spec.metavar,
                help=item.spec.help,
            )  # None: argparse's lower case
            continue
        common = dict(
            dest=item.field.name,
            help=item.spec.help + also + shown,
            default=default if parser_defaults and not item.required else argparse.SUPPRESS,
        )
        options = [item.option] + former
        if item.is_switch:
            parser.add_argument(*options, action="store_true", **common)
        else:
            parser.add_argument(
                *options,
                type=item.parse_type(),
                choices=item.spec.choices,
                metavar=metavar,
                required=item.required
                and not any(item.field.name in o for o in overrides if o.config_class is config_class),
                action="append" if item.is_repeated else "store",
                **common,
            )
        if item.spec.alias is not None:
            switch, value = item.spec.alias
            parser.add_argument(
                f"--{switch}",
                action="store_true",
                default=argparse.SUPPRESS,
                dest=_alias_dest(item),
                help=f"the same as {item.option} {value}",
            )


def _alias_dest(item: Flag) -> str:
    return f"{item.field.name}__alias"


def given(args: argparse.Namespace, config_class: type[Any], field_name: str) -> bool:
    """Whether the command line gave the field's flag (or its alias)."""
    item = flag_of(config_class, field_name)
    return hasattr(args, item.field.name) or hasattr(args, _alias_dest(item))


def config_values(
    config_class: type[Any], args: argparse.Namespace, overrides: Sequence[Overrides] = (), exclude: Sequence[str] = ()
) -> dict[str, Any]:
    """{field: value} of the class's flags: the command line's, else the overrides',
    else the field's default; a `variants` field's value is the chosen class built from
    its flags so (None when the selector names no class: the class's validate says so).
    Raises FlagError when a switch alias contradicts its flag (``--adagrad --optimizer sgd``)."""
    values = {
        item.field.name: _value(item, args, overrides, config_class)
        for item in flags_of(config_class)
        if item.within is None and item.field.name not in exclude
    }
    for name, spec in variant_fields(config_class):
        offered = {
            variant: {item.field.name: _value(item, args, overrides, config_class) for item in flags_of(variant_class)}
            for variant, variant_class in spec.classes.items()
        }
        chosen = spec.chosen({**values, **{k: v for fields in offered.values() for k, v in fields.items()}})
        if spec.refuse_others is not None:
            for variant, variant_class in spec.classes.items():
                for item in flags_of(variant_class) if variant_class is not chosen else ():
                    if offered[variant][item.field.name] != item.default:
                        raise FlagError(spec.refuse_others(variant, dataclasses.replace(item, within=name)))
        values[name] = None if chosen is None else chosen(**offered[_name_of(spec, chosen)])
    return values


def _name_of(spec: VariantsSpec, variant_class: type[Any]) -> str:
    return next(name for name, c in spec.classes.items() if c is variant_class)


def parse_flags(parser: Any, config_class: type[Any], argv: Sequence[str] | None = None) -> Any:
    """A CLI whose flags are one config class's: adds them to ``parser``, parses ``argv``
    (None: sys.argv[1:]) and returns the config built from it (bad flags: the parser's
    error, one line and exit 2 with ``common.cli.OneLineParser``).

    Example::

        config = parse_flags(OneLineParser(prog="python -m data.transcode"), TranscodeConfig, argv)
    """
    add_flags(parser, config_class)
    return config_class(**config_values(config_class, parser.parse_args(argv)))


def _value(item: Flag, args: argparse.Namespace, overrides: Sequence[Overrides], config_class: type[Any]) -> Any:
    value = getattr(args, item.field.name, argparse.SUPPRESS)
    if item.spec.alias is not None and getattr(args, _alias_dest(item), False):
        switch, aliased = item.spec.alias
        if value is not argparse.SUPPRESS and value != aliased:
            raise FlagError(f"--{switch} contradicts {item.option} {value}")
        value = aliased
    return default_of(item, overrides, config_class) if value is argparse.SUPPRESS else value


def config_from_record(config_class: type[Any], record: Mapping[str, Any]) -> Any:
    """The config ``dataclasses.asdict`` gave ``record`` of, its `variants` fields
    rebuilt as the class their selector names. Raises TypeError for a field the class
    does not know or one missing, KeyError for a selector naming no class."""
    fields = dict(record)
    for name, spec in variant_fields(config_class):
        if name in fields:
            if isinstance(spec.selector, str):
                chosen = spec.classes[fields[spec.selector]]
            else:  # a function of the values: the variant's are in its field
                by_values = spec.chosen({**fields, **fields[name]})
                if by_values is None:
                    raise KeyError(f"{config_class.__name__}.{name}: no variant chosen")
                chosen = by_values
            fields[name] = chosen(**fields[name])
    return config_class(**fields)
