"""The sweep file: one YAML document describing every run of a sweep.

    name: table_sizes
    script: dlrm_main.py            # or dcnv2_main.py
    scheduler: local_cwd            # local_cwd | slurm | kubernetes
    scheduler_args: {}              # torchx -cfg (partition, time, queue, ...)
    nnodes: 1
    nproc_per_node: 2
    output_dir: sweeps/table_sizes  # one subdirectory per run, plus results.*
    flags: {batch_size: 512}        # shared by every run
    grid: {max_table_rows: [100, 1000, null]}

Beyond a grid (docs/launching.md shows each):

- a value of ``grid`` or ``zip`` may carry a name, ``{name: small, value: [...]}``,
  which run names, results and plots show instead of the value;
- ``zip: {flag: [...], other_flag: [...]}``: lists of one length whose i-th values
  form one configuration together (crossed with ``grid`` when both are given);
- ``seeds: [0, 1, 2]``: every configuration runs once per seed (``--seed``);
  results.md adds the mean and standard deviation per configuration;
- ``search: random`` with ``trials: N`` and ``space: {flag: DISTRIBUTION}`` (one of
  ``{choice: [...]}``, ``{uniform: [low, high]}``, ``{log_uniform: [low, high]}``,
  ``{int: [low, high]}``, bounds included) draws N configurations instead of a
  grid, from ``random.Random(search_seed)`` (default 0): a file always expands to the
  same trials.

Optional keys: ``component_args`` (more parameters of the torchx component, e.g.
``{h: cpu, cpu: 2}``) and ``checkpoints`` (true: every run gets its own checkpoint
directory, which a restarted job resumes from). ``num_embeddings_scale`` may appear in
``flags`` or ``grid``: it scales the data's own cardinalities into an explicit
``--num_embeddings_per_feature``.

This module checks the file's shape (no training flag knowledge, no torch);
``sweeps.training_flags`` checks the flags against the training parser.

Example::

    spec = load_sweep("examples/sweeps/table_sizes.yaml")
    for run in spec.runs():
        print(run.name, run.flags)
"""

import itertools
import math
import os
import random
import re
from dataclasses import dataclass, field
from typing import Any

from common.errors import BadInput
from common.yaml_file import load_yaml

SCRIPTS = ("dlrm_main.py", "dcnv2_main.py")
SCHEDULERS = ("local_cwd", "slurm", "kubernetes")
REQUIRED_KEYS = ("name", "script", "scheduler", "nnodes", "nproc_per_node", "output_dir")
OPTIONAL_KEYS = (
    "grid",
    "zip",
    "seeds",
    "search",
    "trials",
    "search_seed",
    "space",
    "scheduler_args",
    "flags",
    "component_args",
    "checkpoints",
)
SEARCHES = ("grid", "random")
DISTRIBUTIONS = ("choice", "uniform", "log_uniform", "int")
# Drawn real values keep this many significant digits: the run's name then shows the
# value it trains with.
_DRAWN_DIGITS = 4
# Value names go into directory names.
_VALUE_NAME = re.compile(r"[A-Za-z0-9._+-]+")
# Sweep-level knob, not a training flag: scales the data's cardinalities.
SCALE_KEY = "num_embeddings_scale"
# Training flags the sweep sets for every run itself.
RESERVED_FLAGS = ("log_path", "checkpoint_dir")
# Grid values longer than this are named by their position in the run names.
_MAX_NAME_VALUE = 24

Scalar = (str, int, float, bool, type(None))


class SweepError(BadInput):
    """A sweep file is unusable; the message names the file and the key."""


@dataclass
class RunSpec:
    """One configuration of a sweep.

    Args:
        index: its position in the sweep (0-based).
        name: directory name, from its varied values or their names
            (``max_table_rows=100,embedding_dim=16``, ``trial=3,learning_rate=0.0123,seed=1``).
        grid_values: {key: value} of the keys the sweep varies (the run's own flags,
            ``seed`` included).
        flags: every training flag of the run (shared flags, then varied values), and
            possibly ``num_embeddings_scale``, still to be resolved.
        config: with ``seeds``, the name of the configuration it repeats (its name
            without the seed); None otherwise.
    """

    index: int
    name: str
    grid_values: dict[str, Any]
    flags: dict[str, Any]
    config: str | None = None


