"""The matrix's cases: the dimensions and their choices, the refused combinations,
the covering-array generator, each case's name and the steps its run must log."""

import fnmatch
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from data.binary.criteo_layout import NUM_DENSE_FEATURES, NUM_SPARSE_FEATURES
from models.config import EMBEDDING_PRECISIONS, INTERACTION_TYPES, SEQUENCE_INTERACTION_TYPES
from sharding_plans.constraints import SEQUENCE_SHARDING_TYPES, SHARDING_TYPES
from training.config import DENSE_OPTIMIZERS, OPTIMIZERS, PIPELINES
from training.pipelines import CUDA_ONLY_PIPELINES

MIXED = "mixed"  # every sharding type at once, cycling over the tables
NO_SEQUENCE = "none"  # the sequence choice of a case without a history feature
DIMENSIONS: dict[str, tuple[Any, ...]] = {
    "optimizer": OPTIMIZERS,
    "dense_optimizer": DENSE_OPTIMIZERS,
    "sharding": SHARDING_TYPES + (MIXED,),
    "precision": EMBEDDING_PRECISIONS,
    "pipeline": PIPELINES,
    "interaction": INTERACTION_TYPES,
    "multi_hot": (False, True),
    "world_size": (1, 2),
    "amp": (False, True),
    "epochs": (1, 2),
    "validation_within_epoch": (False, True),
    # The data the case trains on: the Criteo day files, or the same rows as a
    # Parquet table (`parquet_copy`), read in place by the streaming loader; its ids
    # taken as they are (--id_hashing modulo), through a vocabulary of the training
    # split (--id_hashing vocabulary, `PARQUET_VOCABULARY`) or through managed-collision
    # tables that admit and evict ids (--id_hashing zch, `PARQUET_ZCH`).
    "data_source": ("criteo_binary", "parquet", "parquet_vocabulary", "parquet_zch"),
    # A history feature of the Parquet copy (`HISTORY_COLUMN`, `--sequence_columns
    # HISTORY_COLUMN:SEQUENCE_ITEM`) pooled by each sequence interaction, or none.
    "sequence": (NO_SEQUENCE, *SEQUENCE_INTERACTION_TYPES),
}
ADAPTIVE = ("adagrad", "rowwise_adagrad", "adam")

# The tiny model every case trains: 26 tables of 40..115 rows, dim 8.
TABLE_ROWS = [40 + 3 * i for i in range(NUM_SPARSE_FEATURES)]
EMBEDDING_DIM = 8
GLOBAL_BATCH = 64
STEPS = 4  # training steps of a case, over all its epochs
STOP = 2  # the resumed run starts from this step's checkpoint
PROBE_ROWS = 32  # rows of the batch export and eager are compared on
MIXED_PLAN = ",".join(f"t_cat_{i}={SHARDING_TYPES[i % len(SHARDING_TYPES)]}" for i in range(len(TABLE_ROWS)))
MULTI_HOT_SIZES = [1 + i % 4 for i in range(len(TABLE_ROWS))]


# The history feature of a sequence case: the Parquet copy's column HISTORY_COLUMN holds
# each row's previous rows' SEQUENCE_ITEM ids, 0 to HISTORY_LENGTHS - 1 of them, and
# the model keeps the newest MAX_HISTORY (so some are cut). Its table t_cat_2 is row_wise
# in MIXED_PLAN: an EmbeddingCollection's row split over the ranks.
SEQUENCE_ITEM = "cat_2"
HISTORY_COLUMN = f"history_{SEQUENCE_ITEM}"  # outside the cases' --sparse_columns cat_*
MAX_HISTORY = 4
HISTORY_LENGTHS = 7

Case = dict[str, Any]  # dimension -> choice

