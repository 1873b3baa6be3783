"""The matrix's checks: each case's runs against its reference, resume against the
uninterrupted run, export against eager, a refusal against its one line; the table."""

import contextlib
import io
import math
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.matrix.cases import (
    ADAPTIVE,
    EMBEDDING_DIM,
    MIXED,
    SEQUENCE_ITEM,
    STEPS,
    STOP,
    TABLE_ROWS,
    Case,
    MatrixSpec,
    epochs,
    expected_steps,
    is_zch,
    probe_histories,
    probe_inputs,
    resumed_steps,
)
from sharding_plans.constraints import COLUMN_SHARDING_TYPES


def sharded_tolerance(case: Case, device: str) -> tuple[float, str]:
    """(absolute tolerance on losses and weights, why) for check (a)."""
    if case["amp"]:
        return 1e-2, (
            "bf16 autocast: each rank's matmuls round their partial results to bf16 "
            "(8 bits of mantissa) before the fp32 all-reduce, the reference rounds whole-batch ones; "
            "the adaptive optimizers pass a gradient difference d on as up to lr * d / eps = 5 d"
        )
    if (
        case["optimizer"] == "rowwise_adagrad"
        and case["world_size"] > 1
        and case["sharding"] in COLUMN_SHARDING_TYPES + (MIXED,)
    ):
        return 5e-3, (
            "row-wise Adagrad keeps one accumulator per row of each column shard (the mean "
            "of that shard's squared gradients), the reference one per whole row: a different "
            "step size, the same direction"
        )
    if case["precision"] == "fp16":
        return 2.5e-4, (
            "fp16 tables: an update rounds each weight to fp16, whose step is 1.2e-4 at the "
            "weights' magnitude here, so a summation-order difference can flip a rounding"
        )
    if device == "cuda":
        return 1e-5, "GPU kernels may sum in another order from run to run (atomic adds)"
    if case["optimizer"] in ADAPTIVE or case["dense_optimizer"] in ADAPTIVE:
        return 1e-5, (
            "adaptive optimizers divide by the root of the summed squared gradients: "
            "summation-order differences of 1e-7 grow by up to 1/sqrt(sum) on the first steps"
        )
    return 1e-6, "same arithmetic up to the summation order of the all-reduce and the pooling"


def assemble_table(per_rank: Sequence[dict[str, Any]], table: str, rows: int, dim: int) -> torch.Tensor:
    """A whole table (float32) from every rank's pieces; replicas must agree exactly."""
    full = torch.full((rows, dim), float("nan"))
    for weights in per_rank:
        for row, col, piece in weights["tables"].get(table, []):
            target = full[row : row + piece.shape[0], col : col + piece.shape[1]]
            if not torch.isnan(target).any():
                assert torch.equal(target, piece.float()), f"{table}: replicas differ"
            target.copy_(piece.float())
    assert not torch.isnan(full).any(), f"{table}: the pieces do not cover the table"
    return full


def _rows_of(per_rank: Sequence[dict[str, Any]], table: str) -> int:
    """The rows of a table its ranks' pieces cover (the last piece's end)."""
    return max((row + piece.shape[0] for w in per_rank for row, _, piece in w["tables"].get(table, [])), default=0)


def max_difference(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], tables: bool = True) -> tuple[float, str]:
    """Largest absolute difference between two runs' losses and assembled weights
    (each given as its ranks' outcomes; the tables' only with ``tables``), and where it is."""
    worst = (0.0, "")
    la, lb = a[0]["losses"], b[0]["losses"]
    if len(la) != len(lb):
        return math.inf, f"{len(la)} losses vs {len(lb)}"
    for step, (x, y) in enumerate(zip(la, lb)):
        worst = max(worst, (abs(x - y), f"loss of step {step + 1}"))
    for i, _ in enumerate(TABLE_ROWS if tables else ()):
        table = f"t_cat_{i}"
        rows = _rows_of(a, table)  # TABLE_ROWS, or fewer: a vocabulary case's tables are its vocabulary's
        if _rows_of(b, table) != rows:
            return math.inf, f"{table}: {rows} rows vs {_rows_of(b, table)}"
        diff = assemble_table(a, table, rows, EMBEDDING_DIM) - assemble_table(b, table, rows, EMBEDDING_DIM)
        worst = max(worst, (diff.abs().max().item(), table))
    for key in a[0]["dense"]:
        diff = (a[0]["dense"][key].float() - b[0]["dense"][key].float()).abs().max().item()
        worst = max(worst, (diff, key))
    return worst


