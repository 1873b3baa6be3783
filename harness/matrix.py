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

Run the larger set with ``python -m harness.matrix --strength 3`` (``make test-matrix``).
"""

import contextlib
import fnmatch
import io
import itertools
import json
import math
import multiprocessing
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Optional
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.tensor import DTensor

from common.cli import DefaultsHelpFormatter, OneLineParser, cli_main
from common.errors import BadInput
from common.config_flags import Overrides, add_flags, config_values, flag
from models.config import EMBEDDING_PRECISIONS, INTERACTION_TYPES
from sharding_plans.constraints import COLUMN_SHARDING_TYPES, SHARDING_TYPES
from data.criteo_layout import NUM_DENSE_FEATURES, NUM_SPARSE_FEATURES
from training.config import DENSE_OPTIMIZERS, OPTIMIZERS, PIPELINES
from training.optimizers import TABLE_PARAMETER
from training.pipelines import CUDA_ONLY_PIPELINES

MIXED = "mixed"  # every sharding type at once, cycling over the tables
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
    # Parquet table (`parquet_copy`), read in place by the streaming loader.
    "data_source": ("criteo_binary", "parquet"),
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


Case = dict[str, Any]  # dimension -> choice


@dataclass(frozen=True)
class Refusal:
    """A combination that must be refused: the choices that make it, when, and a
    fragment of the one-line message."""

    choices: tuple[tuple[str, Any], ...]
    message: str
    devices: tuple[str, ...] = ("cpu", "cuda")

    def matches(self, case: Case, device: str) -> bool:
        """Whether ``case`` (or a partial one) holds every choice of this combination."""
        return device in self.devices and all(d in case and case[d] == v for d, v in self.choices)


REFUSALS: tuple[Refusal, ...] = (
    # FBGEMM's dense (data-parallel) kernel has no fp16 backward: wrong results, NaN.
    Refusal((("precision", "fp16"), ("sharding", "data_parallel")), "data_parallel"),
    Refusal((("precision", "fp16"), ("sharding", MIXED)), "data_parallel"),
    *(Refusal((("pipeline", p),), f"--pipeline {p} needs CUDA", devices=("cpu",)) for p in CUDA_ONLY_PIPELINES),
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

    def refusal_for(self, case: Case) -> Optional[Refusal]:
        return next((r for r in self.refusals if r.matches(case, self.device)), None)

    def forbidden(self, partial: dict[str, Any]) -> bool:
        """Whether the (possibly partial) choices already make a refused combination."""
        return self.refusal_for(partial) is not None

    def complete(self, choices: dict[str, Any]) -> Case:
        return {**self.defaults, **choices}


# The matrix `make test` and `make test-matrix` run: every flag's choices on the CPU.
CPU_MATRIX = MatrixSpec(DIMENSIONS, reference={"sharding": "table_wise", "world_size": 1, "pipeline": "sparse_dist"},
                        refusals=REFUSALS, device="cpu")


# ------------------------------------------------------------------ case generation

def covering_cases(spec: MatrixSpec, strength: int, seed: int = 0, candidates: int = 24) -> list[Case]:
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
        best: Optional[tuple[int, Case]] = None
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


def refusal_cases(spec: MatrixSpec, base: Optional[Case] = None) -> list[Case]:
    """One case per refused combination: its choices, the rest those of ``base`` or
    else the first choices (and the most ranks, so that every rank is seen refusing)."""
    first = {d: max(choices) if d == "world_size" else choices[0] for d, choices in spec.dimensions.items()}
    return [spec.complete({**first, **(base or {}), **dict(r.choices)})
            for r in spec.refusals if spec.device in r.devices]


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
    parts = [case["optimizer"], f"dense-{case['dense_optimizer']}", case["sharding"], case["precision"],
             case["pipeline"], case["interaction"], "multi-hot" if case["multi_hot"] else "one-hot",
             f"ws{case['world_size']}"] + (["amp"] if case["amp"] else [])
    parts += ["parquet"] if case.get("data_source") == "parquet" else []
    parts += [case["compute_kernel"]] if case.get("compute_kernel") else []
    parts += ["tf32"] if case.get("allow_tf32") else []
    parts += [f"{epochs(case)}-epochs"] if epochs(case) > 1 else []
    parts += [f"validate-every-{validation_every(case)}"] if case.get("validation_within_epoch") else []
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
    return {"train": {e: per_epoch for e in range(epochs(case))},
            "validation": list(range(every, STEPS + 1, every)), "test": [STEPS]}


def logged_steps(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The same figures as `expected_steps`, read from a JSON-lines run log."""
    train: dict[int, int] = {}
    for r in records:
        if r["event"] == "train":
            train[r["epoch"]] = train.get(r["epoch"], 0) + len(r["step_losses"])
    # The final weights' test (a run that kept a better checkpoint tests that one too, after).
    evals = {stage: [r["step"] for r in records if r["event"] == "eval" and r["stage"] == stage
                     and r.get("model") in (None, "final")]
             for stage in ("validation", "test")}
    return {"train": train, **evals}


