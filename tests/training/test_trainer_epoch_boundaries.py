"""State that crosses an epoch, a validation pass or a resume, in one process: a run
resumed at an epoch's end, inside the second epoch or inside the first, with shuffled
batches, a warm-up and decay schedule and early stopping's bookkeeping, continues
exactly as the uninterrupted run; evaluating again after the run gives the figures
the run reported. (harness/matrix/ checks the same boundaries over every
pipeline, sharding and optimizer, without shuffling or a schedule.)"""

import shutil
from typing import Any

import pytest
import torch.distributed as dist

from harness.launch import eval_metrics, read_log
from training.distributed import resolve_env
from training.flags import parse_config
from training.trainer import Trainer

BATCHES = 4  # per epoch
EPOCHS = 2
# Validation at batch 2 (the pipeline holds batch 3) and at batch 4, the epoch's end.
VALIDATE_EVERY = 2
SAVE_EVERY = 2  # checkpoints at steps 2, 4 (an epoch's end, after its validation), 6, 8


def run_flags(data_dir: str, pipeline: str) -> list[str]:
    return [
        "--in_memory_binary_criteo_path",
        data_dir,
        "--num_embeddings",
        "60",
        "--embedding_dim",
        "4",
        "--dense_arch_layer_sizes",
        "8,4",
        "--over_arch_layer_sizes",
        "8,1",
        "--batch_size",
        "32",
        "--optimizer",
        "adagrad",
        "--learning_rate",
        "0.05",
        "--pipeline",
        pipeline,
        "--seed",
        "4",
        "--epochs",
        str(EPOCHS),
        "--limit_train_batches",
        str(BATCHES),
        "--limit_val_batches",
        "2",
        "--limit_test_batches",
        "2",
        "--validation_freq_within_epoch",
        str(VALIDATE_EVERY),
        "--shuffle_batches",
        "--lr_warmup_steps",
        "3",
        "--lr_decay_start",
        "4",
        "--lr_decay_steps",
        "4",
        "--lr_decay_floor",
        "0.1",
        "--log_every_n_steps",
        "1",
        # Only the first validation can improve by 1: early stopping's count of
        # validations without improvement counts every later one, and never stops.
        "--early_stopping_patience",
        "100",
        "--early_stopping_metric",
        "auroc",
        "--early_stopping_min_delta",
        "1",
    ]


@pytest.fixture
def one_process(monkeypatch):
    """Runs in this process, on its own single-rank process group."""
    for name in ("MASTER_ADDR", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    yield resolve_env("cpu")
    if dist.is_initialized():
        dist.destroy_process_group()


def fit(argv: list[str], env) -> dict[str, Any]:
    """Trains; returns the run's log records, its result, and the trainer."""
    log = argv[argv.index("--log_path") + 1]
    trainer = Trainer(parse_config(argv, "test", ""), env)
    result = trainer.fit()
    return {"records": read_log(log), "result": result, "trainer": trainer}


def per_step(records: list[dict[str, Any]]) -> dict[int, tuple]:
    """{step: (epoch, loss, lr)}: one training record per step (log_every_n_steps 1)."""
    return {r["step"]: (r["epoch"], r["loss"], r["lr"]) for r in records if r["event"] == "train"}


def evaluations(records: list[dict[str, Any]], stage: str) -> list[dict[str, Any]]:
    return [eval_metrics(r) for r in records if r["event"] == "eval" and r["stage"] == stage]


@pytest.mark.slow  # eight short trainings (no process)
@pytest.mark.parametrize("pipeline", ["base", "sparse_dist"])
def test_resume_at_each_boundary_equals_the_uninterrupted_run(one_process, synthetic_dir, tmp_path, pipeline):
    whole_dir = str(tmp_path / "whole")
    whole = fit(
        run_flags(synthetic_dir, pipeline)
        + [
            "--checkpoint_dir",
            whole_dir,
            "--checkpoint_every_n_steps",
            str(SAVE_EVERY),
            "--log_path",
            str(tmp_path / "whole.jsonl"),
        ],
        one_process,
    )
    steps = per_step(whole["records"])
    assert sorted(steps) == list(range(1, EPOCHS * BATCHES + 1))
    assert [e for e, _, _ in steps.values()] == [0] * BATCHES + [1] * BATCHES
    validations = evaluations(whole["records"], "validation")
    assert [v["step"] for v in validations] == [2, 4, 6, 8]
    # The evaluation state is fresh each pass: evaluating the tested (best) weights
    # again gives the figures of their validation and of the test.
    trainer = whole["trainer"]
    assert trainer.evaluate("validation") == whole["result"].best_validation
    assert trainer.evaluate("test") == whole["result"].test
    stopping = trainer.best.stopping.state_dict()
    assert (stopping["best_step"], stopping["validations_without_improvement"]) == (2, 3)

    # Step 4 ends epoch 0: its checkpoint precedes the epoch's validation, which the
    # resumed run runs (once, as early stopping's state shows). Step 6 is inside
    # epoch 1 (the pipeline holds batch 7); step 2 is inside epoch 0, so the resumed
    # run crosses into epoch 1.
    for stop in (4, 6, 2):
        # What a run killed after step `stop` leaves: the checkpoints up to it, best.json.
        cut_dir = str(tmp_path / f"cut{stop}")
        shutil.copytree(
            whole_dir,
            cut_dir,
            ignore=lambda _, names: [n for n in names if n.startswith("step_") and int(n[len("step_") :]) > stop],
        )
        resumed = fit(
            run_flags(synthetic_dir, pipeline)
            + ["--checkpoint_dir", cut_dir, "--resume", "--log_path", str(tmp_path / f"cut{stop}.jsonl")],
            one_process,
        )
        assert per_step(resumed["records"]) == {s: v for s, v in steps.items() if s > stop}, stop
        first = stop if stop % BATCHES == 0 else stop + 1
        assert evaluations(resumed["records"], "validation") == [v for v in validations if v["step"] >= first], stop
        assert evaluations(resumed["records"], "test") == evaluations(whole["records"], "test"), stop
        assert resumed["trainer"].best.stopping.state_dict() == stopping, stop