def identical(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], steps_from: int) -> str | None:
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
    from checkpoints.directory import newest_checkpoint
    from serving.export import FP32_FILE, export_model
    from serving.model_files import load_model_file, read_manifest
    from serving.model_inputs import read_inputs

    with contextlib.redirect_stderr(io.StringIO()):
        export_model(newest_checkpoint(checkpoint_dir), out_dir, [])
    manifest = read_manifest(out_dir)
    program = load_model_file(out_dir, FP32_FILE, "torch.export", manifest)  # as predict loads it
    inputs = read_inputs(out_dir, manifest)
    if getattr(inputs.preprocessing, "zch_ids", None) is not None:
        with torch.no_grad():
            exported = program(*zch_program_inputs(out_dir, manifest, inputs))
        return (exported - eager).abs().max().item()
    dense, ids = probe_inputs(inputs.num_embeddings_per_feature)
    # A bag of varying length (a Parquet list column) has several places, -1 where empty.
    hotness = inputs.sparse_hotness
    ids = torch.cat(
        [
            torch.cat([ids[:, f : f + 1], torch.full((len(ids), h - 1), -1, dtype=ids.dtype)], dim=1)
            for f, h in enumerate(hotness)
        ],
        dim=1,
    )
    histories = []
    if inputs.histories:
        _check_quantized_refused(checkpoint_dir, out_dir)
        item = [f"cat_{i}" for i in range(len(hotness))].index(SEQUENCE_ITEM)
        values, lengths = probe_histories(inputs.num_embeddings_per_feature[item])
        histories = [values, lengths.unsqueeze(1)]  # (B, S): one history
    with torch.no_grad():
        exported = program(dense, ids, *histories)
    return (exported - eager).abs().max().item()


