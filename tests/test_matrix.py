"""The correctness matrix's all-pairs subset (tests/matrix.py says what each case
checks); `make test-matrix` runs every triple. The table of cases is printed at the
end of the pytest run."""

import itertools

import pytest

from tests import matrix
from tests.launch import launch

DEVICE = "cpu"
CASES = matrix.covering_cases(2, DEVICE)
REFUSALS = matrix.refusal_cases(DEVICE)


def test_every_pair_of_choices_is_in_a_case():
    """Every pair of choices trains in some case, or, when the pair cannot be right,
    is refused by a refusal case; no trained case is a refused combination."""
    for case in CASES:
        assert matrix.refusal_for(case, DEVICE) is None, case
    for (d1, c1), (d2, c2) in itertools.combinations(matrix.DIMENSIONS.items(), 2):
        for v1, v2 in itertools.product(c1, c2):
            pair = {d1: v1, d2: v2}
            if any(all(pair.get(d, object()) == v for d, v in r.choices) or
                   (len(r.choices) == 1 and r.choices[0] in pair.items())
                   for r in matrix.REFUSALS if DEVICE in r.devices):
                assert any(all(case[d] == v for d, v in pair.items() if d in dict(r.choices))
                           for case in REFUSALS for r in [matrix.refusal_for(case, DEVICE)]), pair
            else:
                assert any(case[d1] == v1 and case[d2] == v2 for case in CASES), pair


@pytest.fixture(scope="module")
def results(synthetic_dir, tmp_path_factory):
    work = str(tmp_path_factory.mktemp("matrix"))
    outcome = matrix.evaluate(CASES, REFUSALS, DEVICE, synthetic_dir, work,
                              lambda fn, jobs, nproc: launch(fn, jobs, nproc=nproc))
    matrix.REPORTS.append(("correctness matrix, every pair of choices", matrix.format_table(outcome)))
    return {matrix.case_name(r.case): r for r in outcome}


@pytest.mark.parametrize("name", [matrix.case_name(c) for c in CASES + REFUSALS])
def test_case(results, name):
    result = results[name]
    assert result.passed, result.checks
