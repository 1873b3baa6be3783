"""bench/gpu_check.py without a GPU: its case list, references and tolerances (static),
its parsing of NCCL's output, its machinery on gloo (`--device cpu`), and the process
group's restart within a worker after a job refused with the group up."""

import contextlib
import faulthandler
import io
import itertools
import math
import os
import sys
import time

import pytest
import torch

from bench import gpu_check
from common.errors import BadInput
from harness import matrix
from harness.launch import launch, run_script
from training.flags import parse_config

SPEC = gpu_check.gpu_matrix(num_gpus=8)
CASES = matrix.covering_cases(SPEC, 2)
# What the GPU check adds to what it checked before issue 23: each of these choices is
# trained in some case.
NEW_CHOICES = {
    "sharding": ("data_parallel", matrix.MIXED),
    "precision": ("fp16",),
    "multi_hot": (True,),
    "interaction": ("dcn", "projection"),
    "dense_optimizer": ("adagrad", "adam"),
    "epochs": (2,),
    "validation_within_epoch": (True,),
    "world_size": (1, 2, 8),
    "pipeline": ("semi_sync",),
    "sequence": ("din", "transformer"),
}


def test_cases_cover_every_pair_and_every_new_choice():
    assert set(matrix.DIMENSIONS) <= set(SPEC.dimensions), "a dimension of the CPU matrix is missing"
    for dimension, choices in NEW_CHOICES.items():
        for choice in choices:
            assert any(case[dimension] == choice for case in CASES), (dimension, choice)
    assert all(SPEC.refusal_for(case) is None for case in CASES)
    for (d1, c1), (d2, c2) in itertools.combinations(SPEC.dimensions.items(), 2):
        for v1, v2 in itertools.product(c1, c2):
            if not SPEC.forbidden({d1: v1, d2: v2}):
                assert any(case[d1] == v1 and case[d2] == v2 for case in CASES), (d1, v1, d2, v2)


def test_every_case_has_a_cpu_reference_or_a_semi_sync_one_and_a_tolerance_with_its_reason():
    for case in CASES:
        cpu, placement = gpu_check.cpu_reference(case), gpu_check.placement_reference(case, SPEC)
        if case["pipeline"] == "semi_sync":
            # No synchronous run reproduces semi_sync from batch 1: another placement of it does.
            assert cpu is None and placement is not None and placement["pipeline"] == "semi_sync"
            assert any(placement[d] != case[d] for d in ("sharding", "world_size", "compute_kernel")), case
        else:
            assert cpu == {
                **case,
                "pipeline": "sparse_dist",
                "compute_kernel": "fused",
                "sharding": "table_wise",
                "world_size": 1,
                "allow_tf32": False,
                # A Parquet case's reference reads its ranks' batches (--epoch_shares).
                **({"epoch_shares": case["world_size"]} if matrix.cases.is_parquet(case) else {}),
            }
            assert placement is None or (placement["pipeline"], placement["compute_kernel"]) == ("sparse_dist", "fused")
        assert placement is None or SPEC.refusal_for(placement) is None, case  # no reference is a refused run
        tolerance, why = gpu_check.reference_tolerance(case)
        assert 0 < tolerance <= 1e-2 and why


def test_tolerance_per_precision():
    """fp32 at GPU summation-order precision; TF32, fp16 tables and bf16 autocast each
    their own, larger, with the reason."""
    fp32 = next(
        c
        for c in CASES
        if not c["amp"] and not c["allow_tf32"] and c["precision"] == "fp32" and c["optimizer"] != "rowwise_adagrad"
    )
    assert gpu_check.reference_tolerance(fp32)[0] == 1e-5
    tolerance, why = gpu_check.reference_tolerance({**fp32, "allow_tf32": True})
    assert tolerance == gpu_check.TF32_TOLERANCE and "TF32" in why
    tolerance, why = gpu_check.reference_tolerance({**fp32, "precision": "fp16"})
    assert tolerance == matrix.STEPS * gpu_check.FP16_STEP and "stochastically" in why
    tolerance, why = gpu_check.reference_tolerance({**fp32, "amp": True, "allow_tf32": True})
    assert tolerance == 1e-2 and "bf16" in why


def test_fp16_step_is_the_spacing_of_fp16_values():
    """Against fp16 itself: the next fp16 value above each weight is one step away."""
    weights = torch.tensor([3e-7, 7e-5, 2.0**-14, 0.1, 0.158, 0.25, 0.3, -0.6, 1.0, 900.0]).half()
    above = torch.nextafter(weights.abs(), torch.tensor(float("inf"), dtype=torch.half))
    assert torch.equal(gpu_check.fp16_step(weights.float()), (above - weights.abs()).float())
    assert gpu_check.fp16_step(torch.tensor(1 / math.sqrt(min(matrix.TABLE_ROWS)))).item() == gpu_check.FP16_STEP


