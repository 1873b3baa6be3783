"""The correctness matrix: cases generated from the choices the training flags offer.

Every dimension below takes its choices from the constants the flags are built from,
so a new choice (an optimizer, a sharding type, a pipeline) joins the matrix by
itself. A covering-array generator picks cases so that every pair (``strength`` 2,
what ``.ci/run`` runs on every stack) or every triple (``strength`` 3, ``make
test-matrix``) of choices appears in at least one case. Each case trains a tiny model and checks:

(a) sharded == unsharded: the case's run at its world size equals one process
    with the same global batch and whole tables (``table_wise`` on one rank), to the
    tolerance `sharded_tolerance` gives and explains;
(b) resume == uninterrupted: the run is stopped at its step-`STOP` checkpoint (inside
    a single epoch; at the end of the first of two, so the resumed run validates that
    epoch and crosses into the next) and resumed in a new trainer; the losses after the stop, the
    validation and test metrics and every rank's final weights are identical, bit
    for bit;
(c) export == eager: the fp32 program `serving.export` writes from the final
    checkpoint gives the trained (sharded) model's probabilities on a probe batch;
(d) steps: the run's log shows every epoch training its batches, validation at every
    point the flags ask for and one test, in both runs of (b): the arithmetic, not
    the reference, since a fault every pipeline shares passes (a).

The `STEPS` batches are one epoch or two; with ``validation_within_epoch`` the run
validates in the middle of each epoch (the pipeline holding the next batch) and at
its end. Each case's reference takes the sparse_dist pipeline, so every pipeline is
compared with it over epoch boundaries and evaluation points.

A combination that cannot be right must be refused before training, on every rank,
with one line: `REFUSALS` lists them, and each one becomes a case of its own that
checks the refusal (exit code 2, one ``error:`` line naming the reason).

The modules, one idea each: `cases` (the dimensions, refusals and covering cases),
`argv` (a case as training flags), `ranks` (one rank's runs and the launches that
group them), `checks` (the verdicts and the table) and `command` (``python -m
harness.matrix``); every public name is here too.

Run the larger set with ``python -m harness.matrix --strength 3`` (``make test-matrix``).
"""

from harness.matrix.argv import (
    EPS,
    case_argv,
    compute_kernel_flag,
    data_flags,
    learning_rate,
    parquet_copy,
    sequence_flags,
)
from harness.matrix.cases import (
    ADAPTIVE,
    CPU_MATRIX,
    DIMENSIONS,
    EMBEDDING_DIM,
    GLOBAL_BATCH,
    HISTORY_COLUMN,
    MAX_HISTORY,
    MIXED,
    MIXED_PLAN,
    MULTI_HOT_SIZES,
    NO_SEQUENCE,
    PARQUET_ZCH,
    PROBE_ROWS,
    REFUSALS,
    SEQUENCE_ITEM,
    STEPS,
    STOP,
    TABLE_ROWS,
    ZCH_EVICTION_INTERVAL,
    ZCH_TABLE_ROWS,
    Case,
    MatrixSpec,
    Refusal,
    batches_per_epoch,
    case_name,
    covering_cases,
    epochs,
    expected_steps,
    has_sequence,
    is_zch,
    logged_steps,
    matches_only,
    probe_histories,
    probe_inputs,
    refusal_cases,
    resumed_steps,
    validation_every,
    with_epoch_shares,
)
from harness.matrix.checks import (
    EXPORT_TOLERANCE,
    CaseResult,
    assemble_table,
    check_case,
    check_export,
    check_refusal,
    export_difference,
    export_pool,
    format_table,
    identical,
    max_difference,
    sharded_tolerance,
    start_exports,
    zch_program_inputs,
)
from harness.matrix.command import (
    DESCRIPTION,
    MatrixFlags,
    evaluate,
    main,
    matrix_parser,
    run,
    selected_cases,
    small_data,
)
from harness.matrix.ranks import (
    JobPlan,
    JobTimeout,
    Launcher,
    local_launcher,
    local_weights,
    probe_batch,
    run_jobs,
    tf32_off,
    zch_probe_ids,
)

__all__ = [
    "ADAPTIVE",
    "CPU_MATRIX",
    "DESCRIPTION",
    "DIMENSIONS",
    "EMBEDDING_DIM",
    "EPS",
    "EXPORT_TOLERANCE",
    "GLOBAL_BATCH",
    "HISTORY_COLUMN",
    "MAX_HISTORY",
    "MIXED",
    "MIXED_PLAN",
    "MULTI_HOT_SIZES",
    "NO_SEQUENCE",
    "PARQUET_ZCH",
    "PROBE_ROWS",
    "REFUSALS",
    "SEQUENCE_ITEM",
    "STEPS",
    "STOP",
    "TABLE_ROWS",
    "ZCH_EVICTION_INTERVAL",
    "ZCH_TABLE_ROWS",
    "Case",
    "CaseResult",
    "JobPlan",
    "JobTimeout",
    "Launcher",
    "MatrixFlags",
    "MatrixSpec",
    "Refusal",
    "assemble_table",
    "batches_per_epoch",
    "case_argv",
    "case_name",
    "check_case",
    "check_export",
    "check_refusal",
    "compute_kernel_flag",
    "covering_cases",
    "data_flags",
    "epochs",
    "evaluate",
    "expected_steps",
    "export_difference",
    "export_pool",
    "format_table",
    "has_sequence",
    "is_zch",
    "identical",
    "learning_rate",
    "local_launcher",
    "local_weights",
    "logged_steps",
    "main",
    "matches_only",
    "matrix_parser",
    "max_difference",
    "parquet_copy",
    "probe_batch",
    "probe_histories",
    "probe_inputs",
    "refusal_cases",
    "resumed_steps",
    "run",
    "run_jobs",
    "selected_cases",
    "sequence_flags",
    "sharded_tolerance",
    "small_data",
    "start_exports",
    "tf32_off",
    "validation_every",
    "with_epoch_shares",
    "zch_probe_ids",
    "zch_program_inputs",
]