def resumed_steps(expected: dict[str, Any], case: Case) -> dict[str, Any]:
    """`expected_steps` of the run resumed from step STOP: the rest of its epoch, the
    later epochs, the validations after the stop (and the one at the stop when it
    ends an epoch: that checkpoint precedes the epoch's validation), the test."""
    per_epoch = batches_per_epoch(case)
    train = {e: n - max(0, min(n, STOP - e * per_epoch)) for e, n in expected["train"].items()}
    first = STOP if STOP % per_epoch == 0 else STOP + 1
    return {"train": {e: n for e, n in train.items() if n},
            "validation": [s for s in expected["validation"] if s >= first], "test": expected["test"]}


# ------------------------------------------------------------------ flags of a case

def learning_rate(case: Case) -> float:
    """SGD tolerates a large step on this model; the adaptive optimizers move every
    touched weight by about the rate on their first step, so they get a small one."""
    adaptive = case["optimizer"] in ADAPTIVE or case["dense_optimizer"] in ADAPTIVE
    return 0.05 if adaptive else 0.5


# Epsilon of the adaptive optimizers. With the default 1e-8 their first step is
# lr * g / |g|: an element whose gradient is zero up to rounding moves by +-lr in one
# run and -+lr in the other, and no tolerance separates that from a bug. With 1e-2
# a gradient difference d changes a step by at most lr * d / eps (5 d here), so the
# comparison stays sharp.
EPS = 1e-2


def parquet_copy(data_dir: str, multi_hot: bool) -> str:
    """The Criteo day files of ``data_dir`` as one Parquet file beside it (written once):
    ``label``, the dense columns ``int_*`` as they are (already transformed), the ids
    ``cat_*`` as int64, or with ``multi_hot`` as lists of `MULTI_HOT_SIZES` ids (the id,
    then its successors). The cases train on it with ``--id_hashing modulo``, so rows
    hold the ids the binary cases' do."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from data.criteo_binary import CriteoBinaryDataset
    from data.criteo_layout import DENSE_FEATURE_NAMES, SPARSE_FEATURE_NAMES
    target = f"{data_dir}-parquet-{'multi' if multi_hot else 'one'}-hot"
    path = os.path.join(target, "rows.parquet")
    if os.path.exists(path):
        return target
    dataset = CriteoBinaryDataset(data_dir)
    dense, sparse, labels = dataset.read(0, dataset.num_rows)
    columns: dict[str, Any] = {"label": pa.array(labels.reshape(-1).astype(np.int8))}
    columns.update({name: pa.array(dense[:, i]) for i, name in enumerate(DENSE_FEATURE_NAMES)})
    for f, name in enumerate(SPARSE_FEATURE_NAMES):
        ids = sparse[:, f].astype(np.int64)
        if multi_hot:
            bags = ids[:, None] + np.arange(MULTI_HOT_SIZES[f])
            offsets = np.arange(0, bags.size + 1, MULTI_HOT_SIZES[f], dtype=np.int32)
            columns[name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(bags.reshape(-1)))
        else:
            columns[name] = pa.array(ids)
    os.makedirs(target, exist_ok=True)
    pq.write_table(pa.table(columns), path + ".tmp", row_group_size=5000)  # uneven over the batches
    os.replace(path + ".tmp", path)
    return target


def data_flags(case: Case, data_dir: str) -> list[str]:
    """The flags naming the case's data (`DIMENSIONS` ``data_source``)."""
    if case.get("data_source", "criteo_binary") == "criteo_binary":
        argv = ["--in_memory_binary_criteo_path", data_dir]
        return argv + (["--multi_hot_sizes", ",".join(map(str, MULTI_HOT_SIZES))] if case["multi_hot"] else [])
    return ["--parquet_path", parquet_copy(data_dir, case["multi_hot"]), "--dense_columns", "int_*",
            "--sparse_columns", "cat_*", "--dense_transform", "none", "--id_hashing", "modulo"]


