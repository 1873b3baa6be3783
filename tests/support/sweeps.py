"""Helpers of the sweep tests (local and Slurm): a tiny sweep file, running
``python -m sweeps`` as a user does, and checking a results row against its run's log."""

import csv
import os
import subprocess
import sys

import pytest
import yaml

from harness.launch import REPO, eval_record, read_log
from tests.support.torchx_cli import BIN

TINY_FLAGS = {
    "batch_size": 256,
    "embedding_dim": 8,
    "dense_arch_layer_sizes": [16, 8],
    "over_arch_layer_sizes": [16, 1],
    "optimizer": "adagrad",
    "max_table_rows": 100,
    "limit_train_batches": 6,
    "limit_val_batches": 1,
    "limit_test_batches": 1,
}


def sweeps(args, timeout=600, on_host=()):
    """`python -m sweeps ARGS` from the repository root, as a user runs it (on a host of
    the multi-host cluster with ``on_host``: ``[ON_HOST, HOST]``)."""
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run(
        [*on_host, sys.executable, "-m", "sweeps", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sweeps_in_process(capsys, args):
    """(exit code, stdout, stderr) of ``sweeps.cli.main(args)`` in this process (no
    launch: checks and dry runs)."""
    from sweeps.cli import main

    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write_sweep(path, **keys):
    document = {
        "name": "tiny",
        "script": "dlrm_main.py",
        "scheduler": "local_cwd",
        "scheduler_args": {},
        "nnodes": 1,
        "nproc_per_node": 2,
        "output_dir": str(path.parent / "out"),
        "flags": dict(TINY_FLAGS),
        "grid": {"learning_rate": [0.05, 0.1]},
    }
    document.update(keys)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return str(path)


def read_results(out):
    """{run name: row} of the sweep's results.csv."""
    with open(os.path.join(out, "results.csv")) as f:
        return {row["run"]: row for row in csv.DictReader(f)}


def assert_row_matches_log(row, log_path):
    """A succeeded run of a ``TINY_FLAGS`` sweep over ``learning_rate`` on 2 ranks: its
    results row says what its own JSON-lines log says."""
    log = read_log(log_path)
    config = next(r for r in log if r["event"] == "config")
    summary = [r for r in log if r["event"] == "summary"][-1]
    learning_rate = row["run"].split("=")[1]
    assert row["state"] == "succeeded"
    assert config["optim"]["learning_rate"] == float(learning_rate)
    sizes = config["model"]["num_embeddings_per_feature"]
    assert max(sizes) == 100  # --max_table_rows 100
    assert float(row["table_gib"]) == pytest.approx(sum(sizes) * 8 * 4 / 2**30)
    assert float(row["planner_gib"]) > float(row["table_gib"])  # plus optimizer state and buffers
    plan_memory = next(r for r in log if r["event"] == "plan_memory")
    largest = max(range(2), key=lambda rank: plan_memory["estimated_bytes"][rank])
    assert float(row["planned_rank_gib"]) == plan_memory["estimated_bytes"][largest] / 2**30
    assert float(row["built_rank_gib"]) == plan_memory["built_bytes"][largest] / 2**30
    assert (int(row["ranks"]), int(row["local_batch_size"]), int(row["global_batch_size"])) == (2, 256, 512)
    # The AUROCs are of the model the run delivers: its last test's (the one export takes
    # when the run saved checkpoints), and the validation of that same step.
    test = eval_record(log, "test")
    assert summary["test_model"] == {"model": test["model"], "step": test["step"], "exported": test["exported"]}
    assert row["model"] == f"{test['model']}, step {test['step']}" + (
        ", the one export takes" if test["exported"] else ""
    )
    assert (
        float(row["val_auroc"])
        == [r for r in log if r["event"] == "eval" and r["stage"] == "validation" and r["step"] == test["step"]][-1][
            "auroc"
        ]
    )
    assert float(row["test_auroc"]) == test["auroc"]
    assert float(row["test_log_loss"]) == eval_record(log, "test")["log_loss"]
    assert float(row["records_per_sec"]) == summary["records_per_sec"]
    assert float(row["train_seconds"]) == summary["train_seconds"]
    assert int(row["peak_memory_bytes"]) == max(summary["peak_memory_bytes"])
    assert row["flags"] == f"--learning_rate {learning_rate}"
