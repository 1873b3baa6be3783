"""The correctness matrix's all-pairs set (harness/matrix/ says what each case
checks) covers what it must. Its cases train in `make test-matrix MATRIX_STRENGTH=2`,
which .ci/run runs on every stack after the suite (out of make test's 15 minutes);
`make test-matrix` runs every triple."""

import itertools

from harness import matrix

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


def test_the_default_optimizers_resume_on_two_ranks_in_a_case():
    """The public example's optimizers (fused SGD, dense SGD: no state) resumed on 2 ranks
    equal the uninterrupted run in check (b) of a trained case: DCP once failed on their
    empty optimizer state ("Missing key ... optim"). This case is that check; it left
    tests/checkpoints/test_checkpoints.py (three 2-rank launches, 40 CPU s of make test) for the matrix."""
    assert any(
        case["optimizer"] == "sgd" and case["dense_optimizer"] == "sgd" and case["world_size"] == 2 for case in CASES
    )