def test_world_sizes_scale_to_the_gpus_present():
    assert gpu_check.world_sizes(1) == (1,)
    assert gpu_check.world_sizes(2) == (1, 2)
    assert gpu_check.world_sizes(8) == (1, 2, 8)
    assert gpu_check.world_sizes(6) == (1, 2, 4)  # 6 ranks cannot split the global batch of 64


def test_cases_and_references_are_command_lines_the_flags_accept(synthetic_dir, capsys):
    """Each trained case and its references parse into their choices (semi_sync from
    batch 1); each refusal is refused by the flags or, for the plan's kernels, later.
    Over the session's data: a Parquet case's table is a copy of it."""
    data = synthetic_dir
    for case in CASES:
        runs = (
            (case, "cuda"),
            (gpu_check.cpu_reference(case), "cpu"),
            (gpu_check.placement_reference(case, SPEC), "cuda"),
        )
        for run, device in ((run, device) for run, device in runs if run is not None):
            config = parse_config(gpu_check.case_argv(run, data, device), "gpu_check", "")
            assert (config.pipeline, config.amp, config.allow_tf32) == (run["pipeline"], run["amp"], run["allow_tf32"])
            kernels = config.sharding_constraints.compute_kernels
            assert kernels["*"] == ("dense" if run["sharding"] == "data_parallel" else run["compute_kernel"])
            assert config.semi_sync_start_batch == 1 or run["pipeline"] != "semi_sync"
    for case in gpu_check.refusal_cases(SPEC):
        refusal = SPEC.refusal_for(case)
        assert refusal is not None and case["world_size"] == 8
        try:
            parse_config(gpu_check.case_argv(case, data, "cuda"), "gpu_check", "")
        except SystemExit as e:
            assert e.code == 2 and refusal.message in capsys.readouterr().err


def test_refusal_is_matched_on_the_error_line_among_library_output():
    """Rank 0's stderr on CUDA holds NCCL's and the planner's lines besides the refusal."""
    case = next(c for c in gpu_check.refusal_cases(SPEC) if c["pipeline"] == "semi_sync")
    line = "dlrm_main.py: error: --pipeline semi_sync runs forward(i+1) before ..."
    noisy = [
        {"code": 2, "seconds": 1.0, "stderr": f"NCCL INFO Using network Socket\nplanner: 3 tables\n{line}\n"},
        {"code": 2, "seconds": 1.0, "stderr": "UserWarning: something from torchrec\n"},
    ]
    assert matrix.check_refusal(SPEC, case, noisy).passed
    two = [noisy[0], {**noisy[1], "stderr": line}]
    assert not matrix.check_refusal(SPEC, case, two).passed  # only rank 0 reports
    wrong = [{**noisy[0], "stderr": "dlrm_main.py: error: something else\n"}, noisy[1]]
    assert not matrix.check_refusal(SPEC, case, wrong).passed


def test_nccl_network_read_from_nccl_debug_output():
    socket = (
        "host:1:1 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so.\n"
        "host:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n"
        "host:1:1 [0] NCCL INFO Using network Socket\n"
    )
    assert gpu_check.nccl_network(socket) == "Socket (NET/Plugin: Could not find: libnccl-net.so.)"
    efa = (
        "host:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v9)\n"
        "host:1:1 [0] NCCL INFO NET/OFI Selected provider is efa\n"
        "host:1:1 [0] NCCL INFO Using network Libfabric\n"
    )
    assert gpu_check.nccl_network(efa).startswith("Libfabric (NET/Plugin: Loaded net plugin")
    assert gpu_check.nccl_network("").startswith("unknown")


def test_list_prints_the_cases_without_cuda():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert gpu_check.main(["--list", "--gpus", "8"]) == 0
    lines = out.getvalue().splitlines()
    assert lines[-1] == f"{len(CASES)} cases, {len(gpu_check.refusal_cases(SPEC))} refusals on world sizes (1, 2, 8)"
    assert any("refused: --pipeline semi_sync" in line for line in lines)
    assert all("tolerance" in line or "refused" in line for line in lines[:-1])


