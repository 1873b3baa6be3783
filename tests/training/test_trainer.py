"""End-to-end training runs on real gloo process groups."""

import math

import pytest

import dcnv2_main
import dlrm_main
from data.binary.criteo_layout import NUM_SPARSE_FEATURES
from harness.launch import eval_record, launch, read_log, run_script, step_losses

SMALL_MODEL = [
    "--embedding_dim",
    "16",
    "--dense_arch_layer_sizes",
    "64,16",
    "--over_arch_layer_sizes",
    "64,32,1",
    "--optimizer",
    "adagrad",
    "--learning_rate",
    "0.05",
]


def _flags(data_dir: str, log_path: str, *extra: str) -> list:
    return [
        "--in_memory_binary_criteo_path",
        data_dir,
        "--log_path",
        log_path,
        "--log_every_n_steps",
        "1",
        "--seed",
        "3",
        *SMALL_MODEL,
        *extra,
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "entry, extra",
    [
        (dlrm_main.main, []),
        (dcnv2_main.main, ["--interaction_type", "dcn", "--dcn_num_layers", "2", "--dcn_low_rank_dim", "16"]),
    ],
)
def test_two_ranks_learn(synthetic_dir, log_path, entry, extra):
    results = launch(entry, _flags(synthetic_dir, log_path, "--batch_size", "256", *extra))
    assert results == {0: 0, 1: 0}
    records = read_log(log_path)
    losses = step_losses(records)
    assert len(losses) == 96  # 2 days x 24576 rows / (256 x 2 ranks)
    head, tail = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert tail < head - 0.05, (head, tail)
    test = eval_record(records, "test")
    assert test["auroc"] > 0.65, test
    assert test["num_samples"] == 12288
    assert 0.0 < test["log_loss"] < 0.69 and 0.5 < test["accuracy"] <= 1.0


@pytest.mark.slow
def test_world_size_one_and_two_agree(synthetic_dir, tmp_path):
    """Same seed and global batch: the per-step losses match to 1e-6 (the runs sum
    gradients in a different order). SGD keeps float rounding from growing; Adagrad's
    first steps move every weight by about the learning rate whatever the gradient,
    which amplifies 1e-7 differences into 1e-2 within a few steps."""
    one, two = str(tmp_path / "one.jsonl"), str(tmp_path / "two.jsonl")
    limit = [
        "--limit_train_batches",
        "20",
        "--limit_val_batches",
        "0",
        "--limit_test_batches",
        "2",
        "--optimizer",
        "sgd",
        "--learning_rate",
        "0.5",
    ]
    assert launch(dlrm_main.main, _flags(synthetic_dir, one, "--batch_size", "512", *limit), nproc=1) == {0: 0}
    assert launch(dlrm_main.main, _flags(synthetic_dir, two, "--batch_size", "256", *limit), nproc=2) == {0: 0, 1: 0}
    losses_one, losses_two = step_losses(read_log(one)), step_losses(read_log(two))
    assert len(losses_one) == len(losses_two) == 20
    assert losses_one[-1] < losses_one[0]
    for a, b in zip(losses_one, losses_two):
        assert math.isclose(a, b, rel_tol=0, abs_tol=1e-6), (losses_one, losses_two)


@pytest.mark.slow
def test_validation_inside_epoch_does_not_change_training(synthetic_dir, tmp_path):
    plain, validated = str(tmp_path / "plain.jsonl"), str(tmp_path / "validated.jsonl")
    common = [
        "--batch_size",
        "256",
        "--limit_train_batches",
        "12",
        "--limit_val_batches",
        "3",
        "--limit_test_batches",
        "2",
    ]
    assert launch(dlrm_main.main, _flags(synthetic_dir, plain, *common)) == {0: 0, 1: 0}
    assert launch(dlrm_main.main, _flags(synthetic_dir, validated, *common, "--validation_freq_within_epoch", "5")) == {
        0: 0,
        1: 0,
    }
    assert step_losses(read_log(plain)) == step_losses(read_log(validated))
    evals = [r for r in read_log(validated) if r["event"] == "eval" and r["stage"] == "validation"]
    assert [r["step"] for r in evals] == [5, 10, 12]


@pytest.mark.slow
def test_same_seed_same_losses(synthetic_dir, tmp_path):
    a, b = str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")
    common = [
        "--batch_size",
        "256",
        "--limit_train_batches",
        "8",
        "--limit_val_batches",
        "0",
        "--limit_test_batches",
        "1",
        "--shuffle_batches",
        "--shuffle_training_set",
    ]
    for path in (a, b):
        assert launch(dlrm_main.main, _flags(synthetic_dir, path, *common)) == {0: 0, 1: 0}
    assert step_losses(read_log(a)) == step_losses(read_log(b))


