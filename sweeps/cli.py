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

import argparse
from typing import Optional
from collections.abc import Sequence

from common.cli import OneLineParser, positive_int, run_cli
from sweeps.results import write_results
from sweeps.run_state import TERMINAL, RunRecord, read_runs
from sweeps.spec import SweepSpec, load_sweep

PROG = "python -m sweeps"
EXIT_FAILED_RUN = 1


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="launch every configuration of a sweep file, then report")
    run.add_argument("sweep", help="the sweep's YAML file")
    run.add_argument("--max_parallel", type=positive_int, default=None,
                     help="jobs in flight at once (default 1 on local_cwd, every job elsewhere)")
    run.add_argument("--dryrun", action="store_true",
                     help="print every job's command and scheduler request; launch nothing")
    report = commands.add_parser("report", help="write results.md/.csv/.png from the runs' logs")
    report.add_argument("output_dir", help="the sweep's output_dir")
    status = commands.add_parser("status", help="which runs are pending, running, finished or failed")
    status.add_argument("output_dir", help="the sweep's output_dir")
    for sub in (run, report, status):
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


def _run(args: argparse.Namespace) -> int:
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


def _report(args: argparse.Namespace) -> int:

    records = read_runs(args.output_dir)
    print(write_results(args.output_dir, records))
    print(f"wrote {args.output_dir}/results.md, results.csv, results.png")
    return 0


def _status(args: argparse.Namespace) -> int:
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
    counts = {s: sum(1 for r in records if live.get(r.name, r.state) == s) for s in
              ("pending", "submitted", "running", "succeeded", "failed", "cancelled")}
    print(", ".join(f"{n} {s}" for s, n in counts.items() if n))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs a subcommand; returns the exit code (bad input: one line on stderr, 2)."""
    args = build_parser().parse_args(argv)
    command = {"run": _run, "report": _report, "status": _status}[args.command]
    return run_cli(lambda: command(args), PROG)
