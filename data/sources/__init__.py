"""Where the data comes from: one `DataSource` per kind of data, one module each, and
this registry of them.

Each module of this package holds its source whole: its flags (an options dataclass:
``ParquetOptions`` of data/sources/parquet.py), its feature description, its files and
loaders. The registry imports every module here at the top, the built-in ones by name
(their order is the order of the flags in --help) and any other module of the package
after them, so a new source is one file in data/sources/ (docs/extending.md). A
directory ``data/sources/`` under another entry of the Python path (PYTHONPATH: a
project of one's own) adds its modules too.

The data flags (`data.config.DataConfig`) name at most one source by its path flag
(``--in_memory_binary_criteo_path``, ``--synthetic_multi_hot_criteo_path``,
``--dataset_path``, ...); without one the data is uniform random. Everything that
depends on which source it is asks `source_for(config)`: the features the model is
built for (`DataSource.describe`), the files and per-rank loaders, the serving input
layout an export writes.

Imports no torch at import time: flags, sweeps and the torchx components consult the
registry without it. The shared nouns (`DataSource`, `FeatureDescription`,
`BatchLoader`) live in data/sources/types.py, below this module and every source.
"""

import importlib
import inspect
import pkgutil
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from common.config_flags import Flag, FlagError, flag_of, flags_of
from common.plugin_folders import plugin_folders

# The built-in sources, imported first: their flags come in this order (not isort's).
# isort: off
from data.sources import random, criteo_binary, split_binary, parquet

# isort: on
from data.sources.binary_files import BinaryFilesSource
from data.sources.criteo_binary import CriteoDays, CriteoMultiHotDays
from data.sources.parquet import ParquetSource
from data.sources.random import RandomData
from data.sources.split_binary import SplitBinarySpec
from data.sources.types import BatchLoader, DataSource, FeatureDescription

if TYPE_CHECKING:
    from data.config import DataConfig


__path__ = [*__path__, *plugin_folders(__path__, "data", "sources")]

_NOT_SOURCES = ("types", "binary_files")


def _sources_of(module: ModuleType) -> list[type[DataSource]]:
    """The sources a module defines: its concrete `DataSource` subclasses, in order."""
    return [
        value
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, DataSource)
        and not inspect.isabstract(value)
        and value.__module__ == module.__name__
    ]


def _modules() -> list[ModuleType]:
    """Every source module of the package: the built-in ones, then the others by name."""
    built_in = [random, criteo_binary, split_binary, parquet]
    names = {module.__name__ for module in built_in}
    others = sorted(
        info.name
        for info in pkgutil.iter_modules(__path__, f"{__name__}.")
        if info.name not in names and info.name.rsplit(".", 1)[1] not in _NOT_SOURCES
    )
    return built_in + [importlib.import_module(name) for name in others]


def _registry() -> dict[str, type[DataSource]]:
    """name -> source; refuses a name or a flag taken twice (DataConfig holds every
    source's flags at once)."""
    sources: dict[str, type[DataSource]] = {}
    taken: dict[str, str] = {}
    for module in _modules():
        for source in _sources_of(module):
            if source.name in sources:
                raise ValueError(f"{module.__name__}: data source {source.name!r} is already registered")
            for item in flags_of(source.options):
                if item.name in taken:
                    raise ValueError(
                        f"{module.__name__}: flag {item.option} is already data source {taken[item.name]!r}'s"
                    )
                taken[item.name] = source.name
            sources[source.name] = source
    return sources


SOURCES: dict[str, type[DataSource]] = _registry()
# The source chosen when no path flag is given (random data).
DEFAULT_SOURCE = next(name for name, source in SOURCES.items() if source.path_field is None)
# The DataConfig fields that name data (one of them at most).
DATA_PATH_FIELDS: tuple[str, ...] = tuple(s.path_field for s in SOURCES.values() if s.path_field)
# Each source's options class (DataConfig.source_options holds one of them), by name.
SOURCE_OPTIONS: dict[str, type[Any]] = {name: source.options for name, source in SOURCES.items()}


def _path_option(source: type[DataSource]) -> str:
    assert source.path_field is not None
    return flag_of(source.options, source.path_field).option


def chosen_source(values: Mapping[str, Any]) -> str:
    """The name of the source the data flags' values ({field: value}, every source's
    flags among them) choose: the one whose path flag is set, else random data.

    Raises:
        FlagError: when more than one path flag is set.
    """
    named = [source for source in SOURCES.values() if source.path_field and values.get(source.path_field)]
    if len(named) > 1:
        raise FlagError(f"give one data path, not {' and '.join(_path_option(s) for s in named)}")
    return named[0].name if named else DEFAULT_SOURCE


def refuse_flag_of_other_source(name: str, item: Flag) -> str:
    """The line refusing ``item``, a flag of source ``name``, given with other data."""
    return f"{item.option} is for {name} data: it needs {_path_option(SOURCES[name])}"


def source_for(config: "DataConfig") -> DataSource:
    """The source the flags name (the one whose options ``config.source_options`` are)."""
    chosen = next(source for source in SOURCES.values() if isinstance(config.source_options, source.options))
    return chosen(config)


def check_source_flags(config: "DataConfig") -> DataSource:
    """The source the flags name, its flags checked (`DataSource.check_flags`), and
    the checks that look at every source.

    Raises:
        FlagError: one line naming the flag.
    """
    source = source_for(config)
    source.check_flags()
    if config.weight_column is not None and not source.has_weights:
        weighted = " or ".join(_path_option(s) for s in SOURCES.values() if s.has_weights)
        raise FlagError(
            f"{flag_of(type(config), 'weight_column').option} needs data with sample weights "
            f"({weighted}); {source.name} data has none"
        )
    if config.sequence_columns and not source.has_sequences:
        with_sequences = " or ".join(s.name for s in SOURCES.values() if s.has_sequences)
        raise FlagError(
            f"{flag_of(type(config), 'sequence_columns').option} needs data with history features "
            f"({with_sequences} data); {source.name} data has none"
        )
    return source


__all__ = [
    "SOURCES",
    "DATA_PATH_FIELDS",
    "DEFAULT_SOURCE",
    "SOURCE_OPTIONS",
    "BatchLoader",
    "BinaryFilesSource",
    "CriteoDays",
    "CriteoMultiHotDays",
    "DataSource",
    "FeatureDescription",
    "ParquetSource",
    "RandomData",
    "SplitBinarySpec",
    "check_source_flags",
    "chosen_source",
    "refuse_flag_of_other_source",
    "source_for",
]
