"""Training from Parquet on 2 ranks under torchrun: from a local Hive-partitioned
directory, and from the same table on a local S3 server (moto) with the same losses."""

import os
import re
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.launch import eval_record, read_log, run_script, step_losses
from tests.support.s3 import s3_serving

TINY = [
    "--embedding_dim",
    "8",
    "--dense_arch_layer_sizes",
    "16,8",
    "--over_arch_layer_sizes",
    "16,1",
    "--num_embeddings",
    "200",
    "--batch_size",
    "16",
    "--device",
    "cpu",
    "--time_column",
    "date",
    "--dense_columns",
    "I*",
    "--sparse_columns",
    "C1,C2,M1",
    "--limit_train_batches",
    "6",
]


def write_click_log(root: str) -> None:
    """4 days of 120 rows, 2 files a day of uneven row groups: string, int64 and list ids."""
    rng = np.random.default_rng(0)
    for day in range(4):
        for part, rows in enumerate((70, 50)):
            folder = os.path.join(root, f"date=2026-11-0{day + 1}")
            os.makedirs(folder, exist_ok=True)
            c1 = rng.integers(0, 30, rows)
            table = pa.table(
                {
                    "label": pa.array((c1 % 3 == 0).astype(np.int64)),  # learnable from C1
                    "I1": pa.array(rng.exponential(3, rows)),
                    "I2": pa.array([None if i % 7 == 0 else float(i) for i in range(rows)], pa.float64()),
                    "C1": pa.array([f"{v:x}" for v in c1]),
                    "C2": pa.array(rng.integers(0, 5 * 10**9, rows)),
                    "M1": pa.array(
                        [list(rng.integers(0, 10**6, rng.integers(0, 5))) for _ in range(rows)], pa.list_(pa.int64())
                    ),
                }
            )
            pq.write_table(table, os.path.join(folder, f"part-{part}.parquet"), row_group_size=(13, 50)[part])


def train(path: str, log: str) -> subprocess.CompletedProcess:
    return run_script(["dlrm_main.py", "--parquet_path", path, *TINY, "--log_path", log], torchrun_nproc=2, timeout=300)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("parquet")
    table = str(root / "clicks")
    write_click_log(table)
    log = str(root / "local.jsonl")
    proc = train(table, log)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return table, read_log(log), proc


@pytest.mark.slow
def test_two_ranks_train_and_test_on_the_last_day(local_run):
    _, records, proc = local_run
    losses = step_losses(records)
    assert len(losses) == 6 and all(np.isfinite(losses))
    assert eval_record(records, "test")  # the test split: the last day
    assert (
        "time ranges (date): train 2026-11-01 to before 2026-11-03, validation 2026-11-03 to before "
        "2026-11-04, test 2026-11-04 to before 2026-11-05" in proc.stdout
    )
    # Once per evaluation: each feature's distinct values and how many share a row.
    statistics = [r for r in records if r["event"] == "data_statistics"]
    assert [r["stage"] for r in statistics] == [r["stage"] for r in records if r["event"] == "eval"]
    c1 = statistics[-1]["id_collisions"]["C1"]
    assert 0 < c1["distinct"] <= 30 and c1["exact"] and 0 <= c1["colliding_fraction"] <= 1
    assert set(statistics[-1]["id_collisions"]) == {"C1", "C2", "M1"}
    assert "id collisions (share of a feature's distinct values" in proc.stdout


@pytest.mark.slow
def test_s3_table_trains_as_the_local_copy(local_run, tmp_path, monkeypatch):
    table, records, _ = local_run
    with s3_serving(table, monkeypatch, {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}) as port:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        log = str(tmp_path / "s3.jsonl")
        proc = train("s3://clicks/log", log)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert step_losses(read_log(log)) == step_losses(records)
        assert eval_record(read_log(log), "test")["auroc"] == eval_record(records, "test")["auroc"]


def _stopped_two_rank_run(table: str, tmp_path, capfd) -> tuple[list[str], str]:
    """Trains on ``table`` with 2 ranks, which must both exit 2: the error lines printed
    and the run log's path."""
    import dlrm_main
    from harness.launch import launch

    log = str(tmp_path / "log.jsonl")
    assert launch(dlrm_main.main, ["--parquet_path", table, *TINY, "--log_path", log]) == {0: 2, 1: 2}
    return [line for line in capfd.readouterr().err.splitlines() if "error:" in line], log


@pytest.mark.slow
def test_a_bad_value_mid_stream_stops_every_rank_at_the_same_batch(tmp_path, capfd):
    """A NaN in rank 1's rows of step 2: rank 1 alone reads them (each rank reads its
    own share of the epoch), the ranks agree on every batch over the feed's gloo group,
    so both stop there with exit 2 and the job prints one line naming file, row group,
    row and column (before, rank 1 alone failed and rank 0 lost its peer)."""
    table = str(tmp_path / "clicks")
    write_click_log(table)
    # The 240 training rows (days 1-2) in two shares of 120: rank 1 reads day 2, its
    # batch 2 the first file's rows 32-47 (row groups of 13: row 40 is in row group 3).
    path = os.path.join(table, "date=2026-11-02", "part-0.parquet")
    rows = pq.read_table(path)
    dense = rows.column("I1").to_numpy(zero_copy_only=False).copy()
    dense[40] = np.nan
    pq.write_table(rows.set_column(rows.schema.get_field_index("I1"), "I1", pa.array(dense)), path, row_group_size=13)
    errors, log = _stopped_two_rank_run(table, tmp_path, capfd)
    assert len(errors) == 1 and re.fullmatch(
        rf"dlrm_main.py: error: bad data, found at step \d \(epoch 0, training\): {re.escape(path)}: row group 3, "
        r"row 40, column I1: dense value nan is not finite \(batch 2 of the split\)",
        errors[0],
    ), errors
    assert len(step_losses(read_log(log))) <= 2  # nothing trained on batch 2 or after


@pytest.mark.slow
def test_a_footer_that_lies_stops_every_rank_at_the_same_batch(tmp_path, capfd):
    """Row group 3 of the first day's first file holds 13 rows and its footer (rewritten)
    says 23: before, the splits counted 23 and training read on into a NaN loss; now
    the rank reading it flags the batch, and both ranks stop there, exit 2, with one
    line naming the file and row group."""
    from tests.support.hostile import rewrite_row_group_rows

    table = str(tmp_path / "clicks")
    write_click_log(table)
    path = os.path.join(table, "date=2026-11-01", "part-0.parquet")
    rewrite_row_group_rows(path, 3, 23)
    errors, log = _stopped_two_rank_run(table, tmp_path, capfd)
    # Rank 0's share starts with this file; its batch 2 (rows 32-47) is the first to reach row 39.
    assert len(errors) == 1 and re.fullmatch(
        rf"dlrm_main.py: error: bad data, found at step \d \(epoch 0, training\): {re.escape(path)}: row group 3 "
        r"holds 13 rows, but the file's footer says 23 \(a corrupt or rewritten footer\) \(batch 2 of the split\)",
        errors[0],
    ), errors
    assert len(step_losses(read_log(log))) <= 2