@pytest.mark.slow
def test_plain_python_single_process(synthetic_dir, log_path):
    proc = run_script(
        [
            "dlrm_main.py",
            *_flags(
                synthetic_dir,
                log_path,
                "--batch_size",
                "512",
                "--limit_train_batches",
                "10",
                "--limit_val_batches",
                "2",
                "--limit_test_batches",
                "2",
                "--print_sharding_plan",
            ),
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "test: AUROC" in proc.stdout
    from harness.small_data import SMALL_SPEC

    plan_lines = [l for l in proc.stdout.splitlines() if " t_cat_" in l]
    assert len(plan_lines) == NUM_SPARSE_FEATURES
    table_bytes = sum(SMALL_SPEC.cardinalities) * 16 * 4
    assert f"embedding weights per rank: rank 0: {table_bytes / 2**20:.2f} MiB" in proc.stdout
    records = read_log(log_path)
    assert [r["event"] for r in records[:2]] == ["startup", "config"] and records[1]["world_size"] == 1
    assert records[0]["total_steps"] == 10 and records[0]["table_rows"] == sum(SMALL_SPEC.cardinalities)
    assert len(step_losses(records)) == 10
    # The start-up block comes before the first interval line, which carries step N/M and an ETA.
    lines = proc.stdout.splitlines()
    block_end = lines.index("steps per epoch: train 10, validation 2, test 2 | 1 epoch: 10 training steps")
    assert lines[0] == "starting: --mode train" and block_end < min(
        i for i, line in enumerate(lines) if line.startswith("epoch 0 step ")
    )
    assert any(line.startswith("epoch 0 step 10/10 | ETA 0s | loss ") for line in lines)
    done = [line for line in lines if line.startswith("done: 10 steps")]
    test = eval_record(records, "test")
    assert len(done) == 1 and f"test AUROC {test['auroc']:.4f}" in done[0]


@pytest.mark.slow
def test_random_data_when_no_path(log_path):
    """Without a data path the run uses uniform random data (the public example's default)."""
    proc = run_script(
        [
            "dlrm_main.py",
            "--log_path",
            log_path,
            *SMALL_MODEL,
            "--num_embeddings",
            "1000",
            "--batch_size",
            "128",
            "--limit_train_batches",
            "5",
            "--limit_val_batches",
            "2",
            "--limit_test_batches",
            "2",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    test = eval_record(read_log(log_path), "test")
    assert test["num_samples"] == 256 and abs(test["auroc"] - 0.5) < 0.15


@pytest.mark.slow
def test_bad_flag_under_torchrun_exits_2_on_every_rank(synthetic_dir):
    proc = run_script(
        ["dlrm_main.py", "--in_memory_binary_criteo_path", synthetic_dir, "--dense_arch_layer_sizes", "512,256,32"],
        torchrun_nproc=2,
        timeout=120,
    )
    assert proc.returncode != 0
    # Rank 0 prints the line (unless torchrun stopped it first, after rank 1 exited 2);
    # torchrun's summary shows it from the ranks' error files.
    said = [l for l in proc.stderr.splitlines() if l.startswith("dlrm_main.py: error: ")]
    assert len(said) <= 1 and all(l.endswith("must equal --embedding_dim (64)") for l in said), proc.stderr[-2000:]
    summary = "traceback : dlrm_main.py: the last --dense_arch_layer_sizes value (32) must equal --embedding_dim (64)"
    assert f"{summary} (exit code 2)" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow
def test_model_that_does_not_fit_is_one_line_on_every_rank():
    """The planner fails on rank 0 only (it plans, then broadcasts): every rank learns
    it, without waiting on the broadcast, and exits 2."""
    assert launch(
        dlrm_main.main,
        [*SMALL_MODEL, "--num_embeddings", "100000000000", "--batch_size", "32", "--limit_train_batches", "1"],
    ) == {0: 2, 1: 2}


@pytest.mark.slow
def test_non_finite_loss_stops_with_step(synthetic_dir, log_path):
    proc = run_script(
        [
            "dlrm_main.py",
            *_flags(synthetic_dir, log_path, "--batch_size", "256", "--limit_train_batches", "30"),
            "--optimizer",
            "sgd",
            "--learning_rate",
            "1e30",
        ]
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "training loss is" in proc.stderr and "at step" in proc.stderr
