"""fp16 tables, bf16 autocast, pipeline choice, TensorBoard, peak memory and the report."""

import json
import struct

import pytest

import dlrm_main
from common.click_metrics import binary_entropy
from harness.launch import eval_record, launch, read_log, step_losses
from training.report import main as report_main

SMALL = [
    "--embedding_dim",
    "16",
    "--dense_arch_layer_sizes",
    "64,16",
    "--over_arch_layer_sizes",
    "64,1",
    "--optimizer",
    "adagrad",
    "--learning_rate",
    "0.05",
    "--log_every_n_steps",
    "1",
    "--seed",
    "4",
]


def _inspect_tables(argv):
    """Builds the trainer on this rank; returns its table dtypes and planned weight bytes."""
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    from training.distributed import resolve_env
    from training.flags import parse_config
    from training.trainer import Trainer

    trainer = Trainer(parse_config(argv, "t", ""), resolve_env("cpu"))
    dtypes, local_bytes = set(), 0
    for key, value in trainer.model.state_dict().items():
        if "embedding_bags" in key:
            for shard in value.local_shards() if isinstance(value, ShardedTensor) else []:
                dtypes.add(str(shard.tensor.dtype))
                local_bytes += shard.tensor.numel() * shard.tensor.element_size()
    kinds = {entry["sharding_type"] for entry in trainer.plan.values()}
    dist.destroy_process_group()
    return {"dtypes": sorted(dtypes), "bytes": local_bytes, "kinds": sorted(kinds)}


@pytest.mark.slow
def test_fp16_tables_are_half_the_memory(synthetic_dir):
    argv = ["--in_memory_binary_criteo_path", synthetic_dir, *SMALL, "--batch_size", "128"]
    fp32 = launch(_inspect_tables, argv)
    fp16 = launch(_inspect_tables, argv + ["--embedding_precision", "fp16"])
    assert {r for v in fp32.values() for r in v["dtypes"]} == {"torch.float32"}
    assert {r for v in fp16.values() for r in v["dtypes"]} == {"torch.float16"}
    assert sum(v["bytes"] for v in fp16.values()) * 2 == sum(v["bytes"] for v in fp32.values())
    assert "data_parallel" not in fp16[0]["kinds"]  # fp16 tables stay on the fused kernels


@pytest.mark.slow
def test_fp16_run_learns(synthetic_dir, tmp_path):
    log = str(tmp_path / "fp16.jsonl")
    assert launch(
        dlrm_main.main,
        [
            "--in_memory_binary_criteo_path",
            synthetic_dir,
            *SMALL,
            "--batch_size",
            "256",
            "--embedding_precision",
            "fp16",
            "--log_path",
            log,
        ],
    ) == {0: 0, 1: 0}
    assert eval_record(read_log(log), "test")["auroc"] > 0.65


@pytest.mark.slow
def test_amp_losses_stay_close_to_fp32(synthetic_dir, tmp_path):
    """bf16 autocast on CPU: per-step losses within 0.002 of fp32 over 12 SGD steps
    (measured: 3e-5). With Adagrad the first steps move every weight by about the
    learning rate whatever the gradient, so any rounding difference grows instead."""
    logs = {name: str(tmp_path / f"{name}.jsonl") for name in ("fp32", "amp")}
    common = [
        "--in_memory_binary_criteo_path",
        synthetic_dir,
        *SMALL,
        "--batch_size",
        "256",
        "--limit_train_batches",
        "12",
        "--limit_val_batches",
        "0",
        "--limit_test_batches",
        "1",
        "--optimizer",
        "sgd",
        "--learning_rate",
        "0.5",
    ]
    assert launch(dlrm_main.main, common + ["--log_path", logs["fp32"]], nproc=1) == {0: 0}
    assert launch(dlrm_main.main, common + ["--log_path", logs["amp"], "--amp"], nproc=1) == {0: 0}
    fp32, amp = step_losses(read_log(logs["fp32"])), step_losses(read_log(logs["amp"]))
    assert len(fp32) == len(amp) == 12 and fp32 != amp
    assert max(abs(a - b) for a, b in zip(fp32, amp)) < 0.002


