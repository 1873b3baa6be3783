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

A grid value may be named, so run names, results and charts show the name instead of
the value (long values are otherwise named by their position, ``v1``, ``v2``)::

    grid:
      num_embeddings_per_feature:
        - {name: small, value: [100, 100, 100]}
        - {name: large, value: [10000, 10000, 10000]}

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
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from common.errors import BadInput
from common.yaml_file import load_yaml

SCRIPTS = ("dlrm_main.py", "dcnv2_main.py")
SCHEDULERS = ("local_cwd", "slurm", "kubernetes")
REQUIRED_KEYS = ("name", "script", "scheduler", "nnodes", "nproc_per_node", "output_dir", "grid")
OPTIONAL_KEYS = ("scheduler_args", "flags", "component_args", "checkpoints")
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
        index: its position in the grid's product (0-based).
        name: directory name, from its grid values (``max_table_rows=100,embedding_dim=16``).
        grid_values: {key: value} of the grid keys (the run's own flags).
        flags: every training flag of the run (shared flags, then grid values), and
            possibly ``num_embeddings_scale``, still to be resolved.
    """

    index: int
    name: str
    grid_values: Dict[str, Any]
    flags: Dict[str, Any]


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
    grid: Dict[str, List[Any]]
    scheduler_args: Dict[str, Any] = field(default_factory=dict)
    flags: Dict[str, Any] = field(default_factory=dict)
    component_args: Dict[str, Any] = field(default_factory=dict)
    checkpoints: bool = False
    # {grid key: [the name the file gives each value, or None]}
    grid_names: Dict[str, List[Optional[str]]] = field(default_factory=dict)

    @property
    def ranks(self) -> int:
        return self.nnodes * self.nproc_per_node

    def error(self, key: str, message: str) -> SweepError:
        return SweepError(f"{self.path}: {key}: {message}")

    def runs(self) -> List[RunSpec]:
        """Every configuration: the product of the grid's lists, in file order."""
        keys = list(self.grid)
        runs = []
        for index, values in enumerate(itertools.product(*(self.grid[k] for k in keys))):
            grid_values = dict(zip(keys, values))
            parts = []
            for key, value in grid_values.items():
                position = self.grid[key].index(value)
                text = self.grid_names.get(key, [None] * (position + 1))[position] or value_text(value)
                if len(text) > _MAX_NAME_VALUE:
                    text = f"v{position + 1}"
                parts.append(f"{key}={text}")
            name = re.sub(r"[^A-Za-z0-9._=,+-]", "_", ",".join(parts))
            runs.append(RunSpec(index, name, grid_values, {**self.flags, **grid_values}))
        return runs


def value_text(value: Any) -> str:
    """A flag value as run names and result tables show it (null: ``none``)."""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _check_flag_value(spec: SweepSpec, key: str, value: Any) -> None:
    ok = isinstance(value, Scalar) or (isinstance(value, list) and all(isinstance(v, (int, float)) for v in value))
    if not ok:
        raise spec.error(key, f"expected a number, string, boolean, null or list of numbers, got {value!r}")


def _split_named_values(path: str, key: str, values: Any) -> Tuple[Any, List[Optional[str]]]:
    """A grid list whose entries may be ``{name: ..., value: ...}``: (the values, their
    names or None)."""
    if not isinstance(values, list):
        return values, []
    plain, names = [], []
    for entry in values:
        if isinstance(entry, dict):
            if set(entry) != {"name", "value"}:
                raise SweepError(f"{path}: grid.{key}: a named value is {{name: ..., value: ...}}, got {entry!r}")
            name = entry["name"]
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._+-]+", name):
                raise SweepError(f"{path}: grid.{key}: a value's name is letters, digits, '.', '_', '+' or '-', "
                                 f"got {name!r}")
            plain.append(entry["value"])
            names.append(name)
        else:
            plain.append(entry)
            names.append(None)
    given = [n for n in names if n is not None]
    if len(set(given)) != len(given):
        raise SweepError(f"{path}: grid.{key}: a name is given twice")
    return plain, names


