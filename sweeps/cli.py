"""``python -m sweeps``: train every configuration of a sweep file and compare them.

    python -m sweeps run SWEEP.yaml [--max_parallel N] [--dryrun]
    python -m sweeps report OUTPUT_DIR
    python -m sweeps status OUTPUT_DIR

``run`` checks the whole sweep first (a bad file, flag, value or scheduler option is
one line naming the file and key, exit 2, nothing launched), then runs every
configuration not finished yet and ends with the report. Exit codes: 0 every run
succeeded; 1 a run failed; 2 bad input. Run it from the repository root (local jobs
start the entry points from the current directory, as ``torchx run`` does).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from common.cli import OneLineParser, positive_int, run_cli
from common.config_flags import add_flags, config_values, flag
from sweeps.results import write_results
from sweeps.run_state import TERMINAL, RunRecord, read_runs
from sweeps.spec import SweepSpec, load_sweep

PROG = "python -m sweeps"
EXIT_FAILED_RUN = 1


@dataclass
class RunFlags:
    """``run``: launch every configuration of a sweep file, then report."""

    sweep: str = flag(help="the sweep's YAML file", positional=True)
    max_parallel: int | None = flag(
        None, parse=positive_int, help="jobs in flight at once (default 1 on local_cwd, every job elsewhere)"
    )
    dryrun: bool = flag(False, help="print every job's command and scheduler request; launch nothing")


@dataclass
class OutputDirFlags:
    """``report`` and ``status``: the sweep's runs, found in its output directory."""

    output_dir: str = flag(help="the sweep's output_dir", positional=True)


# {subcommand: (its help, its flags)}
COMMANDS: dict[str, tuple[str, type]] = {
    "run": ("launch every configuration of a sweep file, then report", RunFlags),
    "report": ("write results.md/.csv/.png from the runs' logs", OutputDirFlags),
    "status": ("which runs are pending, running, finished or failed", OutputDirFlags),
}


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (text, flags_class) in COMMANDS.items():
        sub = commands.add_parser(name, help=text)
        add_flags(sub, flags_class)
        sub.error = parser.error  # type: ignore[method-assign]  # one line, exit 2
    return parser


def _checked_records(spec: SweepSpec) -> list[RunRecord]:
    """Every run's record, after checking everything that can be checked before launching."""
    from torchx.runner import get_runner

    from sweeps.launch import build_app, check_component_args, scheduler_cfg
    from sweeps.runner import plan_records
    from sweeps.training_flags import run_commands

    check_component_args(spec)
    records = plan_records(spec, run_commands(spec))
    with get_runner() as runner:
        scheduler_cfg(runner, spec, None)
    for record in records:
        try:
            build_app(spec, record)
        except ValueError as e:
            raise spec.error("component_args", str(e)) from None
    return records


def _run(args: RunFlags) -> int:
    from sweeps.runner import SweepRunner, dryrun

    spec = load_sweep(args.sweep)
    records = _checked_records(spec)
    if args.dryrun:
        dryrun(spec, records)
        return 0
    code = SweepRunner(spec, records, args.max_parallel).run()
    print(write_results(spec.output_dir, records, spec.name))
    print(f"wrote {spec.output_dir}/results.md, results.csv, results.png")
    return code


def _report(args: OutputDirFlags) -> int:

    records = read_runs(args.output_dir)
    print(write_results(args.output_dir, records))
    print(f"wrote {args.output_dir}/results.md, results.csv, results.png")
    return 0


def _status(args: OutputDirFlags) -> int:
    records = read_runs(args.output_dir)
    remote = [r for r in records if r.state not in TERMINAL and r.app_handle and r.scheduler != "local_cwd"]
    live = {}
    if remote:
        from torchx.runner import get_runner

        with get_runner() as runner:
            for record in remote:
                status = runner.status(record.app_handle)
                live[record.name] = "unknown to the scheduler" if status is None else status.state.name.lower()
    width = max(len(r.name) for r in records)
    for record in records:
        state = live.get(record.name, record.state)
        line = f"{record.name:<{width}}  {state:<10}"
        if record.app_handle:
            line += f"  {record.app_handle}"
        if record.state == "failed":
            code = record.exit_code if record.exit_code is not None else "unknown"
            line += f"  exit code {code}: {record.error}"
        print(line)
    counts = {
        s: sum(1 for r in records if live.get(r.name, r.state) == s)
        for s in ("pending", "submitted", "running", "succeeded", "failed", "cancelled")
    }
    print(", ".join(f"{n} {s}" for s, n in counts.items() if n))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs a subcommand; returns the exit code (bad input: one line on stderr, 2)."""
    args = build_parser().parse_args(argv)
    flags_class = COMMANDS[args.command][1]
    flags = flags_class(**config_values(flags_class, args))
    commands: dict[str, Callable[[Any], int]] = {"run": _run, "report": _report, "status": _status}
    command = commands[args.command]
    return run_cli(lambda: command(flags), PROG)