@dataclass
class SweepSpec:
    """A parsed sweep file (see the module docstring for the keys).

    Args:
        path: the file it was read from (for messages).
        output_dir: absolute; the runs' directories and the results go there.
    """

    path: str
    name: str
    script: str
    scheduler: str
    nnodes: int
    nproc_per_node: int
    output_dir: str
    grid: dict[str, list[Any]] = field(default_factory=dict)
    zip: dict[str, list[Any]] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=list)
    search: str = "grid"
    trials: int = 0
    search_seed: int = 0
    space: dict[str, dict[str, Any]] = field(default_factory=dict)
    scheduler_args: dict[str, Any] = field(default_factory=dict)
    flags: dict[str, Any] = field(default_factory=dict)
    component_args: dict[str, Any] = field(default_factory=dict)
    checkpoints: bool = False

    @property
    def ranks(self) -> int:
        return self.nnodes * self.nproc_per_node

    def error(self, key: str, message: str) -> SweepError:
        return SweepError(f"{self.path}: {key}: {message}")

    def varied_sections(self) -> dict[str, str]:
        """{flag: the section that varies it (``grid``, ``zip``, ``space``, ``seeds``)}."""
        sections = {key: section for section in ("grid", "zip", "space") for key in getattr(self, section)}
        if self.seeds:
            sections["seed"] = "seeds"
        return sections

    def runs(self) -> list[RunSpec]:
        """Every run: each configuration (the grid's product in file order, crossed with
        the zipped rows; or the random trials), once per seed when seeds are given."""
        configs = self._random_trials() if self.search == "random" else self._grid_configs()
        runs: list[RunSpec] = []
        for parts, values in configs:
            config = _dir_name(parts)
            seeds: list[int | None] = [*self.seeds] or [None]
            for seed in seeds:
                grid_values, run_parts = dict(values), list(parts)
                if seed is not None:
                    grid_values["seed"] = seed
                    run_parts.append(f"seed={seed}")
                runs.append(
                    RunSpec(
                        len(runs),
                        _dir_name(run_parts),
                        grid_values,
                        {**self.flags, **grid_values},
                        config if self.seeds else None,
                    )
                )
        return runs

    def _grid_configs(self) -> list[tuple[list[str], dict[str, Any]]]:
        axes = [[[(key, i, entry)] for i, entry in enumerate(entries)] for key, entries in self.grid.items()]
        if self.zip:
            length = len(next(iter(self.zip.values())))
            axes.append([[(key, i, entries[i]) for key, entries in self.zip.items()] for i in range(length)])
        configs = []
        for combination in itertools.product(*axes):
            chosen = [item for group in combination for item in group]
            parts = [f"{key}={_entry_text(self._section_of(key)[key], i, entry)}" for key, i, entry in chosen]
            configs.append((parts, {key: entry_value(entry) for key, _, entry in chosen}))
        return configs

    def _section_of(self, key: str) -> dict[str, list[Any]]:
        return self.grid if key in self.grid else self.zip

    def _random_trials(self) -> list[tuple[list[str], dict[str, Any]]]:
        # One rng.random() per flag per trial, mapped by hand: Random.random's sequence
        # for a seed is stable across Python versions, unlike some of its helpers.
        rng = random.Random(self.search_seed)
        width = len(str(self.trials))
        trials = []
        for trial in range(1, self.trials + 1):
            parts, values = [f"trial={trial:0{width}d}"], {}
            for key, distribution in self.space.items():
                ((kind, argument),) = distribution.items()
                u = rng.random()
                if kind == "choice":
                    i = min(int(u * len(argument)), len(argument) - 1)
                    parts.append(f"{key}={_entry_text(argument, i, argument[i])}")
                    values[key] = entry_value(argument[i])
                    continue
                low, high = argument
                if kind == "int":
                    value: Any = low + min(int(u * (high - low + 1)), high - low)
                elif kind == "uniform":
                    value = _significant(low + u * (high - low))
                else:
                    value = _significant(math.exp(math.log(low) + u * (math.log(high) - math.log(low))))
                parts.append(f"{key}={value_text(value)}")
                values[key] = value
            trials.append((parts, values))
        return trials


def _significant(value: float) -> float:
    return float(f"{value:.{_DRAWN_DIGITS}g}")


def _dir_name(parts: list[str]) -> str:
    return re.sub(r"[^A-Za-z0-9._=,+-]", "_", ",".join(parts))


def is_named(entry: Any) -> bool:
    """Whether a listed value is a named one, ``{name: ..., value: ...}``."""
    return isinstance(entry, dict)


def entry_value(entry: Any) -> Any:
    """The flag value of a listed value, named or not."""
    return entry["value"] if is_named(entry) else entry


def _entry_text(entries: list[Any], index: int, entry: Any) -> str:
    """How a run name shows a listed value: its name, its text, or its position when
    that text is too long."""
    if is_named(entry):
        name: str = entry["name"]
        return name
    text = value_text(entry)
    return f"v{index + 1}" if len(text) > _MAX_NAME_VALUE else text