def case_argv(case: Case, data_dir: str, device: str) -> list[str]:
    """The training flags of a case (per-rank batch: the global batch over the ranks)."""
    argv = [
        *data_flags(case, data_dir), "--device", device, "--seed", "5",
        "--num_embeddings_per_feature", ",".join(map(str, TABLE_ROWS)), "--embedding_dim", str(EMBEDDING_DIM),
        "--dense_arch_layer_sizes", "16,8", "--over_arch_layer_sizes", "16,1",
        "--interaction_type", case["interaction"], "--dcn_num_layers", "2", "--dcn_low_rank_dim", "4",
        "--interaction_branch1_layer_sizes", "16,16", "--interaction_branch2_layer_sizes", "16,16",
        "--optimizer", case["optimizer"], "--dense_optimizer", case["dense_optimizer"],
        "--learning_rate", str(learning_rate(case)), "--eps", str(EPS),
        "--embedding_precision", case["precision"], "--pipeline", case["pipeline"],
        "--sharding_type", MIXED_PLAN if case["sharding"] == MIXED else case["sharding"],
        "--batch_size", str(GLOBAL_BATCH // case["world_size"]),
        "--limit_train_batches", str(batches_per_epoch(case)), "--epochs", str(epochs(case)),
        "--limit_val_batches", "2", "--limit_test_batches", "2", "--log_every_n_steps", "100",
        # 4 steps, tested on 128 rows: the cases compare runs with each other, not with a
        # constant predictor, which such a run may not beat yet (training/divergence.py).
        "--allow_divergence",
    ]
    if case.get("validation_within_epoch"):
        argv += ["--validation_freq_within_epoch", str(validation_every(case))]
    if case["amp"]:
        argv.append("--amp")
    if case.get("compute_kernel"):
        argv += ["--compute_kernel", compute_kernel_flag(case)]
    if case.get("allow_tf32"):
        argv.append("--allow_tf32")
    return argv


def compute_kernel_flag(case: Case) -> str:
    """--compute_kernel of a case: its kernel for the fused tables; data-parallel
    tables (all of them, or MIXED's share) run the dense kernel, the only one they have."""
    if case["sharding"] == "data_parallel":
        return "dense"
    dense = [f"t_cat_{i}=dense" for i in range(len(TABLE_ROWS))
             if case["sharding"] == MIXED and SHARDING_TYPES[i % len(SHARDING_TYPES)] == "data_parallel"]
    return ",".join([case["compute_kernel"]] + dense)


def sharded_tolerance(case: Case, device: str) -> tuple[float, str]:
    """(absolute tolerance on losses and weights, why) for check (a)."""
    if case["amp"]:
        return 1e-2, ("bf16 autocast: each rank's matmuls round their partial results to bf16 "
                      "(8 bits of mantissa) before the fp32 all-reduce, the reference rounds whole-batch ones; "
                      "the adaptive optimizers pass a gradient difference d on as up to lr * d / eps = 5 d")
    if case["optimizer"] == "rowwise_adagrad" and case["world_size"] > 1 and \
            case["sharding"] in COLUMN_SHARDING_TYPES + (MIXED,):
        return 5e-3, ("row-wise Adagrad keeps one accumulator per row of each column shard (the mean "
                      "of that shard's squared gradients), the reference one per whole row: a different "
                      "step size, the same direction")
    if case["precision"] == "fp16":
        return 2.5e-4, ("fp16 tables: an update rounds each weight to fp16, whose step is 1.2e-4 at the "
                        "weights' magnitude here, so a summation-order difference can flip a rounding")
    if device == "cuda":
        return 1e-5, "GPU kernels may sum in another order from run to run (atomic adds)"
    if case["optimizer"] in ADAPTIVE or case["dense_optimizer"] in ADAPTIVE:
        return 1e-5, ("adaptive optimizers divide by the root of the summed squared gradients: "
                      "summation-order differences of 1e-7 grow by up to 1/sqrt(sum) on the first steps")
    return 1e-6, "same arithmetic up to the summation order of the all-reduce and the pooling"


# ------------------------------------------------------------------ one rank's runs

def local_weights(model: torch.nn.Module) -> dict[str, Any]:
    """This rank's pieces of every table {table: [(row, col, tensor)]} and the dense
    parameters, copied."""
    tables: dict[str, list[tuple[int, int, torch.Tensor]]] = {}
    dense: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        parts = key.split(".")
        if TABLE_PARAMETER in parts:
            if isinstance(value, DTensor):
                value = value.to_local()
            if isinstance(value, ShardedTensor):
                tables[parts[-2]] = [(s.metadata.shard_offsets[0], s.metadata.shard_offsets[1],
                                      s.tensor.detach().cpu().clone()) for s in value.local_shards()]
            else:
                tables[parts[-2]] = [(0, 0, value.detach().cpu().clone())]
        else:
            dense[key] = value.detach().cpu().clone()
    return {"tables": tables, "dense": dense}


def assemble_table(per_rank: Sequence[dict[str, Any]], table: str, rows: int, dim: int) -> torch.Tensor:
    """A whole table (float32) from every rank's pieces; replicas must agree exactly."""
    full = torch.full((rows, dim), float("nan"))
    for weights in per_rank:
        for row, col, piece in weights["tables"].get(table, []):
            target = full[row:row + piece.shape[0], col:col + piece.shape[1]]
            if not torch.isnan(target).any():
                assert torch.equal(target, piece.float()), f"{table}: replicas differ"
            target.copy_(piece.float())
    assert not torch.isnan(full).any(), f"{table}: the pieces do not cover the table"
    return full


def probe_batch(rank: int, world_size: int, device: torch.device):
    """This rank's share of the probe rows: one id per feature (what the exported
    model takes), below every table's size, the same for every case."""
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
    dense, ids = probe_inputs()
    per_rank = PROBE_ROWS // world_size
    dense, ids = dense[rank * per_rank:(rank + 1) * per_rank], ids[rank * per_rank:(rank + 1) * per_rank]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"cat_{i}" for i in range(len(TABLE_ROWS))], values=ids.t().reshape(-1),
        lengths=torch.ones(ids.numel(), dtype=torch.int32))
    return Batch(dense_features=dense, sparse_features=kjt, labels=torch.zeros(per_rank)).to(device)


