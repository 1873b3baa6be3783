"""The correctness matrix's all-pairs set (harness/matrix/ says what each case
checks) covers what it must. Its cases train in `make test-matrix MATRIX_STRENGTH=2`,
which .ci/run runs on every stack after the suite (out of make test's 15 minutes);
`make test-matrix` runs every triple."""

import itertools

import pytest

from harness import matrix
from harness.matrix import MIXED_PLAN
from models.config import SEQUENCE_INTERACTION_TYPES
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


def test_the_default_optimizers_resume_on_two_ranks_in_a_case():
    """The public example's optimizers (fused SGD, dense SGD: no state) resumed on 2 ranks
    equal the uninterrupted run in check (b) of a trained case: DCP once failed on their
    empty optimizer state ("Missing key ... optim"). This case is that check; it left
    tests/checkpoints/test_checkpoints.py (three 2-rank launches, 40 CPU s of make test) for the matrix."""
    assert any(
        case["optimizer"] == "sgd" and case["dense_optimizer"] == "sgd" and case["world_size"] == 2 for case in CASES
    )


def test_every_history_choice_trains_with_its_item_table_split_over_two_ranks():
    """Each sequence interaction trains in a 2-rank case whose item table's
    EmbeddingCollection is split over the ranks (row- or column-wise; MIXED's row split)."""
    split = ("row_wise", "column_wise", matrix.MIXED)
    for sequence in SEQUENCE_INTERACTION_TYPES:
        assert any(c["sequence"] == sequence and c["world_size"] == 2 and c["sharding"] in split for c in CASES)
    assert MIXED_PLAN.split(",")[int(matrix.SEQUENCE_ITEM.removeprefix("cat_"))] == f"t_{matrix.SEQUENCE_ITEM}=row_wise"


def test_the_refused_histories_are_refused_by_the_flags_in_one_line(synthetic_dir, capsys):
    """A history on data without list columns, or its item table in a sharding an
    EmbeddingCollection does not take, stops at the flags: before any process group.
    (Validation inside the epoch on 2 ranks is refused once the ranks are known: the
    matrix's run checks that one.)"""
    refused = [
        c for c in REFUSALS if matrix.has_sequence(c) and not c["validation_within_epoch"] and not matrix.is_zch(c)
    ]
    assert len(refused) == len(SEQUENCE_INTERACTION_TYPES) * 4
    for case in refused:
        with pytest.raises(SystemExit) as e:
            parse_config(matrix.case_argv(case, synthetic_dir, "cpu"), "dlrm_main.py", "")
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and SPEC.refusal_for(case).message in err[0], (case, err)


def test_zch_cases_resume_across_an_admission_and_compare_at_their_own_world_size():
    """A zch case trains on 1 and on 2 ranks; each is compared with its own world size
    (across world sizes ids get other rows by design, docs/zch.md) on the sparse_dist
    pipeline, and resumes from a checkpoint at a multiple of the eviction interval."""
    zch = [c for c in CASES if matrix.is_zch(c)]
    assert {c["world_size"] for c in zch} == {1, 2}
    for case in zch:
        reference = SPEC.reference_of(case)
        assert SPEC.refusal_for(reference) is None and case["sharding"] == "row_wise"
        assert reference == {
            **case,
            "pipeline": "sparse_dist",
            "validation_within_epoch": reference["validation_within_epoch"],
        }
    assert matrix.STOP % matrix.ZCH_EVICTION_INTERVAL == 0 and matrix.STEPS > matrix.ZCH_EVICTION_INTERVAL


# Validation inside the epoch on 2 ranks is refused once the ranks are known: the matrix's run checks it.
ZCH_REFUSALS = [c for c in REFUSALS if matrix.is_zch(c) and not c["validation_within_epoch"]]


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=matrix.case_name(c)) for c in ZCH_REFUSALS],
)
def test_the_refused_zch_choices_are_refused_by_the_flags_in_one_line(case, synthetic_dir, capsys):
    """zch with another sharding type than row_wise, a history, or (on CPU) row-wise
    Adagrad stops at the flags in one line: before any process group."""
    with pytest.raises(SystemExit) as e:
        parse_config(matrix.case_argv(case, synthetic_dir, "cpu"), "dlrm_main.py", "")
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and SPEC.refusal_for(case).message in err[0], (case, err)