def value_text(value: Any) -> str:
    """A flag value as run names and result tables show it (null: ``none``)."""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _check_flag_value(spec: SweepSpec, key: str, value: Any) -> None:
    ok = isinstance(value, Scalar) or (isinstance(value, list) and all(isinstance(v, (int, float)) for v in value))
    if not ok:
        raise spec.error(key, f"expected a number, string, boolean, null or list of numbers, got {value!r}")


def _check_flag_names(spec: SweepSpec, section: str, names: list[str]) -> None:
    for name in names:
        if not isinstance(name, str) or not name:
            raise spec.error(f"{section}.{name}", "flag names are strings")
        if name.startswith("-"):
            raise spec.error(f"{section}.{name}", f"write flags without dashes ({name.lstrip('-')})")
        if name in RESERVED_FLAGS:
            raise spec.error(f"{section}.{name}", "set by the sweep for every run (in its run directory)")


def _positive_int(path: str, document: dict[str, Any], key: str) -> int:
    value = document[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SweepError(f"{path}: {key}: expected a positive integer, got {value!r}")
    return value


def _mapping(path: str, document: dict[str, Any], key: str) -> dict[str, Any]:
    value = document.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SweepError(f"{path}: {key}: expected a mapping, got {type(value).__name__}")
    return value


def parse_sweep(document: Any, path: str, base_dir: str | None = None) -> SweepSpec:
    """Checks a loaded YAML document; ``output_dir`` is taken relative to ``base_dir``
    (default: the current directory, where the sweep is launched from).

    Raises:
        SweepError: one line naming the file and the key.
    """
    if not isinstance(document, dict):
        raise SweepError(f"{path}: expected a mapping of sweep keys at the top, got {type(document).__name__}")
    for key in document:
        if key not in REQUIRED_KEYS + OPTIONAL_KEYS:
            raise SweepError(f"{path}: {key}: unknown key (known: {', '.join(REQUIRED_KEYS + OPTIONAL_KEYS)})")
    for key in REQUIRED_KEYS:
        if key not in document:
            raise SweepError(f"{path}: {key}: missing")
    name = document["name"]
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name):
        raise SweepError(f"{path}: name: expected letters, digits, '_' or '-', got {name!r}")
    if document["script"] not in SCRIPTS:
        raise SweepError(f"{path}: script: expected one of {', '.join(SCRIPTS)}, got {document['script']!r}")
    if document["scheduler"] not in SCHEDULERS:
        raise SweepError(
            f"{path}: scheduler: unknown scheduler {document['scheduler']!r} (use one of {', '.join(SCHEDULERS)})"
        )
    output_dir = document["output_dir"]
    if not isinstance(output_dir, str) or not output_dir:
        raise SweepError(f"{path}: output_dir: expected a directory path, got {output_dir!r}")
    checkpoints = document.get("checkpoints", False)
    if not isinstance(checkpoints, bool):
        raise SweepError(f"{path}: checkpoints: expected true or false, got {checkpoints!r}")
    search = document.get("search", "grid")
    if search not in SEARCHES:
        raise SweepError(f"{path}: search: expected one of {', '.join(SEARCHES)}, got {search!r}")
    spec = SweepSpec(
        path=path,
        name=name,
        script=document["script"],
        scheduler=document["scheduler"],
        nnodes=_positive_int(path, document, "nnodes"),
        nproc_per_node=_positive_int(path, document, "nproc_per_node"),
        output_dir=os.path.abspath(os.path.join(base_dir or os.getcwd(), output_dir)),
        grid=_mapping(path, document, "grid"),
        zip=_mapping(path, document, "zip"),
        search=search,
        space=_mapping(path, document, "space"),
        scheduler_args=_mapping(path, document, "scheduler_args"),
        flags=_mapping(path, document, "flags"),
        component_args=_mapping(path, document, "component_args"),
        checkpoints=checkpoints,
    )
    if search == "random":
        _check_random_search(spec, document)
    else:
        for key in ("trials", "search_seed", "space"):
            if key in document:
                raise spec.error(key, "only with search: random")
        if not spec.grid and not spec.zip:
            raise spec.error(
                "grid", "empty: give at least one training flag with a list of values (or zip, or search: random)"
            )
    if "seeds" in document:
        spec.seeds = _seeds(spec, document["seeds"])
    _check_flag_names(spec, "flags", list(spec.flags))
    for key, value in spec.flags.items():
        _check_flag_value(spec, f"flags.{key}", value)
    for section in ("grid", "zip"):
        for key, entries in getattr(spec, section).items():
            _check_entries(spec, f"{section}.{key}", entries)
    lengths = {key: len(entries) for key, entries in spec.zip.items()}
    if len(set(lengths.values())) > 1:
        raise spec.error(
            "zip",
            "its lists vary together and need one length, got "
            + ", ".join(f"{key}: {n}" for key, n in lengths.items()),
        )
    seen: dict[str, str] = {}
    for key, section in spec.varied_sections().items():
        _check_flag_names(spec, section, [key])
        if key in spec.flags:
            raise spec.error(f"{section}.{key}", "also given in flags: give it in one place")
    for section in ("grid", "zip", "space"):
        for key in getattr(spec, section):
            if key in seen:
                raise spec.error(f"{section}.{key}", f"also varied by {seen[key]}: give it in one place")
            seen[key] = section
    if spec.seeds and "seed" in seen:
        raise spec.error(f"{seen['seed']}.seed", "also given by seeds: give it in one place")
    for key, value in spec.scheduler_args.items():
        if not isinstance(value, Scalar) or value is None:
            raise spec.error(f"scheduler_args.{key}", f"expected a number, string or boolean, got {value!r}")
    return spec