def probe_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    dense = torch.rand(PROBE_ROWS, NUM_DENSE_FEATURES, generator=gen) * 5
    ids = torch.stack([torch.randint(0, rows, (PROBE_ROWS,), generator=gen) for rows in TABLE_ROWS], dim=1)
    return dense, ids


def _outcome(trainer: Any, result: Any, log_path: str) -> dict[str, Any]:
    """What a finished run left: its losses, metrics, this rank's weights and (rank 0,
    which writes the log) the steps its log shows."""
    steps = logged_steps(read_records(log_path)) if trainer.env.is_main else None
    # The final weights' test figures: the best checkpoint a run also tests depends on the
    # checkpoints its directory holds, which the resumed run's (one checkpoint) does not share.
    test = result.final_test if result.final_test is not None else result.test
    return {"losses": list(result.train_losses), "validation": result.validation, "test": test,
            "records_per_sec": result.records_per_sec, "steps": steps, **local_weights(trainer.model)}


def read_records(log_path: str) -> list[dict[str, Any]]:
    with open(log_path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _eager_probabilities(trainer: Any) -> torch.Tensor:
    """The trained sharded model's probabilities on this rank's probe rows (fp32)."""
    pipeline = trainer.train_pipeline
    if hasattr(pipeline, "detach"):
        pipeline.detach()
    trainer.model.eval()
    with torch.no_grad(), tf32_off():
        _, (_, logits, _) = trainer.model(probe_batch(trainer.env.rank, trainer.env.world_size, trainer.env.device))
    return torch.sigmoid(logits.squeeze(-1).float()).cpu()


@contextlib.contextmanager
def tf32_off():
    """fp32 matmuls on CUDA for a while, whatever --allow_tf32 set: check (c) compares
    the eager model with the fp32 export, not TF32's rounding (10 bits of mantissa)
    with fp32's."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _refusal_outcome(argv: list[str]) -> dict[str, Any]:
    """Runs the entry point on a combination that must be refused: exit code and stderr."""
    import dlrm_main
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = dlrm_main.main(argv)
        except SystemExit as e:
            code = e.code
    return {"code": code, "stderr": err.getvalue()}


def _train_case(argv: list[str], root: str, device: str, resume: bool) -> dict[str, Any]:
    from training.distributed import resolve_env
    from training.flags import parse_config
    from training.trainer import Trainer
    env = resolve_env(device)
    whole, cut = os.path.join(root, "whole"), os.path.join(root, "cut")
    # Saves at STOP, where the resumed run starts, and at the end (STEPS), which is exported.
    log = os.path.join(root, "whole.jsonl")
    trainer = Trainer(parse_config(argv + ["--checkpoint_dir", whole, "--checkpoint_every_n_steps", str(STOP),
                                           "--log_path", log], "matrix", "matrix"), env)
    outcome = {"uninterrupted": _outcome(trainer, trainer.fit(), log), "checkpoint_dir": whole}
    outcome["probe"] = _eager_probabilities(trainer)
    stop = os.path.join(whole, f"step_{STOP:09d}")
    if resume and not os.path.isdir(stop):  # the run ended early: check (d) says how
        outcome["resumed"] = None
    elif resume:
        if env.rank == 0:
            shutil.copytree(stop, os.path.join(cut, f"step_{STOP:09d}"))
        dist.barrier()
        log = os.path.join(root, "cut.jsonl")
        trainer = Trainer(parse_config(argv + ["--checkpoint_dir", cut, "--resume", "--log_path", log],
                                       "matrix", "matrix"), env)
        outcome["resumed"] = _outcome(trainer, trainer.fit(), log)
    return outcome


class JobTimeout(Exception):
    """A job ran past its ``timeout_s``."""


# How soon a deadline that fell inside an import looks again.
_IMPORT_RETRY_S = 0.05


def _inside_import(frame: Any) -> bool:
    """Whether ``frame`` or a caller of it runs the import machinery (its frozen
    modules, ``<frozen importlib._bootstrap>`` and ``_bootstrap_external``)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib."):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def _deadline(seconds: Optional[float]) -> Iterator[None]:
    """Raises JobTimeout in the block once ``seconds`` have passed (None: no limit).
    A signal, so only where Python runs: a job stuck inside one native call is cut
    when the call returns (a launcher's own timeout is the last resort). Never inside
    an import: a module cut mid-way leaves its finished submodules bound to the dead
    half-made parent (the next job's `import matplotlib` then lacked get_data_path), so
    the cut waits until the import is done."""
    if not seconds:
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        if _inside_import(frame):
            signal.setitimer(signal.ITIMER_REAL, _IMPORT_RETRY_S)
            return
        raise JobTimeout(f"timed out after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_jobs(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One rank's part of a launch: refusals first (before any process group exists,
    as in a fresh run), then the training jobs on the shared process group. A job's
    failure, or its running past its ``timeout_s`` (when the job has one), is returned,
    not raised, so the other jobs still run."""
    results = []
    for job in sorted(jobs, key=lambda j: j["kind"] != "refusal"):
        start = time.perf_counter()
        try:
            with _deadline(job.get("timeout_s")):
                if job["kind"] == "refusal":
                    outcome = _refusal_outcome(job["argv"])
                else:
                    outcome = _train_case(job["argv"], job["dir"], job["device"], job["resume"])
        except Exception as e:  # reported in the case's row
            outcome = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}"}
            if isinstance(e, JobTimeout) and dist.is_initialized():
                dist.destroy_process_group()  # the next job starts its own group
        outcome["seconds"] = time.perf_counter() - start
        results.append({"key": job["key"], **outcome})
    if dist.is_initialized():
        dist.destroy_process_group()
    return results


# ------------------------------------------------------------------ checks

def _max_difference(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]],
                    tables: bool = True) -> tuple[float, str]:
    """Largest absolute difference between two runs' losses and assembled weights
    (each given as its ranks' outcomes; the tables' only with ``tables``), and where it is."""
    worst = (0.0, "")
    la, lb = a[0]["losses"], b[0]["losses"]
    if len(la) != len(lb):
        return math.inf, f"{len(la)} losses vs {len(lb)}"
    for step, (x, y) in enumerate(zip(la, lb)):
        worst = max(worst, (abs(x - y), f"loss of step {step + 1}"))
    for i, rows in enumerate(TABLE_ROWS if tables else ()):
        table = f"t_cat_{i}"
        diff = (assemble_table(a, table, rows, EMBEDDING_DIM) - assemble_table(b, table, rows, EMBEDDING_DIM))
        worst = max(worst, (diff.abs().max().item(), table))
    for key in a[0]["dense"]:
        diff = (a[0]["dense"][key].float() - b[0]["dense"][key].float()).abs().max().item()
        worst = max(worst, (diff, key))
    return worst


def _identical(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], steps_from: int) -> Optional[str]:
    """None when the resumed run (b) matches the uninterrupted one (a) bit for bit."""
    if a[0]["losses"][steps_from:] != b[0]["losses"]:
        return f"losses after the stop differ: {a[0]['losses'][steps_from:]} vs {b[0]['losses']}"
    for stage in ("validation", "test"):
        if a[0][stage] != b[0][stage]:
            return f"{stage} metrics differ: {a[0][stage]} vs {b[0][stage]}"
    for ra, rb in zip(a, b):
        for table, pieces in ra["tables"].items():
            for (r1, c1, t1), (r2, c2, t2) in zip(pieces, rb["tables"][table]):
                if (r1, c1) != (r2, c2) or not torch.equal(t1, t2):
                    return f"{table} differs by {(t1.float() - t2.float()).abs().max().item():.3g}"
        for key, value in ra["dense"].items():
            if not torch.equal(value, rb["dense"][key]):
                return f"{key} differs by {(value.float() - rb['dense'][key].float()).abs().max().item():.3g}"
    return None


def export_difference(checkpoint_dir: str, eager: torch.Tensor, out_dir: str) -> float:
    """Exports the newest checkpoint's fp32 program and returns its largest difference
    from the eager probabilities on the probe rows. Named by its step: the directory
    alone exports the best validation's checkpoint, an earlier step than the eager model's."""
    from serving.export import FP32_FILE, export_model
    from serving.model_files import load_model_file, read_manifest
    from serving.model_inputs import read_inputs
    from checkpoints.store import newest_checkpoint
    with contextlib.redirect_stderr(io.StringIO()):
        export_model(newest_checkpoint(checkpoint_dir), out_dir, [])
    manifest = read_manifest(out_dir)
    program = load_model_file(out_dir, FP32_FILE, "torch.export", manifest)  # as predict loads it
    dense, ids = probe_inputs()
    # A bag of varying length (a Parquet list column) has several places, -1 where empty.
    hotness = read_inputs(out_dir, manifest).sparse_hotness
    ids = torch.cat([torch.cat([ids[:, f:f + 1], torch.full((len(ids), h - 1), -1, dtype=ids.dtype)], dim=1)
                     for f, h in enumerate(hotness)], dim=1)
    with torch.no_grad():
        exported = program(dense, ids)
    return (exported - eager).abs().max().item()


EXPORT_TOLERANCE = 1e-6  # the same fp32 arithmetic; one id a bag, so pooling is exact


@dataclass
class CaseResult:
    """What one case checked: each check's verdict text, and whether all passed."""

    case: Case
    checks: dict[str, str] = field(default_factory=dict)
    passed: bool = True
    seconds: float = 0.0
    records_per_sec: Optional[float] = None

    def fail(self, check: str, text: str) -> None:
        self.checks[check] = "FAIL " + text
        self.passed = False


def evaluate(spec: MatrixSpec, cases: list[Case], refusals: list[Case], data_dir: str, work_dir: str,
             launcher: Callable[[Callable, list[dict[str, Any]], int], dict[int, Any]]) -> list[CaseResult]:
    """Runs every case and refusal (one launch per world size) and checks them."""
    jobs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    keys: dict[str, tuple[int, Case]] = {}

    def add(kind: str, case: Case, resume: bool = False) -> str:
        key = f"{kind}:{case_name(case)}"
        if key not in keys:
            keys[key] = (case["world_size"], case)
            job = {"kind": kind, "key": key, "argv": case_argv(case, data_dir, spec.device), "device": spec.device,
                   "dir": os.path.join(work_dir, f"case{len(keys)}"), "resume": resume}
            jobs[case["world_size"]].append(job)
        elif resume:
            next(j for j in jobs[case["world_size"]] if j["key"] == key)["resume"] = True
        return key

    refusal_keys = [add("refusal", c) for c in refusals]
    case_keys = [(add("train", c, resume=True), add("train", {**c, **spec.reference})) for c in cases]
    outcomes: dict[str, list[dict[str, Any]]] = {}
    for world_size, group in jobs.items():
        if not group:
            continue
        per_rank = launcher(run_jobs, group, world_size)
        for rank in sorted(per_rank):
            for result in per_rank[rank]:
                outcomes.setdefault(result["key"], []).append(result)

    # Exports run two at a time in their own processes (tracing is single-threaded).
    exports: dict[str, Any] = {}
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        for key, _ in case_keys:
            per_rank = outcomes[key]
            if all("error" not in o for o in per_rank):
                out_dir = os.path.join(work_dir, "exports", key.replace("/", "_").replace(":", "_"))
                exports[key] = pool.submit(export_difference, per_rank[0]["checkpoint_dir"],
                                           torch.cat([o["probe"] for o in per_rank]), out_dir)
        results = [_check_refusal(spec, case, outcomes[key]) for case, key in zip(refusals, refusal_keys)]
        for case, (key, ref_key) in zip(cases, case_keys):
            results.append(_check_case(spec, case, outcomes[key], outcomes[ref_key], exports.get(key)))
    return results


def _check_refusal(spec: MatrixSpec, case: Case, per_rank: list[dict[str, Any]]) -> CaseResult:
    """Every rank exits 2 before training; the job prints one ``error:`` line, from
    rank 0. Other lines are not counted: on CUDA the same window holds the warnings of
    NCCL and of the planner."""
    result = CaseResult(case, seconds=max(o["seconds"] for o in per_rank))
    refusal = spec.refusal_for(case)
    assert refusal is not None
    errors = [[line for line in o.get("stderr", "").splitlines() if ": error: " in line] for o in per_rank]
    for rank, outcome in enumerate(per_rank):
        if "error" in outcome:
            result.fail("refused", f"rank {rank}: {outcome['error']}")
        elif outcome["code"] != 2:
            result.fail("refused", f"rank {rank}: exit {outcome['code']}, stderr {outcome['stderr'][-500:]!r}")
    if result.passed:
        if len(errors[0]) != 1 or refusal.message not in errors[0][0] or any(errors[1:]):
            result.fail("refused", f"expected one error line from rank 0 naming {refusal.message!r}, got {errors}")
        else:
            result.checks["refused"] = f"ok on {len(per_rank)} rank(s): {errors[0][0]}"
    return result


def _check_case(spec: MatrixSpec, case: Case, per_rank: list[dict[str, Any]], reference: list[dict[str, Any]],
                export: "Future[float]") -> CaseResult:
    result = CaseResult(case, seconds=max(o["seconds"] for o in per_rank))
    for name, outcome in (("case", per_rank[0]), ("reference", reference[0])):
        if "error" in outcome:
            result.fail("ran", f"{name}: {outcome['error']}")
            return result
    whole = [o["uninterrupted"] for o in per_rank]
    result.records_per_sec = whole[0]["records_per_sec"]
    tolerance, why = sharded_tolerance(case, spec.device)
    diff, where = _max_difference(whole, [o["uninterrupted"] for o in reference])
    text = f"{diff:.2g} <= {tolerance:g}" + (f" ({where})" if diff > 0 else "")
    if diff <= tolerance:
        result.checks["sharded=unsharded"] = "ok " + text
    else:
        result.fail("sharded=unsharded", text.replace("<=", ">") + f"; tolerance because {why}")
    resumed = [o["resumed"] for o in per_rank]
    mismatch = _identical(whole, resumed, STOP) if resumed[0] else f"the run saved no step-{STOP} checkpoint"
    if mismatch is None:
        result.checks["resume=uninterrupted"] = "ok bit-exact"
    else:
        result.fail("resume=uninterrupted", mismatch)
    expected = expected_steps(case)
    runs = [("uninterrupted", expected, whole[0]["steps"])]
    runs += [("resumed", resumed_steps(expected, case), resumed[0]["steps"])] if resumed[0] else []
    wrong = [f"{run}: expected {want}, the log shows {got}" for run, want, got in runs if got != want]
    if wrong:
        result.fail("steps", "; ".join(wrong))
    else:
        result.checks["steps"] = f"ok {STEPS} in {epochs(case)} epoch(s), validation at {expected['validation']}"
    check_export(result, export)
    return result


def check_export(result: CaseResult, export: "Optional[Future[float]]") -> None:
    """Check (c): the exported fp32 program's largest difference from the eager model
    (``export``: its pending `export_difference`; None, no export made: a failure)."""
    try:
        diff = export.result() if export else math.inf
        text = f"{diff:.2g} <= {EXPORT_TOLERANCE:g}"
        if diff <= EXPORT_TOLERANCE:
            result.checks["export=eager"] = "ok " + text
        else:
            result.fail("export=eager", text.replace("<=", ">"))
    except Exception as e:
        result.fail("export=eager", f"{type(e).__name__}: {e}")


def format_table(spec: MatrixSpec, results: list[CaseResult]) -> str:
    """One row per case: its choices, pass/fail, seconds, records/s, each check's verdict."""
    header = list(spec.dimensions) + ["result", "seconds", "records/s", "checks"]
    rows = []
    for r in results:
        rate = f"{r.records_per_sec:,.0f}" if r.records_per_sec else "-"
        rows.append([str(r.case[d]) for d in spec.dimensions] +
                    ["pass" if r.passed else "FAIL", f"{r.seconds:.1f}", rate,
                     "; ".join(f"{k}: {v}" for k, v in r.checks.items())])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header[:-1])]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header[:-1], widths)) + "  " + header[-1]]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1])
    passed = sum(r.passed for r in results)
    lines.append(f"{passed} of {len(results)} cases passed")
    return "\n".join(lines)