@pytest.mark.slow
def test_base_pipeline_matches_sparse_dist(synthetic_dir, tmp_path):
    logs = [str(tmp_path / f"{kind}.jsonl") for kind in ("sparse_dist", "base")]
    for kind, log in zip(("sparse_dist", "base"), logs):
        assert launch(
            dlrm_main.main,
            [
                "--in_memory_binary_criteo_path",
                synthetic_dir,
                *SMALL,
                "--batch_size",
                "128",
                "--limit_train_batches",
                "8",
                "--limit_val_batches",
                "2",
                "--limit_test_batches",
                "2",
                "--pipeline",
                kind,
                "--log_path",
                log,
            ],
        ) == {0: 0, 1: 0}
    assert step_losses(read_log(logs[0])) == pytest.approx(step_losses(read_log(logs[1])), abs=1e-6)


@pytest.mark.parametrize("kind", ["semi_sync", "prefetch"])
def test_cuda_only_pipelines_fail_clearly_on_cpu(kind, capsys):
    assert dlrm_main.main(["--pipeline", kind, "--num_embeddings", "100", "--limit_train_batches", "1"]) == 2
    lines = [l for l in capsys.readouterr().err.splitlines() if "error" in l]
    assert lines == [
        f"dlrm_main.py: error: --pipeline {kind} needs CUDA (TorchRec runs it on side streams); "
        "on cpu use sparse_dist or base"
    ]


@pytest.mark.slow
def test_tensorboard_peak_memory_and_report(synthetic_dir, tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log, tb = str(tmp_path / "run.jsonl"), str(tmp_path / "tb")
    assert launch(
        dlrm_main.main,
        [
            "--in_memory_binary_criteo_path",
            synthetic_dir,
            *SMALL,
            "--batch_size",
            "128",
            "--limit_train_batches",
            "10",
            "--limit_val_batches",
            "2",
            "--limit_test_batches",
            "2",
            "--validation_freq_within_epoch",
            "5",
            "--log_path",
            log,
            "--tensorboard_dir",
            tb,
        ],
    ) == {0: 0, 1: 0}
    events = EventAccumulator(tb)
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {
        "train/loss",
        "train/lr",
        "train/records_per_sec",
        "train/peak_memory_gib",
        "validation/auroc",
        "validation/log_loss",
        "test/auroc",
        "test/accuracy",
        "validation/ne",
        "validation/calibration",
        "validation/positive_rate",
        "test/ne",
        "test/calibration",
        "test/positive_rate",
    } <= tags
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 11))
    records = read_log(log)
    test = eval_record(records, "test")  # the JSON record carries the CTR metrics beside AUROC
    assert test["ne"] == pytest.approx(test["log_loss"] / binary_entropy(test["positive_rate"]), rel=1e-12)
    assert 0.0 < test["positive_rate"] < 1.0 and test["calibration"] > 0.0
    peaks = [r["peak_memory_bytes"] for r in records if r["event"] == "train"]
    # both ranks, the RSS of a torch process, in at least one record (none would pass all())
    assert len(peaks) >= 1 and all(len(p) == 2 and min(p) > 50 * 2**20 for p in peaks)

    second = str(tmp_path / "second.jsonl")
    with open(second, "w") as f:
        f.writelines(json.dumps({**r, "run_id": "other", "loss": r.get("loss", 0) + 0.1}) + "\n" for r in records)
    png = str(tmp_path / "run.png")
    assert report_main([log, second, "--output", png]) == 0
    with open(png, "rb") as f:
        header = f.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", header[16:24]) == (1200, 800)
    out = capsys.readouterr().out
    assert out.count("best validation AUROC") == 2 and "at step 10" in out or "at step 5" in out
    missing = str(tmp_path / "no_such_dir" / "run.png")
    assert report_main([log, "--output", missing]) == 2
    assert capsys.readouterr().err == (
        f"training.report: error: --output {missing}: cannot write it: No such file or directory\n"
    )

    bad = str(tmp_path / "bad.jsonl")
    with open(bad, "w") as f:
        f.write(json.dumps(records[0]) + "\n" + '{"event": "train", "step": 3}\n')
    assert report_main([bad, "--output", str(tmp_path / "x.png")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"training.report: error: {bad} line 2: train record without loss, lr, records_per_sec"
    )
    with open(bad, "w") as f:
        f.write("{not json\n")
    assert report_main([bad]) == 2 and f"{bad} line 1: not JSON" in capsys.readouterr().err
