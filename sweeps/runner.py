"""Runs a sweep's jobs through torchx's runner: at most ``max_parallel`` at a time,
each in its own directory, finished runs skipped when the sweep is run again.

A local (``local_cwd``) job belongs to the process that started it: ``sweeps run``
waits for its jobs. Remote jobs (Slurm, Kubernetes) are followed through torchx's
status; a rerun picks up runs still in flight instead of submitting them twice. A
Slurm job held pending for a reason that never clears (``PartitionConfig``: more CPUs
than a node has) is cancelled and reported failed with that reason, where
``torchx run --wait`` would wait forever; a finished Slurm job's output files move
from the submit directory into its run directory.

Example::

    SweepRunner(load_sweep("sweep.yaml"), max_parallel=2).run()   # 0: every run succeeded
"""

import os
import sys
import time
from typing import TextIO

import torchx.specs as specs
from torchx.runner import Runner, get_runner
from torchx.specs.api import AppState, parse_app_handle

from sweeps.launch import (
    SLURM_HOPELESS_REASONS,
    build_app,
    failure_from_output,
    job_command,
    job_output,
    move_slurm_logs,
    scheduler_cfg,
    slurm_pending_reason,
)
from sweeps.run_state import (
    CANCELLED,
    FAILED,
    PENDING,
    RUNNING,
    SUBMITTED,
    SUCCEEDED,
    TERMINAL,
    RunRecord,
    RunStateError,
)
from sweeps.spec import SweepSpec

POLL_SECONDS = {"local_cwd": 1.0}
DEFAULT_POLL_SECONDS = 10.0
_STATES = {
    AppState.SUCCEEDED: SUCCEEDED,
    AppState.FAILED: FAILED,
    AppState.CANCELLED: CANCELLED,
    AppState.RUNNING: RUNNING,
}


def plan_records(spec: SweepSpec, commands: dict[str, list[str]]) -> list[RunRecord]:
    """One record per run, with its full training command (``--log_path`` in its run
    directory). A run already recorded with the same command keeps its state."""
    records = []
    for run in spec.runs():
        directory = os.path.join(spec.output_dir, run.name)
        argv = [*commands[run.name], "--log_path", os.path.join(directory, "log.jsonl")]
        record = RunRecord(
            index=run.index,
            name=run.name,
            directory=directory,
            grid_values=run.grid_values,
            argv=argv,
            scheduler=spec.scheduler,
            ranks=spec.ranks,
            ranks_per_node=spec.nproc_per_node,
            config=run.config,
        )
        try:
            previous: RunRecord | None = RunRecord.read(directory)
        except RunStateError:
            previous = None
        if previous is not None and previous.argv == argv and previous.scheduler == spec.scheduler:
            record = previous
        records.append(record)
    return records


def dryrun(spec: SweepSpec, records: list[RunRecord], out: TextIO | None = None) -> None:
    """Prints every job's command and scheduler request (to ``out``, default stdout);
    launches and writes nothing."""
    out = out or sys.stdout
    runner = get_runner()
    try:
        for record in records:
            app = build_app(spec, record)
            info = runner.dryrun(app, spec.scheduler, cfg=scheduler_cfg(runner, spec, record.directory))
            print(f"=== JOB {record.index + 1}/{len(records)}: {record.name} ===", file=out)
            print(f"command: {job_command(app)}", file=out)
            print(f"=== SCHEDULER REQUEST ===\n{info}\n", file=out, flush=True)
    finally:
        runner.close()