def run(spec: MatrixSpec, strength: int, only: str = "", list_only: bool = False) -> int:
    """Generates the cases of ``spec``, runs them on local ranks (one launch per world
    size) over freshly generated data, prints the table; 0 when every case passed."""
    cases = [c for c in covering_cases(spec, strength) if matches_only(case_name(c), only)]
    refusals = [c for c in refusal_cases(spec) if matches_only(case_name(c), only)]
    if not cases and not refusals:
        raise BadInput(f"--only {only}: no case of strength {strength} matches (--list shows them)")
    if list_only:
        print("\n".join(case_name(c) for c in cases + refusals))
        print(f"{len(cases)} cases, {len(refusals)} refusals")
        return 0
    from data.synthetic_criteo import generate_synthetic_criteo
    from harness.small_data import SMALL_SPEC
    from harness.launch import launch
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="matrix-") as work:
        data_dir = os.path.join(work, "data")
        generate_synthetic_criteo(SMALL_SPEC, data_dir, show_progress=False)
        results = evaluate(spec, cases, refusals, data_dir, work, lambda fn, jobs, n: launch(fn, jobs, nproc=n))
    print(format_table(spec, results))
    print(f"{spec.device} matrix of strength {strength}: {len(cases)} cases and {len(refusals)} refusals "
          f"in {time.perf_counter() - start:.0f} s")
    return 0 if all(r.passed for r in results) else 1


@dataclass
class MatrixFlags:
    """The flags of a matrix CLI: this one's and bench/gpu_check.py's (whose --strength
    defaults to 2)."""

    strength: int = flag(3, help="cover every pair (2) or triple (3) of choices")
    only: str = flag("", help="run only the cases whose name contains this text, or matches it as a glob where "
                               "it has a *; several, comma-separated (default: all)")
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
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = matrix_parser("python -m harness.matrix", __doc__.split("\n\n")[0], strength=3).parse_args(argv)
    flags = MatrixFlags(**config_values(MatrixFlags, args))
    return run(CPU_MATRIX, flags.strength, flags.only, flags.list_only)


if __name__ == "__main__":
    sys.exit(main())
