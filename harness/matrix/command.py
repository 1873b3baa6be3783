"""``python -m harness.matrix``: runs the CPU matrix's cases and prints the table."""

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from common.cli import DefaultsHelpFormatter, OneLineParser, cli_main
from common.config_flags import Overrides, add_flags, config_values, flag
from common.errors import BadInput
from harness.matrix.argv import case_argv
from harness.matrix.cases import CPU_MATRIX, Case, MatrixSpec, case_name, covering_cases, matches_only, refusal_cases
from harness.matrix.checks import CaseResult, check_case, check_refusal, export_pool, format_table, start_exports
from harness.matrix.ranks import JobPlan, Launcher, local_launcher

# The first line of the package's docstring, the description of --help.
DESCRIPTION = "The correctness matrix: cases generated from the choices the training flags offer."


def evaluate(
    spec: MatrixSpec, cases: list[Case], refusals: list[Case], data_dir: str, work_dir: str, launcher: Launcher
) -> list[CaseResult]:
    """Runs every case, its reference and every refusal (one launch per world size) and checks them."""
    plan = JobPlan(data_dir, work_dir, case_argv)
    refusal_keys = [plan.add("refusal", c, spec.device) for c in refusals]
    case_keys = [
        (plan.add("train", c, spec.device, resume=True), plan.add("train", spec.reference_of(c), spec.device))
        for c in cases
    ]
    plan.launch(launcher, spec.device)
    outcomes = plan.outcomes
    with export_pool() as pool:
        exports = start_exports(pool, outcomes, [key for key, _ in case_keys], work_dir)
        results = [check_refusal(spec, case, outcomes[key]) for case, key in zip(refusals, refusal_keys)]
        for case, (key, ref_key) in zip(cases, case_keys):
            results.append(check_case(spec, case, outcomes[key], outcomes[ref_key], exports.get(key)))
    return results


def selected_cases(
    spec: MatrixSpec, strength: int, only: str, refusals_of=refusal_cases, where: str = ""
) -> tuple[list[Case], list[Case]]:
    """The cases of strength ``strength`` and the refusal cases (``refusals_of(spec)``)
    that ``only`` selects (`matches_only`); BadInput, naming ``where`` the matrix runs,
    when it selects none."""
    cases = [c for c in covering_cases(spec, strength) if matches_only(case_name(c), only)]
    refusals = [c for c in refusals_of(spec) if matches_only(case_name(c), only)]
    if not cases and not refusals:
        raise BadInput(f"--only {only}: no case of strength {strength}{where} matches (--list shows them)")
    return cases, refusals


@contextlib.contextmanager
def small_data(prefix: str) -> Iterator[tuple[str, str]]:
    """(work directory, data directory) of one run: a temporary directory holding
    freshly generated small synthetic Criteo data (`harness.small_data.SMALL_SPEC`)."""
    from data.synthetic_criteo import generate_synthetic_criteo
    from harness.small_data import SMALL_SPEC

    with tempfile.TemporaryDirectory(prefix=prefix) as work:
        data_dir = os.path.join(work, "data")
        generate_synthetic_criteo(SMALL_SPEC, data_dir, show_progress=False)
        yield work, data_dir


def run(spec: MatrixSpec, strength: int, only: str = "", list_only: bool = False) -> int:
    """Generates the cases of ``spec``, runs them on local ranks (one launch per world
    size) over freshly generated data, prints the table; 0 when every case passed."""
    cases, refusals = selected_cases(spec, strength, only)
    if list_only:
        print("\n".join(case_name(c) for c in cases + refusals))
        print(f"{len(cases)} cases, {len(refusals)} refusals")
        return 0
    start = time.perf_counter()
    with small_data("matrix-") as (work, data_dir):
        results = evaluate(spec, cases, refusals, data_dir, work, local_launcher)
    print(format_table(spec, results))
    print(
        f"{spec.device} matrix of strength {strength}: {len(cases)} cases and {len(refusals)} refusals "
        f"in {time.perf_counter() - start:.0f} s"
    )
    return 0 if all(r.passed for r in results) else 1


@dataclass
class MatrixFlags:
    """The flags of a matrix CLI: this one's and bench/gpu_check.py's (whose --strength
    defaults to 2)."""

    strength: int = flag(3, help="cover every pair (2) or triple (3) of choices")
    only: str = flag(
        "",
        help="run only the cases whose name contains this text, or matches it as a glob where "
        "it has a *; several, comma-separated (default: all)",
    )
    list_only: bool = flag(False, name="list", help="print the cases without running them")


def matrix_parser(prog: str, description: str, strength: int) -> OneLineParser:
    """A parser of `MatrixFlags`, --strength defaulting to ``strength``; it gives every
    flag its default, so ``MatrixFlags(**config_values(MatrixFlags, args))`` reads them.

    Example::

        args = matrix_parser("python -m harness.matrix", "The matrix.", 3).parse_args(["--list"])
    """
    parser = OneLineParser(prog=prog, description=description, formatter_class=DefaultsHelpFormatter)
    add_flags(parser, MatrixFlags, [Overrides(MatrixFlags, strength=strength)], parser_defaults=True)
    return parser


@cli_main("python -m harness.matrix")
def main(argv: Sequence[str] | None = None) -> int:
    args = matrix_parser("python -m harness.matrix", DESCRIPTION, strength=3).parse_args(argv)
    flags = MatrixFlags(**config_values(MatrixFlags, args))
    return run(CPU_MATRIX, flags.strength, flags.only, flags.list_only)
