"""What a run prints: the start-up block, interval positions and ETAs, the summary's metrics."""

import dataclasses
import json
import time

import pytest

from data.batching.loaders import build_loaders
from training.distributed import resolve_env
from training.flags import parse_config, parse_config_and_source
from training.run_log import RunLog, StepClock, format_duration, format_metrics
from training.startup_report import StartupReport


def test_format_duration():
    assert [format_duration(s) for s in (0.4, 45, 185, 7620)] == ["0s", "45s", "3m05s", "2h07m"]


def test_step_clock_eta_counts_training_time_of_the_steps_run():
    clock = StepClock(total_steps=100)
    assert clock.tick(10, 10, 5.0) == ("step 10/100 | ETA 45s", 45.0)
    # A resumed run starts at step 50: its ETA comes from the steps it ran itself.
    resumed = StepClock(total_steps=100)
    assert resumed.tick(60, 10, 20.0) == ("step 60/100 | ETA 1m20s", 80.0)
    assert StepClock(5).tick(1, 1, 0.0) == ("step 1/5", None)


def test_format_metrics():
    values = {"auroc": 0.80123, "log_loss": 0.45, "ne": 0.8}
    assert format_metrics("test", values) == "test AUROC 0.8012, log loss 0.4500, NE 0.8000"
    assert format_metrics("test", None) == "test: none"


def test_startup_block_says_what_the_run_builds(capsys, tmp_path):
    config, source = parse_config_and_source(
        [
            "--num_embeddings",
            "1000",
            "--embedding_dim",
            "8",
            "--dense_arch_layer_sizes",
            "16,8",
            "--interaction_type",
            "dcn",
            "--dcn_num_layers",
            "2",
            "--dcn_low_rank_dim",
            "4",
            "--batch_size",
            "16",
            "--limit_train_batches",
            "7",
            "--epochs",
            "3",
            "--log_path",
            str(tmp_path / "run.jsonl"),
            "--checkpoint_dir",
            str(tmp_path / "ckpt"),
            "--checkpoint_every_n_steps",
            "5",
        ],
        "dlrm_main.py",
        "",
    )
    env = resolve_env("cpu")
    report = StartupReport(config, env, source)
    before = report.before_setup(None)
    assert before == [
        "starting: --mode train",
        "model: DCNv2 (dcn interaction) | bottom MLP 13-16-8 | 2 cross layers of rank 4 | top MLP 512-512-256-1",
        "tables: 26 | 26,000 rows x 8 | 0.79 MiB of fp32 weights",
        "data: random data | rows: train 16,000, validation 1,600, test 1,600 | batch 16 per rank",
        "ranks: 1 (1 on this host) | device cpu (gloo) | precision fp32 MLPs, fp32 tables | pipeline sparse_dist",
        f"outputs: JSON log {tmp_path / 'run.jsonl'} | checkpoints {tmp_path / 'ckpt'} (every 5 steps) | "
        "TensorBoard none",
    ]
    loaders = build_loaders(config.data, None, config.model.num_embeddings_per_feature, 0, 1)
    plan = {
        f"t_cat_{i}": {
            "sharding_type": "table_wise" if i % 2 else "data_parallel",
            "compute_kernel": "fused" if i % 2 else "dense",
            "shards": [],
        }
        for i in range(26)
    }
    after = report.after_setup(plan, loaders)
    assert after == [
        "sharding: 13 data_parallel/dense, 13 table_wise/fused",
        "steps per epoch: train 7, validation 100, test 100 | 3 epochs: 21 training steps",
    ]
    assert capsys.readouterr().out.splitlines() == before + after
    assert report.facts["total_steps"] == 21 and report.facts["table_bytes"] == 26_000 * 8 * 4


def test_rolling_window_metrics_go_to_tensorboard_over_the_window(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = RunLog(True, str(tmp_path / "log.jsonl"), str(tmp_path / "tb"), progress=False)
    for window, auroc in ((1, 0.61), (2, 0.64)):
        log.record("eval", stage="validation", step=4 * window, window=window, auroc=auroc, ne=0.9)
    log.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("window/auroc")] == [(1, 0.61), (2, 0.64)]
    assert [e.step for e in events.Scalars("validation/auroc")] == [4, 8]
    assert [e.step for e in events.Scalars("window/ne")] == [1, 2]


def test_config_record_is_the_whole_configuration_with_the_world_size_and_device(tmp_path):
    """The format sweeps/results.py and training/report.py read: one JSON object, the
    configuration's fields nested as in training/config.py beside the record's own."""
    config = parse_config(
        ["--num_embeddings", "1000", "--embedding_dim", "8", "--batch_size", "16", "--dense_arch_layer_sizes", "16,8"],
        "dlrm_main.py",
        "",
    )
    path = tmp_path / "run.jsonl"
    log = RunLog(True, str(path), progress=False)
    before = time.time()
    log.record_config(config, 2, "cpu")
    log.close()
    [line] = path.read_text().splitlines()
    record = json.loads(line)
    assert before <= record.pop("time") <= time.time()
    assert record == {
        "event": "config",
        "run_id": log.run_id,
        "world_size": 2,
        "resolved_device": "cpu",
        **json.loads(json.dumps(dataclasses.asdict(config))),
    }
    assert record["model"]["embedding_dim"] == 8 and record["data"]["batch_size"] == 16


def _check(path):
    from common.errors import BadInput
    from common.run_log_file import check_appendable

    try:
        check_appendable(str(path))
    except BadInput as e:
        return str(e)
    return None


def test_log_path_must_be_a_run_log_new_or_empty(tmp_path):
    import numpy as np

    log = tmp_path / "run.jsonl"
    assert _check(log) is None  # a new file
    log.write_text("")
    assert _check(log) is None  # an empty one
    runs = RunLog(True, str(log), progress=False)
    runs.record("config", world_size=1)
    runs.close()
    assert _check(log) is None  # a run log: the next run appends to it
    np.save(tmp_path / "day_0_dense.npy", np.ones((4, 13), np.float32))
    refusal = (
        "holds something other than a training run log (its first line is not a record of one), and a run "
        "appends to it: give a new file, or a run log to add this run to"
    )
    assert _check(tmp_path / "day_0_dense.npy") == f"--log_path {tmp_path / 'day_0_dense.npy'}: {refusal}"
    for name, text in (
        ("notes.txt", "a note\n"),
        ("other.jsonl", '{"event": "x"}\n'),
        ("list.json", "[1, 2]\n"),
        ("cut.jsonl", '{"event": "config", "run_id": "r", "time": 1'),
    ):
        (tmp_path / name).write_text(text)
        assert _check(tmp_path / name) == f"--log_path {tmp_path / name}: {refusal}", name
    assert _check(tmp_path) == f"--log_path {tmp_path} is a directory: give the JSON-lines file to write"


@pytest.mark.slow
def test_a_run_refuses_a_log_path_holding_data_and_leaves_it_as_it_was(tmp_path):
    import numpy as np

    from harness.launch import run_script

    data = tmp_path / "day_0_dense.npy"
    np.save(data, np.arange(1000, dtype=np.float32))
    before = data.read_bytes()
    proc = run_script(
        [
            "dlrm_main.py",
            "--num_embeddings",
            "100",
            "--embedding_dim",
            "8",
            "--dense_arch_layer_sizes",
            "16,8",
            "--limit_train_batches",
            "2",
            "--log_path",
            str(data),
        ],
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"dlrm_main.py: error: --log_path {data}: holds something other than "
        "a training run log (its first line is not a record of one), and a "
        "run appends to it: give a new file, or a run log to add this run to"
    ]
    assert data.read_bytes() == before
