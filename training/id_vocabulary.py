"""``--id_hashing vocabulary``: the vocabulary built (or loaded) before the model is built.

A fresh run reads the training split once (data/parquet/id_vocabulary.py counts every
sparse feature's ids exactly) and keeps the ids read at least ``--min_id_count`` times;
the tables then have the kept ids + 1 rows (row 0: every other id). A run that loads a
checkpoint (``--resume``, ``--restore_checkpoint_path``, ``--mode validate|test``) takes
the checkpoint's vocabulary instead and never counts again, so resume, evaluation and export map ids as the trained tables do. A ``--warm_start`` (a new
run on new data) grows its checkpoint's vocabulary: every id it kept keeps its row, and
the ids the new training split reads at least ``--min_id_count`` times (default: the
checkpoint's) that it lacks get new rows after them, so the tables grow (their new rows
initialised as a fresh run's); the new split's other ids join the rare ones. With
``--rolling_windows 1`` (the daily loop's days) the training split is window 0.

Table sizes: ``--num_embeddings_per_feature`` (or an integer ``--num_embeddings``,
``--max_table_rows``) is each table's rows at most: of the ids read often enough, only the
most frequent fit (rows - 1 of them; ties: the smaller key; a warm start appends only
as many as fit); without it the vocabulary decides alone; a run that loads a checkpoint keeps its vocabulary and tables whatever
those flags say. ``--num_embeddings auto`` sizes hashed tables and is refused here.
"""

import dataclasses
import os
from typing import Any

from common.config_flags import FlagError, option
from data.sources import DataSource, FeatureDescription
from models.config import TableSizes


def vocabulary_table_sizes(
    tables: TableSizes, source: DataSource, features: FeatureDescription, checkpoint: Any, mode: str
) -> TableSizes:
    """Builds or loads the run's vocabulary, hands it to ``source`` (its loaders map ids
    through it), and returns the table sizes with each table's rows (kept ids + 1).

    Raises:
        FlagError / BadInput: one line (an empty training split, a checkpoint without a
            vocabulary or with one that does not fit its tables).
    """
    from data.parquet.id_vocabulary import IdVocabulary, count_ids
    from training.table_sizing import _loaded_checkpoint

    data = source.config
    names = list(features.sparse_feature_names)
    loaded = _loaded_checkpoint(checkpoint, mode)
    if loaded is not None:
        # Its tables are the vocabulary's (checked against its meta.json): a cap given
        # again does not cut a trained vocabulary.
        return _use(source, tables, checkpoint_vocabulary(loaded, names))
    warm = _warm_start(checkpoint)
    origin = checkpoint_vocabulary(warm, names) if warm is not None else None
    count = data.min_id_count or (origin.min_id_count if origin is not None else 1)
    dataset = source.open()
    sparse = list(dataset.columns.sparse)
    # --rolling_windows 1 (the daily loop's days): window 0 is the one trained on.
    segments = list(dataset.splits["train" if "train" in dataset.splits else "window 0"])
    if not sum(s.count for s in segments):
        raise FlagError(
            f"{option(data, 'id_hashing')} vocabulary builds its vocabulary from the training split, "
            f"which has no rows here (see {option(data, 'validation_window')}, {option(data, 'test_window')})"
        )
    cap = tables.resolve(len(sparse), None) if _capped(tables) else None
    counts = count_ids(sparse, (dataset.read_segment(s, sparse) for s in segments))
    if origin is not None:
        # A warm start (new data: the daily loop's next day) keeps every row the origin
        # trained and appends the new split's frequent ids it lacks: its tables grow.
        vocabulary = origin.grown(counts, count, cap)
    else:
        vocabulary = IdVocabulary.of(sparse, counts, count, cap)
    if os.environ.get("RANK", "0") == "0":
        before = origin.kept if origin is not None else [[] for _ in sparse]
        print(
            f"--id_hashing vocabulary --min_id_count {count}: "
            + ", ".join(
                f"{n} {len(k):,} ids kept of {len(k) + len(r):,}" + (f" ({len(k) - len(b):,} new)" if origin else "")
                for n, k, r, b in zip(sparse, vocabulary.kept, vocabulary.rare, before)
            )
            + f"; --num_embeddings_per_feature {','.join(str(s) for s in vocabulary.table_sizes)}",
            flush=True,
        )
    return _use(source, tables, vocabulary)


def _use(source: DataSource, tables: TableSizes, vocabulary: Any) -> TableSizes:
    """Hands ``vocabulary`` to ``source`` and returns the table sizes it gives."""
    source.set_vocabulary(vocabulary)  # type: ignore[attr-defined]
    return dataclasses.replace(tables, num_embeddings_per_feature=vocabulary.table_sizes, max_table_rows=None)


def _capped(tables: TableSizes) -> bool:
    return (
        tables.num_embeddings_per_feature is not None
        or isinstance(tables.num_embeddings, int)
        or tables.max_table_rows is not None
    )


def _warm_start(checkpoint: Any) -> str | None:
    if not checkpoint.warm_start:
        return None
    from training.warm_start import _checkpoint_of

    return _checkpoint_of(checkpoint.warm_start)


def checkpoint_vocabulary(path: str, names: list[str]) -> Any:
    """The IdVocabulary a checkpoint saved, checked against its meta.json's facts and tables.

    Raises:
        VocabularyError: a checkpoint without one, or one of other features or sizes.
    """
    import numpy as np
    import torch

    from checkpoints.load import load_checkpoint
    from checkpoints.opened import open_checkpoint
    from data.parquet.id_vocabulary import IdVocabulary, VocabularyError, check_facts

    opened = open_checkpoint(path)
    meta = opened.meta
    facts = (meta.serving_facts or {}).get("id_vocabulary")
    if facts is None:
        raise VocabularyError(
            f"checkpoint {path} has no id vocabulary (trained with --id_hashing "
            f"{meta.config.get('data', {}).get('source_options', {}).get('id_hashing', 'hash')}): "
            "train afresh with --id_hashing vocabulary"
        )
    try:
        check_facts(facts, names, meta.model.num_embeddings_per_feature)
    except VocabularyError as e:
        raise VocabularyError(f"checkpoint {path}: {e}") from None
    state = {"id_vocabulary": {n: torch.zeros(facts["kept"][n] + facts["rare"][n], dtype=torch.int64) for n in names}}
    load_checkpoint(opened, state, int(os.environ.get("RANK", "0")), restore_rng=False)
    arrays = {n: np.asarray(t.numpy()) for n, t in state["id_vocabulary"].items()}
    try:
        return IdVocabulary.from_state(names, arrays, facts)
    except VocabularyError as e:
        raise VocabularyError(f"checkpoint {path}: its vocabulary {e}") from None