def _check_entries(spec: SweepSpec, where: str, entries: Any) -> None:
    """A non-empty list of distinct values, each plain or named."""
    if not isinstance(entries, list) or not entries:
        raise spec.error(where, f"expected a non-empty list of values, got {entries!r}")
    for entry in entries:
        if is_named(entry):
            if set(entry) != {"name", "value"}:
                raise spec.error(where, f"a named value is {{name: ..., value: ...}}, got {entry!r}")
            if not isinstance(entry["name"], str) or not _VALUE_NAME.fullmatch(entry["name"]):
                raise spec.error(
                    where, f"a value's name is letters, digits, '.', '_', '+' or '-', got {entry['name']!r}"
                )
        _check_flag_value(spec, where, entry_value(entry))
    names = [entry["name"] for entry in entries if is_named(entry)]
    if len(set(names)) != len(names):
        raise spec.error(where, "a name is given twice")
    texts = [value_text(entry_value(entry)) for entry in entries]
    if len(set(texts)) != len(texts):
        raise spec.error(where, "a value is listed twice")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_random_search(spec: SweepSpec, document: dict[str, Any]) -> None:
    for key in ("grid", "zip"):
        if key in document:
            raise spec.error(key, "not with search: random (give every varied flag a distribution in space)")
    if "trials" not in document:
        raise spec.error("trials", "missing: how many configurations search: random draws")
    spec.trials = _positive_int(spec.path, document, "trials")
    search_seed = document.get("search_seed", 0)
    if not isinstance(search_seed, int) or isinstance(search_seed, bool) or search_seed < 0:
        raise spec.error("search_seed", f"expected a non-negative integer, got {search_seed!r}")
    spec.search_seed = search_seed
    if not spec.space:
        raise spec.error("space", "empty: give at least one training flag with a distribution")
    for key, distribution in spec.space.items():
        where = f"space.{key}"
        if not (
            isinstance(distribution, dict) and len(distribution) == 1 and next(iter(distribution)) in DISTRIBUTIONS
        ):
            raise spec.error(
                where,
                f"expected one of {{choice: [...]}}, {{uniform: [low, high]}}, "
                f"{{log_uniform: [low, high]}}, {{int: [low, high]}}, got {distribution!r}",
            )
        ((kind, argument),) = distribution.items()
        if kind == "choice":
            _check_entries(spec, f"{where}.choice", argument)
            continue
        if not (isinstance(argument, list) and len(argument) == 2 and all(_number(v) for v in argument)):
            raise spec.error(f"{where}.{kind}", f"expected [low, high], got {argument!r}")
        low, high = argument
        if kind == "int" and not all(isinstance(v, int) for v in argument):
            raise spec.error(f"{where}.int", f"expected integer bounds, got {argument!r}")
        if low > high or (kind != "int" and low == high):
            raise spec.error(f"{where}.{kind}", f"expected low < high, got {argument!r}")
        if kind == "log_uniform" and low <= 0:
            raise spec.error(f"{where}.log_uniform", f"expected positive bounds, got {argument!r}")


def _seeds(spec: SweepSpec, seeds: Any) -> list[int]:
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
    ):
        raise spec.error("seeds", f"expected a non-empty list of non-negative integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise spec.error("seeds", "a seed is listed twice")
    return seeds


def load_sweep(path: str) -> SweepSpec:
    """Reads and checks a sweep file (``yaml.safe_load``: loading never runs code).

    Raises:
        SweepError: unreadable or malformed file (with line and column), or a bad key.
    """
    document = load_yaml(path, SweepError)
    return parse_sweep(document, path)