class SweepRunner:
    """Submits and follows the jobs of a sweep.

    Args:
        spec: the sweep.
        records: its runs (``plan_records``).
        max_parallel: jobs in flight at once (None: 1 on local_cwd, all elsewhere).
        out: where progress lines go (default stdout).
    """

    def __init__(
        self, spec: SweepSpec, records: list[RunRecord], max_parallel: int | None = None, out: TextIO | None = None
    ) -> None:
        self.spec = spec
        self.records = records
        default = 1 if spec.scheduler == "local_cwd" else len(records)
        self.max_parallel = max_parallel or default
        self.poll_seconds = POLL_SECONDS.get(spec.scheduler, DEFAULT_POLL_SECONDS)
        self.out = out or sys.stdout
        self._apps: dict[str, specs.AppDef] = {}

    def _say(self, record: RunRecord, message: str) -> None:
        print(f"[{record.index + 1}/{len(self.records)}] {record.name}: {message}", file=self.out, flush=True)

    def run(self) -> int:
        """Runs every run not finished yet; returns 0 when all succeeded, else 1."""
        for record in self.records:
            if record.state != SUCCEEDED and not self._in_flight_remotely(record):
                record.state, record.app_handle, record.exit_code, record.error = PENDING, None, None, None
            record.write()
        if self.spec.scheduler == "local_cwd":
            # Local jobs start torchrun by name: the one beside the Python running the sweep.
            os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        with get_runner() as runner:
            active = [r for r in self.records if r.state in (SUBMITTED, RUNNING)]
            waiting = [r for r in self.records if r.state == PENDING]
            for record in self.records:
                if record.state == SUCCEEDED:
                    self._say(record, "finished before: skipped")
            while waiting or active:
                while waiting and len(active) < self.max_parallel:
                    record = waiting.pop(0)
                    if self._submit(runner, record):
                        active.append(record)
                time.sleep(self.poll_seconds)
                for record in list(active):
                    self._poll(runner, record)
                    if record.state in TERMINAL:
                        active.remove(record)
        return 0 if all(r.state == SUCCEEDED for r in self.records) else 1

    def _in_flight_remotely(self, record: RunRecord) -> bool:
        # A local job died with the sweep process that started it.
        return (
            record.state in (SUBMITTED, RUNNING)
            and record.app_handle is not None
            and self.spec.scheduler != "local_cwd"
        )

    def _submit(self, runner: Runner, record: RunRecord) -> bool:
        log = record.log_path
        if os.path.exists(log):  # an earlier attempt's log: keep it, beside the new one
            os.replace(log, f"{log}.{int(os.path.getmtime(log))}")
        try:
            app = build_app(self.spec, record)
            record.app_handle = runner.run(
                app, self.spec.scheduler, cfg=scheduler_cfg(runner, self.spec, record.directory)
            )
        except Exception as e:  # the scheduler refused it (no sbatch, bad queue, ...): the others go on
            record.state, record.error = FAILED, f"not submitted: {type(e).__name__}: {e}".splitlines()[0]
            record.finished = time.time()
            record.write()
            self._say(record, record.error)
            return False
        self._apps[record.name] = app
        record.state, record.submitted = SUBMITTED, time.time()
        record.write()
        self._say(record, f"submitted {record.app_handle}")
        return True

    def _poll(self, runner: Runner, record: RunRecord) -> None:
        assert record.app_handle is not None
        status = runner.status(record.app_handle)
        if status is None:
            record.state, record.error = FAILED, "the scheduler no longer knows this job"
        elif status.state in (AppState.PENDING, AppState.SUBMITTED) and self.spec.scheduler == "slurm":
            reason = slurm_pending_reason(parse_app_handle(record.app_handle)[2])
            if reason in SLURM_HOPELESS_REASONS:
                runner.cancel(record.app_handle)
                record.state = FAILED
                record.error = (
                    f"Slurm holds the job pending with reason {reason}, which waiting never clears: "
                    "it asks for more than the partition gives (size component_args h/cpu/memMB "
                    "to the partition's nodes, see sinfo -o '%P %c %m')"
                )
        elif status.state in _STATES:
            record.state = _STATES[status.state]
        if record.state == FAILED and record.exit_code is None and record.error is None:
            app = self._apps.get(record.name) or build_app(self.spec, record)
            record.exit_code, record.error = failure_from_output(job_output(runner, record.app_handle, app))
        if record.state in TERMINAL:
            if self.spec.scheduler == "slurm":  # its output beside its log, not in the submit directory
                move_slurm_logs(parse_app_handle(record.app_handle)[2], record.directory)
            record.finished = time.time()
            seconds = record.finished - (record.submitted or record.finished)
            detail = (
                ""
                if record.state != FAILED
                else (f" (exit code {record.exit_code if record.exit_code is not None else 'unknown'}): {record.error}")
            )
            self._say(record, f"{record.state} after {seconds:.0f} s{detail}")
        record.write()