# The data_source choice that reads the Parquet copy through an id vocabulary.
PARQUET_VOCABULARY = "parquet_vocabulary"
# Its --min_id_count: rare ids share row 0, so that the out-of-vocabulary row trains too.
VOCABULARY_MIN_ID_COUNT = 2
# The data_source choice that reads the Parquet copy through zero-collision tables (docs/zch.md).
PARQUET_ZCH = "parquet_zch"
# Its --zch_eviction_interval: admissions at steps 2 and 4 (the second evicts: LRU, tables
# full); the resumed run starts from step STOP, a multiple of it, as zch's exact resume needs.
ZCH_EVICTION_INTERVAL = 2
# Its tables: half the cases' rows, fewer than the ids the run reads, so that they fill
# and the admission of step 4 evicts (the probe's values stay below them).
ZCH_TABLE_ROWS = [rows // 2 for rows in TABLE_ROWS]


def is_parquet(case: Case) -> bool:
    """Whether the case reads the Parquet copy (with either id mapping)."""
    return str(case.get("data_source", "")).startswith("parquet")


def is_zch(case: Case) -> bool:
    """Whether the case's tables are zch's managed-collision ones."""
    return case.get("data_source") == PARQUET_ZCH


def has_sequence(case: Case) -> bool:
    """Whether the case's model has the history feature (a matrix without the dimension: no)."""
    return case.get("sequence", NO_SEQUENCE) != NO_SEQUENCE


@dataclass(frozen=True)
class Where:
    """A refused choice given by a test rather than one value: every world size above
    one, say. Its refusal case takes the first choice that passes (the most ranks)."""

    test: Callable[[Any], bool]


def _is(choice: Any, value: Any) -> bool:
    return value.test(choice) if isinstance(value, Where) else choice == value


@dataclass(frozen=True)
class Refusal:
    """A combination that must be refused: the choices that make it, when, and a
    fragment of the one-line message."""

    choices: tuple[tuple[str, Any], ...]
    message: str
    devices: tuple[str, ...] = ("cpu", "cuda")
    # Choices its refusal case (`refusal_cases`) takes besides, so that no other refusal
    # stops it first; not part of the combination.
    setting: tuple[tuple[str, Any], ...] = ()

    def matches(self, case: Case, device: str) -> bool:
        """Whether ``case`` (or a partial one) holds every choice of this combination."""
        return device in self.devices and all(d in case and _is(case[d], v) for d, v in self.choices)


REFUSALS: tuple[Refusal, ...] = (
    # FBGEMM's dense (data-parallel) kernel has no fp16 backward: wrong results, NaN.
    Refusal((("precision", "fp16"), ("sharding", "data_parallel")), "data_parallel"),
    Refusal((("precision", "fp16"), ("sharding", MIXED)), "data_parallel"),
    *(Refusal((("pipeline", p),), f"--pipeline {p} needs CUDA", devices=("cpu",)) for p in CUDA_ONLY_PIPELINES),
    # A history needs data that holds one: the Criteo day files have no list columns.
    *(
        Refusal(
            (("sequence", s), ("data_source", "criteo_binary")),
            "needs data with history features",
            setting=(("sharding", "table_wise"),),
        )
        for s in SEQUENCE_INTERACTION_TYPES
    ),
    # Validation inside the epoch of a history model on several ranks, under a pipeline
    # holding the next batch (training/pipelines.py `check_validation_handover`).
    Refusal(
        (
            ("sequence", Where(lambda s: s != NO_SEQUENCE)),
            ("validation_within_epoch", True),
            ("world_size", Where(lambda n: n > 1)),
            ("pipeline", Where(lambda p: p != "base")),
        ),
        "pipeline's handover to validation",
        setting=(("data_source", "parquet"), ("sharding", "table_wise")),
    ),
    # The item table is an EmbeddingCollection's, whose sharder offers only these.
    *(
        Refusal(
            (("sequence", s), ("sharding", t)),
            f"cannot be {t}: give it table_wise",
            setting=(("data_source", "parquet"),),
        )
        for s in SEQUENCE_INTERACTION_TYPES
        for t in SHARDING_TYPES
        if t not in SEQUENCE_SHARDING_TYPES
    ),
    # zch's managed-collision sharder takes row_wise only (training/config.py `_check_zch`).
    *(
        Refusal((("data_source", PARQUET_ZCH), ("sharding", t)), "tables are sharded row_wise only")
        for t in SHARDING_TYPES + (MIXED,)
        if t != "row_wise"
    ),
    # Row-wise Adagrad's reset of an admitted or evicted row's state has no CPU kernel in
    # fbgemm-gpu-cpu 1.8 (`fbgemm::reset_weight_momentum`): the first step fails.
    Refusal(
        (("data_source", PARQUET_ZCH), ("optimizer", "rowwise_adagrad")),
        "rowwise_adagrad",
        devices=("cpu",),
        setting=(("sharding", "row_wise"),),
    ),
    # Validation inside the epoch on several ranks under a pipeline holding the next batch
    # fails in gloo (in->size == out->size) as a history's does: the handover resends the
    # held batch's ids, which size the managed-collision modules' all-to-all too
    # (training/pipelines.py `check_validation_handover`).
    Refusal(
        (
            ("data_source", PARQUET_ZCH),
            ("validation_within_epoch", True),
            ("world_size", Where(lambda n: n > 1)),
            ("pipeline", Where(lambda p: p != "base")),
        ),
        "pipeline's handover to validation",
        setting=(("sharding", "row_wise"),),
    ),
    # Histories read plain tables.
    *(
        Refusal(
            (("data_source", PARQUET_ZCH), ("sequence", s)),
            "cannot be combined with --sequence_columns",
            setting=(("sharding", "row_wise"),),
        )
        for s in SEQUENCE_INTERACTION_TYPES
    ),
)


@dataclass(frozen=True)
class MatrixSpec:
    """What a matrix varies, what it refuses, and what each case is compared with.

    Args:
        dimensions: {dimension: choices}; a case has one choice of each.
        reference: the choices the reference run of check (a) takes instead of the
            case's (the rest are the case's).
        refusals: the combinations that must be refused.
        device: cpu or cuda.
        defaults: choices of dimensions the matrix does not vary.
    """

    dimensions: dict[str, tuple[Any, ...]]
    reference: dict[str, Any]
    refusals: tuple[Refusal, ...]
    device: str
    defaults: dict[str, Any] = field(default_factory=dict)

    def refusal_for(self, case: Case) -> Refusal | None:
        return next((r for r in self.refusals if r.matches(case, self.device)), None)

    def forbidden(self, partial: dict[str, Any]) -> bool:
        """Whether the (possibly partial) choices already make a refused combination."""
        return self.refusal_for(partial) is not None

    def complete(self, choices: dict[str, Any]) -> Case:
        return {**self.defaults, **choices}

    def reference_of(self, case: Case) -> Case:
        """The reference run of ``case`` (`with_epoch_shares`). A zch case's is its own
        world size and row_wise tables on the reference's pipeline: across world sizes its
        ids get other rows by design, and no trainer runs torchrec's unsharded module
        (docs/zch.md; `is_zch`)."""
        if is_zch(case):
            reference = {**case, "pipeline": self.reference.get("pipeline", case["pipeline"])}
            # Where that pipeline refuses the case's validation inside the epoch, the
            # reference validates at the epoch's end: evaluation never admits, so the
            # training it compares is the same.
            return {**reference, "validation_within_epoch": False} if self.refusal_for(reference) else reference
        return with_epoch_shares({**case, **self.reference}, case)


def with_epoch_shares(reference: Case, case: Case) -> Case:
    """``reference`` reading a Parquet case's batches: with ``--epoch_shares`` the case's
    world size, the reference reads at every step the global batch the case's ranks read
    (a binary case's ranks read those of one rank already). A reference on more ranks
    than the case cannot take the case's shares: it is left as it is."""
    if not is_parquet(case) or case["world_size"] % reference["world_size"]:
        return reference
    return {**reference, "epoch_shares": case["world_size"]}


# The matrix `make test` and `make test-matrix` run: every flag's choices on the CPU.
CPU_MATRIX = MatrixSpec(
    DIMENSIONS,
    reference={"sharding": "table_wise", "world_size": 1, "pipeline": "sparse_dist"},
    refusals=REFUSALS,
    device="cpu",
)


# ------------------------------------------------------------------ case generation


# The generator's seed: one whose all-pairs set keeps what tests/harness/test_matrix.py
# asks beyond the pairs (a 2-rank case of the default optimizers, each history split over
# 2 ranks, zch on 1 and 2 ranks); 0 lost the first two when parquet_zch joined.
SEED = 9


def covering_cases(spec: MatrixSpec, strength: int, seed: int = SEED, candidates: int = 24) -> list[Case]:
    """Trainable cases in which every ``strength``-tuple of allowed choices appears.

    Greedy (AETG-style): each new case starts from a tuple not yet covered and fills
    the other dimensions with the choice covering the most uncovered tuples; the best
    of ``candidates`` tries is kept. Deterministic for a seed.
    """
    dims = list(spec.dimensions)
    uncovered = set()
    for group in itertools.combinations(dims, strength):
        for values in itertools.product(*(spec.dimensions[d] for d in group)):
            partial = dict(zip(group, values))
            if not spec.forbidden(partial):
                uncovered.add(tuple(zip(group, values)))
    rng = random.Random(seed)
    cases: list[Case] = []

    def covered(case: Case) -> set:
        return {t for t in uncovered if all(case.get(d, object()) == v for d, v in t)}

    while uncovered:
        best: tuple[int, Case] | None = None
        pool = sorted(uncovered, key=repr)
        for _ in range(candidates):
            case: Case = dict(rng.choice(pool))
            rest = [d for d in dims if d not in case]
            rng.shuffle(rest)
            for d in rest:
                options = [v for v in spec.dimensions[d] if not spec.forbidden({**case, d: v})]
                gains = [len(covered({**case, d: v})) for v in options]
                top = max(gains)
                case[d] = rng.choice([v for v, g in zip(options, gains) if g == top])
            score = len(covered(case))
            if best is None or score > best[0]:
                best = (score, case)
        assert best is not None
        cases.append(spec.complete({d: best[1][d] for d in dims}))
        uncovered -= covered(best[1])
    return cases


def refusal_cases(spec: MatrixSpec, base: Case | None = None) -> list[Case]:
    """One case per refused combination: its choices, the rest those of ``base`` or
    else the first choices (and the most ranks, so that every rank is seen refusing)."""

    def first(d: str, test: Callable[[Any], bool] = lambda _: True) -> Any:
        passing = [c for c in spec.dimensions[d] if test(c)]
        return (max(passing) if d == "world_size" else passing[0]) if passing else None

    cases = []
    for r in spec.refusals:
        choices = {d: first(d, v.test) if isinstance(v, Where) else v for d, v in r.choices}
        if spec.device in r.devices and None not in choices.values():  # None: no choice here passes (one GPU)
            cases.append(
                spec.complete({**{d: first(d) for d in spec.dimensions}, **(base or {}), **dict(r.setting), **choices})
            )
    return cases


def matches_only(name: str, only: str) -> bool:
    """Whether a case named ``name`` is selected by ``--only``: empty selects every case;
    otherwise any of its comma-separated patterns, each a piece of the name, or a
    glob over the whole name where it has a ``*``.

    Example::

        matches_only("sgd/dense-sgd/table_wise/fp16/prefetch/...", "*/fp16/prefetch/*,/semi_sync/")  # True
    """
    if not only:
        return True
    return any(fnmatch.fnmatchcase(name, p) if "*" in p else p in name for p in only.split(",") if p)


def case_name(case: Case) -> str:
    parts = [
        case["optimizer"],
        f"dense-{case['dense_optimizer']}",
        case["sharding"],
        case["precision"],
        case["pipeline"],
        case["interaction"],
        "multi-hot" if case["multi_hot"] else "one-hot",
        f"ws{case['world_size']}",
    ] + (["amp"] if case["amp"] else [])
    parts += [case["data_source"].replace("_", "-")] if is_parquet(case) else []
    parts += [f"history-{case['sequence']}"] if has_sequence(case) else []
    parts += [case["compute_kernel"]] if case.get("compute_kernel") else []
    parts += ["tf32"] if case.get("allow_tf32") else []
    parts += [f"{epochs(case)}-epochs"] if epochs(case) > 1 else []
    parts += [f"validate-every-{validation_every(case)}"] if case.get("validation_within_epoch") else []
    shares = case.get("epoch_shares", case["world_size"])  # the default (the world size) is no other run
    parts += [f"shares{shares}"] if shares != case["world_size"] else []
    return "/".join(parts)


def epochs(case: Case) -> int:
    """The case's epochs (a matrix without the dimension trains one)."""
    return case.get("epochs", 1)


def batches_per_epoch(case: Case) -> int:
    return STEPS // epochs(case)


def validation_every(case: Case) -> int:
    """--validation_freq_within_epoch: half an epoch, so the first validation of each
    epoch lies inside it, the second at its end."""
    return batches_per_epoch(case) // 2


def expected_steps(case: Case) -> dict[str, Any]:
    """What the log of the case's uninterrupted run must show: training steps per
    epoch, the steps validation ran at, and the test's step."""
    per_epoch = batches_per_epoch(case)
    every = validation_every(case) if case.get("validation_within_epoch") else per_epoch
    return {
        "train": {e: per_epoch for e in range(epochs(case))},
        "validation": list(range(every, STEPS + 1, every)),
        "test": [STEPS],
    }


def logged_steps(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The same figures as `expected_steps`, read from a JSON-lines run log."""
    train: dict[int, int] = {}
    for r in records:
        if r["event"] == "train":
            train[r["epoch"]] = train.get(r["epoch"], 0) + len(r["step_losses"])
    # The final weights' test (a run that kept a better checkpoint tests that one too, after).
    evals = {
        stage: [
            r["step"]
            for r in records
            if r["event"] == "eval" and r["stage"] == stage and r.get("model") in (None, "final")
        ]
        for stage in ("validation", "test")
    }
    return {"train": train, **evals}


def resumed_steps(expected: dict[str, Any], case: Case) -> dict[str, Any]:
    """`expected_steps` of the run resumed from step STOP: the rest of its epoch, the
    later epochs, the validations after the stop (and the one at the stop when it
    ends an epoch: that checkpoint precedes the epoch's validation), the test."""
    per_epoch = batches_per_epoch(case)
    train = {e: n - max(0, min(n, STOP - e * per_epoch)) for e, n in expected["train"].items()}
    first = STOP if STOP % per_epoch == 0 else STOP + 1
    return {
        "train": {e: n for e, n in train.items() if n},
        "validation": [s for s in expected["validation"] if s >= first],
        "test": expected["test"],
    }


def probe_histories(item_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A sequence case's probe histories: (ids row by row, each row's count), 0 to
    `MAX_HISTORY` ids a row (empty and full ones), below ``item_rows``."""
    gen = torch.Generator().manual_seed(13)
    lengths = torch.arange(PROBE_ROWS) % (MAX_HISTORY + 1)
    return torch.randint(0, item_rows, (int(lengths.sum()),), generator=gen), lengths


def probe_inputs(table_rows: Sequence[int] = TABLE_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe rows: ids below ``table_rows`` (a vocabulary case's tables are the
    vocabulary's, at most `TABLE_ROWS`)."""
    gen = torch.Generator().manual_seed(11)
    dense = torch.rand(PROBE_ROWS, NUM_DENSE_FEATURES, generator=gen) * 5
    ids = torch.stack([torch.randint(0, rows, (PROBE_ROWS,), generator=gen) for rows in table_rows], dim=1)
    return dense, ids
