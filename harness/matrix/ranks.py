"""One rank's side of a matrix run: training a case (uninterrupted, then resumed),
refusing one, the weights and probabilities it reports, each job under its deadline;
and the plan that groups the jobs into one launch per device and world size."""

import contextlib
import io
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.tensor import DTensor

from common.run_log_file import read_run_log
from harness.matrix.cases import (
    PROBE_ROWS,
    SEQUENCE_ITEM,
    STOP,
    TABLE_ROWS,
    Case,
    case_name,
    logged_steps,
    probe_histories,
    probe_inputs,
)
from training.optimizers import is_table_parameter


def local_weights(model: torch.nn.Module) -> dict[str, Any]:
    """This rank's pieces of every table {table: [(row, col, tensor)]} and the dense
    parameters and buffers (a zch model's remapping: this rank's shard), copied."""
    tables: dict[str, list[tuple[int, int, torch.Tensor]]] = {}
    dense: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        parts = key.split(".")
        if is_table_parameter(key):
            if isinstance(value, DTensor):
                value = value.to_local()
            if isinstance(value, ShardedTensor):
                tables[parts[-2]] = [
                    (s.metadata.shard_offsets[0], s.metadata.shard_offsets[1], s.tensor.detach().cpu().clone())
                    for s in value.local_shards()
                ]
            else:
                tables[parts[-2]] = [(0, 0, value.detach().cpu().clone())]
        elif isinstance(value, ShardedTensor):  # zch's remapping buffers, sharded like their tables
            shards = [s.tensor.detach().cpu() for s in value.local_shards()]
            dense[key] = torch.cat(shards).clone() if shards else torch.empty(0)
        else:
            dense[key] = value.detach().cpu().clone()
    return {"tables": tables, "dense": dense}


def probe_batch(
    rank: int,
    world_size: int,
    device: torch.device,
    table_rows: Any = TABLE_ROWS,
    histories: Sequence[str] = (),
    zch_seed: int | None = None,
):
    """This rank's share of the probe rows: one id per feature (what the exported
    model takes), below every table's size, the same for every case; with
    ``histories`` (a sequence case's history feature) also its `probe_histories`.
    With ``zch_seed`` (--id_hashing zch's --hash_seed) the ids are the Parquet column's
    values, handed over as the loader does (`zch_probe_ids`)."""
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    dense, ids = probe_inputs(table_rows)
    if zch_seed is not None:
        ids = zch_probe_ids(ids, zch_seed)
    per_rank = PROBE_ROWS // world_size
    rows = slice(rank * per_rank, (rank + 1) * per_rank)
    dense, ids = dense[rows], ids[rows]
    keys = [f"cat_{i}" for i in range(len(TABLE_ROWS))]
    values, lengths = [ids.t().reshape(-1)], [torch.ones(ids.numel(), dtype=torch.int32)]
    for _ in histories:  # each a history of SEQUENCE_ITEM, in the batch's key order
        history_ids, counts = probe_histories(table_rows[keys.index(SEQUENCE_ITEM)])
        start = int(counts[: rows.start].sum())
        values.append(history_ids[start : start + int(counts[rows].sum())])
        lengths.append(counts[rows].to(torch.int32))
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=keys + list(histories), values=torch.cat(values), lengths=torch.cat(lengths)
    )
    return Batch(dense_features=dense, sparse_features=kjt, labels=torch.zeros(per_rank)).to(device)


def zch_probe_ids(values: torch.Tensor, seed: int) -> torch.Tensor:
    """The ids a zch model's lookup takes for integer column values: their hash's top
    bits (`data.parquet.id_hashing.zch_ids`), as the Parquet loader hands them over. The
    probe's values are the data's own (below the tables' sizes): some admitted, some not."""
    from data.parquet.id_hashing import integer_keys, zch_ids

    flat = values.reshape(-1).numpy().astype("int64")
    return torch.from_numpy(zch_ids(integer_keys(flat), seed)).reshape(values.shape)


def _outcome(trainer: Any, result: Any, log_path: str) -> dict[str, Any]:
    """What a finished run left: its losses, metrics, this rank's weights and (rank 0,
    which writes the log) the steps its log shows."""
    records = read_run_log(log_path) if trainer.env.is_main else []
    steps = logged_steps(records) if trainer.env.is_main else None
    # The final weights' test figures: the best checkpoint a run also tests depends on the
    # checkpoints its directory holds, which the resumed run's (one checkpoint) does not share.
    test = result.final_test if result.final_test is not None else result.test
    return {
        "losses": list(result.train_losses),
        "validation": result.validation,
        "test": test,
        "records_per_sec": result.records_per_sec,
        "steps": steps,
        # --id_hashing zch: the ids its log's `zch` records show evicted (over every rank).
        "zch_evicted": sum(f["evicted"] for r in records if r["event"] == "zch" for f in r["features"].values()),
        **local_weights(trainer.model),
    }


