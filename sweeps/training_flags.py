"""A sweep's flags, checked against the entry points' own parser, as command lines.

The training parser lives beside the trainer (``training.flags``) and importing it
imports torch: it is imported here, when a sweep is checked, and nowhere else in
``sweeps`` but the planner's memory estimate.

Example::

    commands = run_commands(load_sweep("sweep.yaml"))   # {run name: ["--batch_size", "512", ...]}
"""

import argparse
from typing import Any, NoReturn

from common.errors import BadInput
from common.url_paths import check_url_path
from sweeps.spec import SCALE_KEY, RunSpec, SweepSpec


def training_parser(script: str) -> argparse.ArgumentParser:
    """The parser of ``script`` (``dlrm_main.py`` or ``dcnv2_main.py``) with its defaults."""
    from training.flags import entry_point_parser

    return entry_point_parser(script)


def _store_true_flags(parser: argparse.ArgumentParser) -> dict[str, bool]:
    """{flag name without dashes: whether it is an on/off switch} of every training flag
    (not --help and --version, which print and exit)."""
    flags = {}
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        for option in action.option_strings:
            if option.startswith("--"):
                flags[option[2:]] = isinstance(action, argparse._StoreTrueAction)
    return flags


def flags_to_argv(flags: dict[str, Any], switches: dict[str, bool]) -> list[str]:
    """Training flags as a command line: true switches as ``--name``, false ones and
    nulls left out (the flag's default), lists comma-joined.

    Example::

        flags_to_argv({"batch_size": 512, "mmap_mode": True, "max_table_rows": None},
                      {"batch_size": False, "mmap_mode": True, "max_table_rows": False})
        # ["--batch_size", "512", "--mmap_mode"]
    """
    argv: list[str] = []
    for name, value in flags.items():
        if switches[name]:
            if value:
                argv.append(f"--{name}")
        elif value is not None:
            text = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
            argv += [f"--{name}", text]
    return argv


class _Refusal(Exception):
    pass


def _raise(message: str) -> NoReturn:
    raise _Refusal(message)


def _scaled_sizes(
    spec: SweepSpec, run: RunSpec, parser: argparse.ArgumentParser, switches: dict[str, bool]
) -> list[int]:
    """The data's own table sizes (what the run would use without sizes, scale or
    cap), each times the run's scale factor."""
    from training.flags import FlagError, config_from_args

    where = f"{spec.varied_sections().get(SCALE_KEY, 'flags')}.{SCALE_KEY}"
    scale = run.flags[SCALE_KEY]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise spec.error(where, f"expected a positive number, got {scale!r}")
    sized = [k for k in ("num_embeddings_per_feature", "num_embeddings") if run.flags.get(k) is not None]
    if sized:
        raise spec.error(where, f"scales the data's cardinalities: do not also give {sized[0]}")
    base = {k: v for k, v in run.flags.items() if k not in (SCALE_KEY, "max_table_rows")}
    try:
        config = config_from_args(parser.parse_args(flags_to_argv(base, switches)))
    except (FlagError, _Refusal) as e:
        raise spec.error(where, f"cannot read the data's cardinalities: {e}") from None
    return [max(1, round(rows * scale)) for rows in config.model.num_embeddings_per_feature]


def run_commands(spec: SweepSpec) -> dict[str, list[str]]:
    """{run name: training flags as argv} for every run, each checked by the training
    parser: names, values, and on ``local_cwd`` (where the data is on this machine) the
    whole configuration, as the entry point would check it.

    Raises:
        SweepError: one line naming the file and the key (or the run).
    """
    from training.flags import FlagError, config_from_args

    parser = training_parser(spec.script)
    parser.error = _raise  # type: ignore[method-assign]  # refuse, do not exit
    switches = _store_true_flags(parser)
    varied = spec.varied_sections()
    for name, section in [*((name, "flags") for name in spec.flags), *varied.items()]:
        if name != SCALE_KEY and name not in switches:
            raise spec.error(f"{section}.{name}", f"unknown training flag (python {spec.script} --help lists them)")
    commands = {}
    for run in spec.runs():
        flags = dict(run.flags)
        if SCALE_KEY in flags:
            flags["num_embeddings_per_feature"] = _scaled_sizes(spec, run, parser, switches)
            del flags[SCALE_KEY]
        for name, value in flags.items():
            if switches[name] and not isinstance(value, bool):
                section = varied.get(name, "flags")
                raise spec.error(f"{section}.{name}", f"an on/off flag: expected true or false, got {value!r}")
            if isinstance(value, str):  # run.json keeps the command line: no credentials in it, on any scheduler
                try:
                    check_url_path(value, f"--{name}")
                except BadInput as e:
                    raise spec.error(f"{varied.get(name, 'flags')}.{name}", str(e)) from None
        argv = flags_to_argv(flags, switches)
        try:
            args = parser.parse_args(argv)
            if spec.scheduler == "local_cwd":
                config_from_args(args)
        except (FlagError, _Refusal) as e:
            raise spec.error(f"run {run.name}", str(e)) from None
        commands[run.name] = argv
    return commands
