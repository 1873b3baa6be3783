"""A small DLRM trained from raw synthetic Criteo logs and exported, shared by the
inference and serving tests (the `trained` fixture of tests/conftest.py builds it
once per session); and a tiny untrained one saved as a checkpoint in this process
(`tiny_checkpoint`), for tests of the export's files."""

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import dlrm_main
from checkpoints.meta import CheckpointMeta
from checkpoints.save import CheckpointManager
from common.calibration import Calibration
from data.preprocess_criteo import PreprocessConfig, preprocess
from data.sources import source_for
from data.synthetic_criteo import SyntheticCriteoSpec, write_raw_day
from harness.launch import launch, read_log
from models import build_dlrm_train
from serving import export
from training.flags import parse_config

SPEC = SyntheticCriteoSpec(
    num_days=3, rows_per_day=8_000, seed=5, cardinalities=[min(c, 1000) for c in SyntheticCriteoSpec().cardinalities]
)
MODEL_FLAGS = ["--embedding_dim", "16", "--dense_arch_layer_sizes", "64,16", "--over_arch_layer_sizes", "64,32,1"]


def train_and_export(root: Path) -> dict[str, Any]:
    """Raw TSV -> preprocessing with a frequency threshold -> 2-rank training with a
    checkpoint -> export, under ``root``. Returns the paths and the training log.

    Args:
        root: an empty directory.

    Example::

        trained = train_and_export(tmp_path)
        predict.Predictor(trained["model"]).predict_lines(b"".join(raw_test_lines(trained, 3)))
    """
    raw = root / "raw"
    raw.mkdir()
    for day in range(SPEC.num_days):
        write_raw_day(SPEC, str(raw / f"day_{day}"), day)
    data = str(root / "data")
    preprocess(PreprocessConfig(str(raw), data, "criteo_1t", frequency_threshold=2))
    ckpt, log = str(root / "ckpt"), str(root / "log.jsonl")
    assert launch(
        dlrm_main.main,
        [
            "--in_memory_binary_criteo_path",
            data,
            "--batch_size",
            "256",
            *MODEL_FLAGS,
            "--optimizer",
            "adagrad",
            "--learning_rate",
            "0.05",
            "--seed",
            "1",
            "--checkpoint_dir",
            ckpt,
            "--checkpoint_at_epoch_end",
            "--log_path",
            log,
            "--sharding_type",
            "table_wise",
        ],
    ) == {0: 0, 1: 0}
    assert export.main(["--checkpoint", ckpt, "--output", str(root / "model")]) == 0
    return exported(root)


def exported(root: Path) -> dict[str, Any]:
    """The paths and the training log `train_and_export` returned for ``root``."""
    return {
        "raw": str(root / "raw"),
        "data": str(root / "data"),
        "ckpt": str(root / "ckpt"),
        "model": str(root / "model"),
        "log": read_log(str(root / "log.jsonl")),
        "root": root,
    }


def raw_test_lines(trained: dict[str, Any], count: int) -> list[bytes]:
    """The first ``count`` raw lines of the test split (the second half of the last day)."""
    with open(os.path.join(trained["raw"], "day_2"), "rb") as f:
        lines = f.read().splitlines(keepends=True)
    return lines[len(lines) // 2 :][:count]


def tiny_checkpoint(
    root: Path,
    run_id: str,
    calibration: Calibration | None = None,
    serving_layout: str | None = None,
    serving_facts: dict[str, Any] | None = None,
    num_embeddings: int = 10,
    embedding_dim: int = 4,
    step: int = 1,
    change: Callable[[torch.nn.Module], None] | None = None,
    flags: list[str] | None = None,
) -> str:
    """A checkpoint of a tiny Criteo model (tables of ``num_embeddings`` rows of width
    ``embedding_dim``), saved by this process under ``root / "ckpt"``; returns its path. Its meta.json
    records the serving layout and facts of random data, as the trainer does, unless
    given. ``change``: called on the model before it is saved (a day of training
    changing some rows: save it at another ``step``). ``flags``: more of dlrm_main's
    (``--sequence_columns``: a model with history features).

    Example::

        export.export_model(tiny_checkpoint(tmp_path, "test"), str(tmp_path / "model"), ["int8"])
    """
    config = parse_config(
        [
            "--num_embeddings",
            str(num_embeddings),
            "--embedding_dim",
            str(embedding_dim),
            "--dense_arch_layer_sizes",
            f"8,{embedding_dim}",
            "--over_arch_layer_sizes",
            "8,1",
            *(flags or []),
        ],
        "dlrm_main.py",
        "",
    )
    torch.manual_seed(0)  # the same weights every run
    model = build_dlrm_train(config.model, dense_device=torch.device("cpu"), embedding_device=torch.device("cpu"))
    if change is not None:
        with torch.no_grad():
            change(model)
    source = source_for(config.data)
    meta = CheckpointMeta(
        step=step,
        epoch=0,
        batch_in_epoch=1,
        world_size=1,
        config=dataclasses.asdict(config),
        plan={},
        data_source=source.name,
        data_features=source.describe(),
        run_id=run_id,
        calibration=calibration,
        serving_layout=serving_layout or source.serving_layout,
        serving_facts=source.serving_facts(None) if serving_facts is None else serving_facts,
    )
    return CheckpointManager(str(root / "ckpt"), keep_last_n=0, rank=0).save({"model": model.state_dict()}, meta)