def _eager_probabilities(trainer: Any) -> torch.Tensor:
    """The trained sharded model's probabilities on this rank's probe rows (fp32)."""
    pipeline = trainer.train_pipeline
    if hasattr(pipeline, "detach"):
        pipeline.detach()
    trainer.model.eval()
    with torch.no_grad(), tf32_off():
        _, (_, logits, _) = trainer.model(
            probe_batch(
                trainer.env.rank,
                trainer.env.world_size,
                trainer.env.device,
                trainer.config.model.num_embeddings_per_feature,
                [history for history, _ in trainer.config.model.sequences],
                trainer.config.data.hash_seed if getattr(trainer.config.data, "id_hashing", None) == "zch" else None,
            )
        )
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
    trainer = Trainer(
        parse_config(
            argv + ["--checkpoint_dir", whole, "--checkpoint_every_n_steps", str(STOP), "--log_path", log],
            "matrix",
            "matrix",
        ),
        env,
    )
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
        trainer = Trainer(
            parse_config(argv + ["--checkpoint_dir", cut, "--resume", "--log_path", log], "matrix", "matrix"), env
        )
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
def _deadline(seconds: float | None) -> Iterator[None]:
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
            last_line = str(e).strip().splitlines()[-1][:300] if str(e).strip() else ""
            outcome = {"error": f"{type(e).__name__}: {last_line}"}
            if isinstance(e, JobTimeout) and dist.is_initialized():
                dist.destroy_process_group()  # the next job starts its own group
        outcome["seconds"] = time.perf_counter() - start
        results.append({"key": job["key"], **outcome})
    if dist.is_initialized():
        dist.destroy_process_group()
    return results


# run_jobs over a group of jobs on N local ranks: {rank: run_jobs' list}.
Launcher = Callable[[Callable, list[dict[str, Any]], int], dict[int, Any]]


def local_launcher(fn: Callable, jobs: list[dict[str, Any]], world_size: int) -> dict[int, Any]:
    """The launcher of a matrix run on this host: torch elastic over local ranks."""
    from harness.launch import launch

    return launch(fn, jobs, nproc=world_size)


class JobPlan:
    """The jobs of one matrix run, each run once however many checks need it, and what
    their ranks returned ({key: [each rank's outcome]}).

    Jobs run in one launch per device and world size (`launch`), every rank running
    `run_jobs` over the group; ``case_argv(case, data_dir, device)`` gives a job's flags.
    """

    def __init__(
        self,
        data_dir: str,
        work_dir: str,
        case_argv: Callable[[Case, str, str], list[str]],
        job_timeout: float | None = None,
    ):
        self.data_dir, self.work_dir, self.case_argv, self.job_timeout = data_dir, work_dir, case_argv, job_timeout
        self.jobs: dict[str, dict[str, Any]] = {}
        self.outcomes: dict[str, list[dict[str, Any]]] = {}

    def add(self, kind: str, case: Case, device: str, resume: bool = False) -> str:
        """The key of the job that trains (``kind`` train; with ``resume``, also resumed
        from step STOP) or refuses (``kind`` refusal) ``case`` on ``device``; added once."""
        key = f"{kind}:{device}:{case_name(case)}"
        if key not in self.jobs:
            self.jobs[key] = {
                "kind": kind,
                "key": key,
                "argv": self.case_argv(case, self.data_dir, device),
                "device": device,
                "world_size": case["world_size"],
                "dir": os.path.join(self.work_dir, f"run{len(self.jobs)}"),
                "resume": resume,
                "timeout_s": self.job_timeout,
            }
        self.jobs[key]["resume"] |= resume
        return key

    def launch(self, launcher: Launcher, device: str) -> None:
        """Runs the jobs of ``device``, one launch per world size (smallest first), and
        records their outcomes."""
        groups: dict[int, list[dict[str, Any]]] = {}
        for job in self.jobs.values():
            if job["device"] == device:
                groups.setdefault(job["world_size"], []).append(job)
        for world_size in sorted(groups):
            per_rank = launcher(run_jobs, groups[world_size], world_size)
            for rank in sorted(per_rank):
                for result in per_rank[rank]:
                    self.outcomes.setdefault(result["key"], []).append(result)
