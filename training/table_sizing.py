"""``--num_embeddings auto``: each table sized from the training split before the model is built.

The sizes come from the distinct ids of the training split (data/profile.py's counting,
the same as ``python -m data.profile``), or of the ``--table_profile`` file that command
wrote, sized for ``--target_collision_share`` within ``--memory_gb`` at the run's
``--embedding_dim`` and ``--embedding_precision``. The checkpoint's meta.json records the
sizes (``config.model.num_embeddings_per_feature``) and what they were derived from
(``config.table_sizing``): a run that loads a checkpoint (``--resume``,
``--restore_checkpoint_path``, ``--mode validate|test``) takes them from there and never
sizes again, so resume, evaluation and export agree with the trained tables.
"""

import dataclasses
import os
from typing import Any

from common.config_flags import FlagError, option
from common.errors import BadInput
from data.config import DataConfig
from data.profile import Profile, Profiler, SizingFlags, read_profile, suggest_sizes
from data.sources import DataSource, FeatureDescription
from models.config import TableSizes

_ROW_BYTES = {"fp32": 4, "fp16": 2}


def _loaded_checkpoint(checkpoint: Any, mode: str) -> str | None:
    """The checkpoint this run loads (its path), or None when it starts fresh."""
    from training.checkpoint_policy import checkpoint_to_evaluate  # imports torch: only when auto

    if mode == "train" and checkpoint.resume:
        from checkpoints.directory import newest_checkpoint

        return newest_checkpoint(checkpoint.checkpoint_dir)
    if checkpoint.restore_checkpoint_path or (mode in ("validate", "test") and checkpoint.checkpoint_dir):
        return checkpoint_to_evaluate(checkpoint)
    return None


def _from_checkpoint(path: str, features: FeatureDescription) -> tuple[list[int], SizingFlags]:
    from checkpoints.opened import read_meta

    meta = read_meta(path)
    sizes = list(meta.model.num_embeddings_per_feature)
    if len(sizes) != len(features.sparse_feature_names):
        raise FlagError(
            f"--num_embeddings auto: checkpoint {path} has {len(sizes)} tables, but the data has "
            f"{len(features.sparse_feature_names)} categorical features"
        )
    recorded = meta.config.get("table_sizing")
    fields = {f.name for f in dataclasses.fields(SizingFlags)}
    sizing = SizingFlags(**{k: v for k, v in recorded.items() if k in fields}) if isinstance(recorded, dict) else None
    return sizes, sizing or SizingFlags()


def _profile_file(path: str, features: FeatureDescription) -> Profile:
    """The ``--table_profile`` file, checked against the run's categorical columns."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as e:
        raise FlagError(f"--table_profile {path}: cannot read it ({e.strerror or e})") from e
    profile = read_profile(data, path)
    wanted = list(features.sparse_feature_names)
    if profile.sparse_columns != wanted:
        missing = [c for c in wanted if c not in profile.sparse_columns]
        extra = [c for c in profile.sparse_columns if c not in wanted]
        what = (
            f"lacks {', '.join(missing)}"
            if missing
            else f"has {', '.join(extra)} besides them"
            if extra
            else "lists them in another order"
        )
        raise FlagError(
            f"--table_profile {path}: profiles columns {','.join(profile.sparse_columns)}, but --sparse_columns "
            f"gives {','.join(wanted)} (it {what}); profile the training data's columns with python -m data.profile"
        )
    return profile


def _training_profile(source: DataSource, data: DataConfig, sizing: SizingFlags, model: dict[str, Any]) -> Profile:
    """Reads the training split once (with --rolling_windows: every window that is trained on)."""
    dataset = source.open()
    names = list(dataset.splits)
    trained = ["train"] if "train" in dataset.splits else names[:-1]  # the last window is only evaluated
    sparse = list(dataset.columns.sparse)
    profiler = Profiler(sparse, None, None)
    for split in trained:
        for segment in dataset.splits[split]:
            profiler.add(dataset.read_segment(segment, sparse))
    return profiler.profile(
        str(data.parquet_path),
        sizing.target_collision_share,
        sizing.memory_gb,
        model["embedding_dim"],
        model["embedding_precision"],
    )


def auto_table_sizes(
    tables: TableSizes,
    sizing: SizingFlags,
    source: DataSource,
    features: FeatureDescription,
    model: dict[str, Any],
    checkpoint: Any,
    mode: str,
) -> tuple[list[int], SizingFlags]:
    """The table sizes of ``--num_embeddings auto`` and the sizing record meta.json keeps.

    Args:
        model: the ModelConfig flags' values (embedding_dim, embedding_precision).
        checkpoint: the run's CheckpointConfig; mode: its --mode.

    Raises:
        FlagError: auto on data other than Parquet with hashed ids, with
            --num_embeddings_per_feature, a --table_profile that does not describe
            these columns (one line naming the flag and the file).
    """
    data = source.config
    if tables.num_embeddings_per_feature is not None:
        raise FlagError(
            f"give {option(tables, 'num_embeddings')} auto or {option(tables, 'num_embeddings_per_feature')}, not both"
        )
    if source.name != "parquet":
        raise FlagError(
            f"{option(tables, 'num_embeddings')} auto sizes the tables from Parquet training data "
            f"({option(data, 'parquet_path')}); the {source.name} data has no raw ids to count"
        )
    if data.id_hashing != "hash":
        raise FlagError(
            f"{option(tables, 'num_embeddings')} auto sizes hashed tables: it needs {option(data, 'id_hashing')} hash"
        )
    sizing.validate()
    loaded = _loaded_checkpoint(checkpoint, mode)
    if loaded is not None:  # the trained tables' sizes: never sized again
        return _from_checkpoint(loaded, features)
    if sizing.table_profile is not None:
        distinct = _profile_file(sizing.table_profile, features).distinct()
    else:
        distinct = _training_profile(source, data, sizing, model).distinct()
    if model["embedding_precision"] not in _ROW_BYTES:
        raise BadInput(f"--embedding_precision {model['embedding_precision']}: unknown")
    chosen = suggest_sizes(
        distinct,
        sizing.target_collision_share,
        sizing.memory_bytes,
        model["embedding_dim"] * _ROW_BYTES[model["embedding_precision"]],
    )
    record = dataclasses.replace(
        sizing, distinct_ids=distinct, expected_collision_shares=chosen.shares, expected_collision_share=chosen.share
    )
    if os.environ.get("RANK", "0") == "0":  # every rank sizes alike; one says so
        names = features.sparse_feature_names
        print(
            f"--num_embeddings auto: {chosen.flag_line} (expected collision share {chosen.share:.3g}; distinct ids "
            + ", ".join(f"{n} {d:,}" for n, d in zip(names, distinct))
            + ")",
            flush=True,
        )
    return chosen.rows, record
