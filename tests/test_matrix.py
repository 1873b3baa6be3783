"""The correctness matrix's all-pairs subset (harness/matrix.py says what each case
checks); `make test-matrix` runs every triple. The table of cases is printed at the
end of the pytest run."""

import itertools

import pytest

from harness import matrix
from harness.launch import launch

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
@pytest.mark.timeout(1800)  # the first case's limit covers the `results` fixture: every case's training
@pytest.mark.parametrize("name", [matrix.case_name(c) for c in CASES + REFUSALS])
def test_case(results, name):
    result = results[name]
    assert result.passed, result.checks
