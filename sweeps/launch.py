"""A sweep's jobs as torchx sees them: the repository's components, scheduler configs,
and what a finished job's output says about why it failed.

Each run is this repository's ``dlrm`` / ``dcnv2`` component (``torchx_components``)
with ``-j NNODESxNPROC``, the run's flags and ``--log_path RUN_DIR/log.jsonl``: the job
``torchx run -s SCHEDULER dlrm -j ... -- FLAGS`` would start. No torch here.

Example::

    app = build_app(spec, record)
    info = get_runner().dryrun(app, spec.scheduler, scheduler_cfg(runner, spec, record))
"""

import glob
import inspect
import os
import re
import shlex
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterable

import torchx.specs as specs
from torchx.runner import Runner
from torchx.runner import config as torchx_config

from sweeps.run_state import RunRecord
from sweeps.spec import SweepSpec
from torchx_components.training import dcnv2, dlrm

# The repository root: its .torchxconfig holds the scheduler defaults torchx's CLI uses.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPONENTS: dict[str, Callable[..., specs.AppDef]] = {"dlrm_main.py": dlrm, "dcnv2_main.py": dcnv2}
# Component parameters the sweep sets itself.
SWEEP_COMPONENT_ARGS = ("j", "name", "checkpoint_dir")
# Slurm pending reasons that never clear by waiting: the request exceeds what the
# partition can ever give (more CPUs per node than a node has, more nodes or time than
# the partition allows, a feature no node has).
SLURM_HOPELESS_REASONS = ("PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints")
# What torchrun's failure summary says about each failed rank.
_EXIT_CODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
# A rank stopped by SIGTERM: killed (-15), or reporting where it was (128 + 15).
_STOPPED_CODES = (-signal.SIGTERM, 128 + signal.SIGTERM)
# torchx prefixes local replicas' lines with "[role/replica] ", torchrun ranks' with "[rank]:".
_OUTPUT_PREFIX = re.compile(r"^(\[[\w.-]+/\d+\]\s?)?(\[\d+\]:)?")
_ERROR_LINE = re.compile(r"(: error: |Error: |^[Ee]rror\b)")


def check_component_args(spec: SweepSpec) -> None:
    """Raises SweepError for a ``component_args`` key the component does not take."""
    parameters = inspect.signature(COMPONENTS[spec.script]).parameters
    for key in spec.component_args:
        if key in SWEEP_COMPONENT_ARGS:
            raise spec.error(
                f"component_args.{key}", "set by the sweep (nnodes x nproc_per_node, run names, checkpoints: true)"
            )
        if key not in parameters or parameters[key].kind is inspect.Parameter.VAR_POSITIONAL:
            known = [p for p in parameters if p not in SWEEP_COMPONENT_ARGS and p != "script_args"]
            raise spec.error(
                f"component_args.{key}", f"not a parameter of the {spec.script} component (known: {', '.join(known)})"
            )


def build_app(spec: SweepSpec, record: RunRecord) -> specs.AppDef:
    """The torchx AppDef of one run (raises ValueError for bad component args)."""
    kwargs = dict(spec.component_args)
    kwargs["j"] = f"{spec.nnodes}x{spec.nproc_per_node}"
    kwargs["name"] = f"{spec.name}-{record.index}"
    if spec.checkpoints:
        kwargs["checkpoint_dir"] = os.path.join(record.directory, "checkpoints")
    return COMPONENTS[spec.script](*record.argv, **kwargs)