def zch_program_inputs(out_dir: str, manifest: Any, inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A zch model's program inputs for the probe rows, made as predict makes them: the
    rows as a Parquet table of the training columns (the id values themselves, a list of
    one where the column holds lists), through the export's Parquet layout, which maps
    each id through the id map (`data.parquet.zch_map`): an admitted id to its row, any
    other to its shard's default row. Asserts that both kinds are among the probe's ids,
    and that the layout counts the second kind as unseen."""
    import numpy as np
    import pyarrow as pa

    from serving.layouts import load_layout

    layout = load_layout(inputs, out_dir, manifest)
    dense, ids = probe_inputs(inputs.num_embeddings_per_feature)  # the data's own values, as eager's
    columns: dict[str, Any] = {n: pa.array(dense[:, i].numpy()) for i, n in enumerate(inputs.dense_feature_names)}
    for f, (name, kind) in enumerate(zip(inputs.sparse_feature_names, inputs.preprocessing.sparse_value_types)):
        values = pa.array(ids[:, f].numpy().astype(np.int64))
        lists = pa.ListArray.from_arrays(pa.array(np.arange(len(ids) + 1, dtype=np.int32)), values)
        columns[name] = lists if kind.endswith("_list") else values
    lines = layout.prepare_table(pa.table(columns), lambda row: f"probe row {row}", labelled=False)
    unseen = int(np.sum(lines.unseen))
    assert 0 < unseen < ids.numel(), f"{unseen} of the {ids.numel()} probe ids unseen: the probe needs both kinds"
    return torch.from_numpy(lines.dense), torch.from_numpy(lines.sparse)


def _check_quantized_refused(checkpoint_dir: str, out_dir: str) -> None:
    """A sequence model's programs are fp32 only: --quantize fp16,int8 is refused in one
    line naming the history, and nothing is written (AssertionError otherwise)."""
    from checkpoints.directory import newest_checkpoint
    from common.errors import BadInput
    from serving.export import export_model

    refused = out_dir + "-quantized"
    try:
        export_model(newest_checkpoint(checkpoint_dir), refused, ["fp16", "int8"])
    except BadInput as e:
        line = str(e)
        assert "history features" in line and "\n" not in line, f"quantized export refused with {line!r}"
        assert not os.path.exists(refused) or not os.listdir(refused), f"the refused export left {os.listdir(refused)}"
        return
    raise AssertionError("the quantized export of a sequence model was not refused")


EXPORT_TOLERANCE = 1e-6  # the same fp32 arithmetic; one id a bag, so pooling is exact


@dataclass
class CaseResult:
    """What one case checked: each check's verdict text, and whether all passed."""

    case: Case
    checks: dict[str, str] = field(default_factory=dict)
    passed: bool = True
    seconds: float = 0.0
    records_per_sec: float | None = None

    def fail(self, check: str, text: str) -> None:
        self.checks[check] = "FAIL " + text
        self.passed = False


def check_refusal(spec: MatrixSpec, case: Case, per_rank: list[dict[str, Any]]) -> CaseResult:
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


def check_case(
    spec: MatrixSpec,
    case: Case,
    per_rank: list[dict[str, Any]],
    reference: list[dict[str, Any]],
    export: "Future[float]",
) -> CaseResult:
    result = CaseResult(case, seconds=max(o["seconds"] for o in per_rank))
    for name, outcome in (("case", per_rank[0]), ("reference", reference[0])):
        if "error" in outcome:
            result.fail("ran", f"{name}: {outcome['error']}")
            return result
    whole = [o["uninterrupted"] for o in per_rank]
    result.records_per_sec = whole[0]["records_per_sec"]
    tolerance, why = sharded_tolerance(case, spec.device)
    diff, where = max_difference(whole, [o["uninterrupted"] for o in reference])
    text = f"{diff:.2g} <= {tolerance:g}" + (f" ({where})" if diff > 0 else "")
    if diff <= tolerance:
        result.checks["sharded=unsharded"] = "ok " + text
    else:
        result.fail("sharded=unsharded", text.replace("<=", ">") + f"; tolerance because {why}")
    resumed = [o["resumed"] for o in per_rank]
    mismatch = identical(whole, resumed, STOP) if resumed[0] else f"the run saved no step-{STOP} checkpoint"
    if mismatch is None:
        result.checks["resume=uninterrupted"] = "ok bit-exact"
    else:
        result.fail("resume=uninterrupted", mismatch)
    if is_zch(case):  # the resume must cross an eviction, the remapping's hardest change
        evicted = whole[0]["zch_evicted"]
        if evicted:
            result.checks["evicted"] = f"ok {evicted} ids"
        else:
            result.fail("evicted", "the run evicted no id: its resume checks no eviction")
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


def check_export(result: CaseResult, export: "Future[float] | None") -> None:
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
        rows.append(
            [str(r.case[d]) for d in spec.dimensions]
            + [
                "pass" if r.passed else "FAIL",
                f"{r.seconds:.1f}",
                rate,
                "; ".join(f"{k}: {v}" for k, v in r.checks.items()),
            ]
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header[:-1])]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header[:-1], widths)) + "  " + header[-1]]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1])
    passed = sum(r.passed for r in results)
    lines.append(f"{passed} of {len(results)} cases passed")
    return "\n".join(lines)


def export_pool() -> ProcessPoolExecutor:
    """Where exports run: two at a time, each in its own process (tracing is single-threaded)."""
    return ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn"))


def start_exports(
    pool: ProcessPoolExecutor, outcomes: dict[str, list[dict[str, Any]]], keys: Sequence[str], work_dir: str
) -> "dict[str, Future[float]]":
    """The pending `export_difference` of each training job in ``keys`` whose ranks all
    finished ({key: future}); a job that failed on a rank has none."""
    exports: dict[str, Future[float]] = {}
    for key in keys:
        per_rank = outcomes[key]
        if all("error" not in o for o in per_rank):
            exports[key] = pool.submit(
                export_difference,
                per_rank[0]["checkpoint_dir"],
                torch.cat([o["probe"] for o in per_rank]),
                os.path.join(work_dir, "exports", f"run{len(exports)}"),
            )
    return exports
