"""A model of a day-partitioned Parquet click log, saved as a checkpoint in this process
(no training: its initial weights), for the tests that export and serve such a model
(tests/serving/test_serve_parquet.py, tests/serving/test_cpp.py)."""

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from checkpoints.meta import CheckpointMeta
from checkpoints.save import CheckpointManager
from data.sources import source_for
from training.flags import parse_config

DAYS = ("2026-11-01", "2026-11-02", "2026-11-03")
TABLE_SIZES = [50, 40, 30, 20]
MAX_BAG_SIZE = 6


def click_log_day(day: int, rows: int = 200) -> pa.Table:
    """A day of a click log as a data lake holds it: nullable counts, hex-string and
    billion-range int64 ids, multi-hot lists (empty and null bags too), a key column."""
    rng = np.random.default_rng(day)
    bag_lengths = rng.integers(0, 5, rows)
    return pa.table(
        {
            "label": (rng.random(rows) < 0.3).astype(np.int8),
            "I1": pa.array([None if rng.random() < 0.1 else int(v) for v in rng.integers(0, 100, rows)], pa.int64()),
            "I2": rng.random(rows) * 10,
            "C1": pa.array([None if rng.random() < 0.05 else f"{v:08x}" for v in rng.integers(0, 30, rows)]),
            "C2": rng.integers(0, 40, rows) * 1_000_000_007,
            "M1": pa.array(
                [None if n == 4 else [int(v) for v in rng.integers(0, 10**10, n)] for n in bag_lengths],
                pa.list_(pa.int64()),
            ),
            "M2": pa.array(
                [[f"{v:x}" for v in rng.integers(0, 50, rng.integers(0, MAX_BAG_SIZE + 1))] for _ in range(rows)],
                pa.list_(pa.string()),
            ),
            "user_id": [f"u{day}_{i}" for i in range(rows)],
        }
    )


def save_parquet_model(root) -> dict:
    """A day-partitioned Parquet log under ``root`` (a pathlib.Path) and a model of its
    columns saved as a checkpoint (with the run's data flags, as training records them):
    {"root", "data", "test_day", "config", "ckpt", "dlrm" (the eager model)}."""
    data = root / "log"
    for day, date in enumerate(DAYS):
        (data / f"date={date}").mkdir(parents=True)
        pq.write_table(click_log_day(day), str(data / f"date={date}" / "part-0.parquet"), row_group_size=64)
    config = parse_config(
        [
            "--parquet_path",
            str(data),
            "--dense_columns",
            "I*",
            "--sparse_columns",
            "C*,M*",
            "--time_column",
            "date",
            "--validation_window",
            "1d",
            "--test_window",
            "1d",
            "--batch_size",
            "32",
            "--embedding_dim",
            "4",
            "--dense_arch_layer_sizes",
            "8,4",
            "--over_arch_layer_sizes",
            "8,1",
        ],
        "dlrm_main.py",
        "",
    )
    source = source_for(config.data)
    description = source.describe()
    # The model of the table's features, as training builds it for --parquet_path.
    config.model = dataclasses.replace(
        config.model,
        sparse_feature_names=list(description.sparse_feature_names),
        dense_in_features=description.num_dense_features,
        num_embeddings_per_feature=TABLE_SIZES,
    )
    from models import build_dlrm_train

    torch.manual_seed(3)
    model = build_dlrm_train(config.model, dense_device=torch.device("cpu"), embedding_device=torch.device("cpu"))
    meta = CheckpointMeta(
        step=1,
        epoch=0,
        batch_in_epoch=1,
        world_size=1,
        config=dataclasses.asdict(config),
        plan={},
        data_source=source.name,
        data_features=description,
        run_id="serve-parquet",
    )
    ckpt = CheckpointManager(str(root / "ckpt"), keep_last_n=0, rank=0).save({"model": model.state_dict()}, meta)
    return {
        "root": root,
        "data": str(data),
        "test_day": str(data / f"date={DAYS[-1]}"),
        "config": config,
        "ckpt": ckpt,
        "dlrm": model.model.eval(),
    }