def scheduler_cfg(runner: Runner, spec: SweepSpec, run_dir: str | None) -> dict[str, specs.CfgVal]:
    """The scheduler's run config: ``scheduler_args``, then the repository's
    .torchxconfig defaults (as ``torchx run -cfg`` would); local runs write their
    processes' output under ``RUN_DIR/torchx`` unless ``log_dir`` is given.

    Raises:
        SweepError: a key the scheduler does not have, or a value of the wrong type.
    """
    opts = runner.scheduler_run_opts(spec.scheduler)
    cfg: dict[str, specs.CfgVal] = {}
    for key, value in spec.scheduler_args.items():
        if opts.get(key) is None:
            raise spec.error(
                f"scheduler_args.{key}",
                f"not an option of the {spec.scheduler} scheduler (torchx runopts {spec.scheduler} lists them)",
            )
        text = str(value).lower() if isinstance(value, bool) else str(value)
        try:
            cfg.update(opts.cfg_from_str(f"{key}={text}"))
        except (ValueError, TypeError) as e:
            raise spec.error(f"scheduler_args.{key}", str(e)) from None
    if spec.scheduler == "local_cwd" and run_dir is not None and "log_dir" not in cfg:
        cfg["log_dir"] = os.path.join(run_dir, "torchx")
    torchx_config.apply(scheduler=spec.scheduler, cfg=cfg, dirs=[REPO])
    return cfg


def job_command(app: specs.AppDef) -> str:
    """The command every node of the job runs, as one shell line."""
    role = app.roles[0]
    return shlex.join([role.entrypoint, *role.args])


def failure_from_output(lines: Iterable[str]) -> tuple[int | None, str | None]:
    """(exit code, last error line) from a failed job's output.

    The exit code is from torchrun's failure summary (the entry points' codes: 2 bad
    input, 3 non-finite loss, ...): the first rank's that was not stopped by SIGTERM
    (torchrun stops the ranks left after one fails); the error line is the
    last line saying ``error`` (the entry points print ``PROG: error: MESSAGE``), else
    the last non-empty line.

    Example::

        failure_from_output(["dlrm_main.py: error: --batch_size must be positive", "  exitcode  : 2 (pid: 7)"])
        # (2, "dlrm_main.py: error: --batch_size must be positive")
    """
    codes: list[int] = []
    error, last = None, None
    for raw in lines:
        line = raw.rstrip("\r\n")
        text = _OUTPUT_PREFIX.sub("", line).strip()
        if not text:
            continue
        last = text
        match = _EXIT_CODE.match(text)
        if match:
            codes.append(int(match.group(1)))
        elif _ERROR_LINE.search(text) and "ChildFailedError" not in text:
            error = text
    exit_code = next((c for c in codes if c not in _STOPPED_CODES), codes[0] if codes else None)
    return exit_code, error or last


def job_output(runner: Runner, app_handle: str, app: specs.AppDef) -> list[str]:
    """The job's output (every node of its role, stderr and stdout as the scheduler
    keeps them); empty when the scheduler has none."""
    lines: list[str] = []
    role = app.roles[0]
    for node in range(role.num_replicas):
        try:
            lines += list(runner.log_lines(app_handle, role.name, k=node))
        except Exception:  # a scheduler without logs (or purged ones): the state still says enough
            continue
    return lines


def slurm_pending_reason(app_id: str) -> str | None:
    """Why Slurm holds job ``app_id`` pending (squeue's reason), or None when it is
    not pending or squeue is not there."""
    if shutil.which("squeue") is None:
        return None
    proc = subprocess.run(
        ["squeue", "--noheader", "--states=PENDING", "--format=%r", "--jobs", app_id],
        capture_output=True,
        text=True,
        timeout=60,
    )
    reasons = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    return reasons[0] if proc.returncode == 0 and reasons else None


def move_slurm_logs(app_id: str, directory: str, submit_dir: str = ".") -> list[str]:
    """Moves a finished Slurm job's output files (``slurm-ID.out`` of its batch script
    and ``slurm-ID-ROLE-NODE.out/.err`` of its nodes, which Slurm writes in the
    directory the job was submitted from) into ``directory``; returns their new paths."""
    patterns = (f"slurm-{app_id}.out", f"slurm-{app_id}-*.out", f"slurm-{app_id}-*.err")
    sources = sorted(path for pattern in patterns for path in glob.glob(os.path.join(submit_dir, pattern)))
    targets = [os.path.join(directory, os.path.basename(path)) for path in sources]
    for source, target in zip(sources, targets):
        os.replace(source, target)
    return targets