@pytest.mark.slow
@pytest.mark.gpu_host
def test_gpu_check_says_there_is_no_gpu():
    result = run_script(["-m", "bench.gpu_check"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("gpu_check: no CUDA device on this host"), result.stdout


HANG_LIMIT_S = 120  # a rank still waiting then is stuck on the dead group's keys


def refused_then_trained(jobs):
    """One rank: a job refused after planning (the group was up), then a training job,
    in the same process; rank 0 starts the second group last, so rank 1 reads its
    store keys first."""
    faulthandler.dump_traceback_later(HANG_LIMIT_S, exit=True)
    try:
        first = matrix.run_jobs(jobs[:1])
        if os.environ["RANK"] == "0":
            time.sleep(3)
        return first + matrix.run_jobs(jobs[1:])
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.mark.slow
@pytest.mark.gpu_host
def test_job_after_a_refusal_with_the_group_up_runs_in_the_same_workers(synthetic_dir, tmp_path):
    """Before each group start had store keys of its own, rank 1 read rank 0's address
    of the destroyed group and the training job never started (hung)."""
    case = {
        "optimizer": "rowwise_adagrad",
        "dense_optimizer": "sgd",
        "sharding": "table_wise",
        "precision": "fp32",
        "pipeline": "sparse_dist",
        "interaction": "original",
        "multi_hot": False,
        "world_size": 2,
        "amp": False,
    }
    argv = matrix.case_argv(case, synthetic_dir, "cpu")
    # FBGEMM's CPU kernels ignore weight decay: refused once the plan shows fused tables.
    jobs = [
        {
            "kind": "refusal",
            "key": "refused",
            "argv": argv + ["--embedding_weight_decay", "0.01"],
            "device": "cpu",
            "dir": str(tmp_path / "refused"),
            "resume": False,
        },
        {
            "kind": "train",
            "key": "trained",
            "argv": argv,
            "device": "cpu",
            "dir": str(tmp_path / "trained"),
            "resume": False,
        },
    ]
    per_rank = launch(refused_then_trained, jobs, nproc=2)
    refused = [per_rank[r][0] for r in (0, 1)]
    assert [o["code"] for o in refused] == [2, 2], refused
    assert "error: --embedding_weight_decay" in refused[0]["stderr"] and ": error: " not in refused[1]["stderr"]
    trained = [per_rank[r][1] for r in (0, 1)]
    assert all("error" not in o for o in trained), trained
    assert len(trained[0]["uninterrupted"]["losses"]) == matrix.STEPS


@pytest.mark.slow
@pytest.mark.gpu_host
def test_device_cpu_runs_cases_against_the_cpu_reference(synthetic_dir, tmp_path):
    """The check's machinery on gloo: a two-rank case of the base pipeline with its CPU
    reference (a second launch, one rank) and its placement reference, resume and
    export, and a refusal in the same workers; the table. With them, in the same
    launches, a DIN and a transformer case whose item table's EmbeddingCollection is
    split over the two ranks (row-wise, column-wise): the history cases a GPU session
    runs (`gpu_session`'s gpu_check_sequences), proven on gloo before a GPU is lent."""
    spec = gpu_check.gpu_matrix(2, "cpu")
    case = next(
        c
        for c in matrix.covering_cases(spec, 2)
        if c["world_size"] == 2 and c["pipeline"] == "base" and c["sequence"] == matrix.NO_SEQUENCE
    )
    # On the sparse_dist pipeline (each its own placement reference): one CPU reference
    # each; validated at the epoch's end (inside it, 2 ranks are refused).
    histories = [
        {
            **case,
            "sequence": s,
            "sharding": sharding,
            "data_source": "parquet",
            "pipeline": "sparse_dist",
            "validation_within_epoch": False,
        }
        for s, sharding in (("din", "row_wise"), ("transformer", "column_wise"))
    ]
    assert all(spec.refusal_for(c) is None for c in histories)
    refusals = gpu_check.refusal_cases(spec)[:1]
    made = []
    results = gpu_check.evaluate(
        spec,
        [case, *histories],
        refusals,
        synthetic_dir,
        str(tmp_path),
        lambda fn, jobs, nproc: launch(fn, jobs, nproc=nproc),
        made.append,
        job_timeout=600,
    )
    assert sorted(made, key=id) == sorted(results, key=id)  # every verdict handed over as it was made
    table = matrix.format_table(spec, results)
    assert all(r.passed for r in results), table
    checks = results[1].checks
    assert set(checks) == {"=cpu", "=placement", "resume=uninterrupted", "export=eager"}, table
    assert checks["=cpu"].startswith("ok") and checks["=placement"].startswith("ok"), table
    for result in results[2:]:
        assert result.checks["=cpu"].startswith("ok") and result.checks["export=eager"].startswith("ok"), table
        assert result.checks["resume=uninterrupted"] == "ok bit-exact", table
    assert table.splitlines()[-1] == "4 of 4 cases passed"


def test_one_gpu_does_not_probe_nccl():
    assert not gpu_check.probes_nccl(gpu_check.gpu_matrix(1))
    assert gpu_check.probes_nccl(gpu_check.gpu_matrix(2)) and gpu_check.probes_nccl(SPEC)


def test_only_selects_by_pieces_globs_and_lists():
    name = "rowwise_adagrad/dense-sgd/table_wise/fp16/base/dcn/one-hot/ws1/fused_uvm_caching"
    assert matrix.matches_only(name, "") and matrix.matches_only(name, "/fp16/")
    assert matrix.matches_only(name, "rowwise_adagrad/*/fp16/*fused_uvm_caching*")
    assert not matrix.matches_only(name, "rowwise_adagrad/*/fp32/*")
    assert matrix.matches_only(name, "/prefetch/,/base/") and not matrix.matches_only(name, "/prefetch/,/semi_sync/")


def test_only_matching_nothing_is_one_line_and_exit_2(capsys):
    assert gpu_check.main(["--list", "--gpus", "1", "--only", "no-such-case"]) == 2
    assert capsys.readouterr().err.strip() == (
        "python -m bench.gpu_check: error: --only no-such-case: no case of "
        "strength 2 on cuda matches (--list shows them)"
    )


def test_verdict_lines_are_read_back_and_a_cut_off_line_is_left_out(tmp_path):
    path = str(tmp_path / "verdicts.jsonl")
    case = CASES[0]
    passed = matrix.CaseResult(case, checks={"=cpu": "ok 0 <= 1e-05"}, seconds=1.5, records_per_sec=100.0)
    failed = matrix.CaseResult(case, seconds=2.0)
    failed.fail("=placement", "3e-3 > 1e-05")
    for result in (passed, failed):
        gpu_check.append_line(path, gpu_check.verdict_record(result))
    with open(path, "a") as f:
        f.write('{"version": 1, "case": "cut')  # the run was killed while writing
    verdicts = gpu_check.read_verdicts(path)
    assert [(v["case"], v["passed"], v["checks"]) for v in verdicts] == [
        (matrix.case_name(case), True, {"=cpu": "ok 0 <= 1e-05"}),
        (matrix.case_name(case), False, {"=placement": "FAIL 3e-3 > 1e-05"}),
    ]
    with open(path, "a") as f:
        f.write('x"}\n')  # a whole line now, without its fields
    with pytest.raises(BadInput, match=r"verdicts.jsonl:3: choices is missing"):
        gpu_check.read_verdicts(path)
    newer = str(tmp_path / "newer.jsonl")
    with open(newer, "w") as f:
        f.write('{"version": 2, "case": "x"}\n')
    with pytest.raises(BadInput, match="newer.jsonl:1: version is 2, newer than this code reads"):
        gpu_check.read_verdicts(newer)


@pytest.mark.slow
@pytest.mark.gpu_host
def test_a_job_past_its_timeout_is_recorded_and_the_next_job_runs(synthetic_dir, tmp_path):
    """--job_timeout: a training job stopped mid-way is that job's error; the worker
    goes on with the next job (on a new process group)."""
    case = {
        "optimizer": "sgd",
        "dense_optimizer": "sgd",
        "sharding": "table_wise",
        "precision": "fp32",
        "pipeline": "sparse_dist",
        "interaction": "original",
        "multi_hot": False,
        "world_size": 1,
        "amp": False,
    }
    argv = matrix.case_argv(case, synthetic_dir, "cpu")
    jobs = [
        {
            "kind": "train",
            "key": "cut",
            # Far more epochs than any machine trains in 0.5 s: the cut is certain (the
            # case's own 4 steps ended inside 0.5 s on CI's machine).
            "argv": [*argv, "--epochs", "100000"],
            "device": "cpu",
            "dir": str(tmp_path / "cut"),
            "resume": False,
            "timeout_s": 0.5,
        },
        {
            "kind": "train",
            "key": "whole",
            "argv": argv,
            "device": "cpu",
            "dir": str(tmp_path / "whole"),
            "resume": False,
            "timeout_s": 600,
        },
    ]
    [cut, whole] = launch(matrix.run_jobs, jobs, nproc=1)[0]
    assert cut["error"] == "JobTimeout: timed out after 0.5 s" and 0.5 <= cut["seconds"] < 30
    assert "error" not in whole and len(whole["uninterrupted"]["losses"]) == matrix.STEPS


def test_a_deadline_never_cuts_an_import(tmp_path, monkeypatch):
    """A deadline that falls while a module is being imported waits for the import to
    finish: the module is whole in sys.modules, and the job is cut right after. (A job
    cut inside matplotlib's import left the next job a matplotlib without its functions.)"""
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(0.3)\nDONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_to_import", raising=False)
    with pytest.raises(matrix.JobTimeout):
        with matrix.ranks._deadline(0.05):
            import slow_to_import  # noqa: F401

            time.sleep(5)  # where the cut lands
    assert sys.modules["slow_to_import"].DONE is True
