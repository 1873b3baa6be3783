"""The correctness matrix's all-pairs subset (tests/support/matrix.py says what each case
checks); `make test-matrix` runs every triple. The table of cases is printed at the
end of the pytest run."""

import itertools

import pytest

from bench.gpu_check import gpu_matrix
from tests.support import matrix
from tests.support.launch import launch, run_script
from training.flags import parse_config

SPEC = matrix.CPU_MATRIX
CASES = matrix.covering_cases(SPEC, 2)
REFUSALS = matrix.refusal_cases(SPEC)


def test_every_pair_of_choices_is_in_a_case():
    """Every pair of choices trains in some case, unless it holds a combination that
    must be refused; each of those is a refusal case; no trained case is refused."""
    refused = [r for r in SPEC.refusals if SPEC.device in r.devices]
    assert all(SPEC.refusal_for(case) is None for case in CASES)
    assert all(any(r.matches(case, SPEC.device) for case in REFUSALS) for r in refused)
    for (d1, c1), (d2, c2) in itertools.combinations(SPEC.dimensions.items(), 2):
        for v1, v2 in itertools.product(c1, c2):
            if not SPEC.forbidden({d1: v1, d2: v2}):
                assert any(case[d1] == v1 and case[d2] == v2 for case in CASES), (d1, v1, d2, v2)


@pytest.fixture(scope="module")
def results(synthetic_dir, tmp_path_factory):
    work = str(tmp_path_factory.mktemp("matrix"))
    outcome = matrix.evaluate(SPEC, CASES, REFUSALS, synthetic_dir, work,
                              lambda fn, jobs, nproc: launch(fn, jobs, nproc=nproc))
    matrix.REPORTS.append(("correctness matrix, every pair of choices", matrix.format_table(SPEC, outcome)))
    return {matrix.case_name(r.case): r for r in outcome}


@pytest.mark.slow
@pytest.mark.parametrize("name", [matrix.case_name(c) for c in CASES + REFUSALS])
def test_case(results, name):
    result = results[name]
    assert result.passed, result.checks


@pytest.mark.slow
def test_gpu_check_says_there_is_no_gpu():
    result = run_script(["-m", "bench.gpu_check"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("gpu_check: no CUDA device on this host"), result.stdout


@pytest.mark.slow
def test_gpu_check_cases_are_valid_command_lines(synthetic_dir):
    """The GPU matrix covers every pair of its choices, and each case (and its
    reference) is a command line the flags accept; refusing happens on the GPU host,
    after planning."""
    spec = gpu_matrix(num_gpus=2)
    cases = matrix.covering_cases(spec, 2)
    for (d1, c1), (d2, c2) in itertools.combinations(spec.dimensions.items(), 2):
        for v1, v2 in itertools.product(c1, c2):
            if not spec.forbidden({d1: v1, d2: v2}):
                assert any(case[d1] == v1 and case[d2] == v2 for case in cases), (d1, v1, d2, v2)
    for case in cases + matrix.refusal_cases(spec):
        for run in (case, {**case, **spec.reference}):
            config = parse_config(matrix.case_argv(run, synthetic_dir, "cuda"), "gpu_check", "")
            assert (config.pipeline, config.amp, config.allow_tf32) == (run["pipeline"], run["amp"], run["allow_tf32"])
            assert config.sharding_constraints.compute_kernel("t_cat_0") == run["compute_kernel"]