def _check_flag_names(spec: SweepSpec, section: str, names: List[str]) -> None:
    for name in names:
        if not isinstance(name, str) or not name:
            raise spec.error(f"{section}.{name}", "flag names are strings")
        if name.startswith("-"):
            raise spec.error(f"{section}.{name}", f"write flags without dashes ({name.lstrip('-')})")
        if name in RESERVED_FLAGS:
            raise spec.error(f"{section}.{name}", "set by the sweep for every run (in its run directory)")


def _positive_int(path: str, document: Dict[str, Any], key: str) -> int:
    value = document[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SweepError(f"{path}: {key}: expected a positive integer, got {value!r}")
    return value


def _mapping(path: str, document: Dict[str, Any], key: str) -> Dict[str, Any]:
    value = document.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SweepError(f"{path}: {key}: expected a mapping, got {type(value).__name__}")
    return value


def parse_sweep(document: Any, path: str, base_dir: Optional[str] = None) -> SweepSpec:
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
        raise SweepError(f"{path}: scheduler: unknown scheduler {document['scheduler']!r} "
                         f"(use one of {', '.join(SCHEDULERS)})")
    output_dir = document["output_dir"]
    if not isinstance(output_dir, str) or not output_dir:
        raise SweepError(f"{path}: output_dir: expected a directory path, got {output_dir!r}")
    checkpoints = document.get("checkpoints", False)
    if not isinstance(checkpoints, bool):
        raise SweepError(f"{path}: checkpoints: expected true or false, got {checkpoints!r}")
    grid = document["grid"]
    if not isinstance(grid, dict) or not grid:
        raise SweepError(f"{path}: grid: empty: give at least one training flag with a list of values")
    grid, grid_names = dict(grid), {}
    for key in list(grid):
        grid[key], grid_names[key] = _split_named_values(path, key, grid[key])
    spec = SweepSpec(
        path=path,
        name=name,
        script=document["script"],
        scheduler=document["scheduler"],
        nnodes=_positive_int(path, document, "nnodes"),
        nproc_per_node=_positive_int(path, document, "nproc_per_node"),
        output_dir=os.path.abspath(os.path.join(base_dir or os.getcwd(), output_dir)),
        grid=grid,
        scheduler_args=_mapping(path, document, "scheduler_args"),
        flags=_mapping(path, document, "flags"),
        component_args=_mapping(path, document, "component_args"),
        checkpoints=checkpoints,
        grid_names=grid_names,
    )
    _check_flag_names(spec, "flags", list(spec.flags))
    _check_flag_names(spec, "grid", list(spec.grid))
    for key, value in spec.flags.items():
        _check_flag_value(spec, f"flags.{key}", value)
    for key, values in spec.grid.items():
        if not isinstance(values, list) or not values:
            raise spec.error(f"grid.{key}", f"expected a non-empty list of values, got {values!r}")
        for value in values:
            _check_flag_value(spec, f"grid.{key}", value)
        if len({value_text(v) for v in values}) != len(values):
            raise spec.error(f"grid.{key}", "a value is listed twice")
        if key in spec.flags:
            raise spec.error(f"grid.{key}", "also given in flags: give it in one place")
    for key, value in spec.scheduler_args.items():
        if not isinstance(value, Scalar) or value is None:
            raise spec.error(f"scheduler_args.{key}", f"expected a number, string or boolean, got {value!r}")
    return spec


def load_sweep(path: str) -> SweepSpec:
    """Reads and checks a sweep file (``yaml.safe_load``: loading never runs code).

    Raises:
        SweepError: unreadable or malformed file (with line and column), or a bad key.
    """
    document = load_yaml(path, SweepError)
    return parse_sweep(document, path)
