"""The training flags of a case: its data (the Criteo day files or their Parquet
copy), model, optimizers, placement and schedule, as one command line."""

import os
from typing import Any

import numpy as np

from harness.matrix.cases import (
    ADAPTIVE,
    EMBEDDING_DIM,
    GLOBAL_BATCH,
    HISTORY_COLUMN,
    HISTORY_LENGTHS,
    MAX_HISTORY,
    MIXED,
    MIXED_PLAN,
    MULTI_HOT_SIZES,
    NO_SEQUENCE,
    PARQUET_VOCABULARY,
    PARQUET_ZCH,
    SEQUENCE_ITEM,
    TABLE_ROWS,
    VOCABULARY_MIN_ID_COUNT,
    ZCH_EVICTION_INTERVAL,
    ZCH_TABLE_ROWS,
    Case,
    batches_per_epoch,
    epochs,
    validation_every,
)
from sharding_plans.constraints import SHARDING_TYPES


def learning_rate(case: Case) -> float:
    """SGD tolerates a large step on this model; the adaptive optimizers move every
    touched weight by about the rate on their first step, so they get a small one."""
    adaptive = case["optimizer"] in ADAPTIVE or case["dense_optimizer"] in ADAPTIVE
    return 0.05 if adaptive else 0.5


# Epsilon of the adaptive optimizers. With the default 1e-8 their first step is
# lr * g / |g|: an element whose gradient is zero up to rounding moves by +-lr in one
# run and -+lr in the other, and no tolerance separates that from a bug. With 1e-2
# a gradient difference d changes a step by at most lr * d / eps (5 d here), so the
# comparison stays sharp.
EPS = 1e-2


def parquet_copy(data_dir: str, multi_hot: bool) -> str:
    """The Criteo day files of ``data_dir`` as one Parquet file beside it (written once):
    ``label``, the dense columns ``int_*`` as they are (already transformed), the ids
    ``cat_*`` as int64, or with ``multi_hot`` as lists of `MULTI_HOT_SIZES` ids (the id,
    then its successors). The cases train on it with ``--id_hashing modulo``, so rows
    hold the ids the binary cases' do."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from data.binary.criteo import CriteoBinaryDataset
    from data.binary.criteo_layout import DENSE_FEATURE_NAMES, SPARSE_FEATURE_NAMES

    target = f"{data_dir}-parquet-{'multi' if multi_hot else 'one'}-hot"
    path = os.path.join(target, "rows.parquet")
    if os.path.exists(path):
        return target
    dataset = CriteoBinaryDataset(data_dir)
    dense, sparse, labels = dataset.read(0, dataset.num_rows)
    columns: dict[str, Any] = {"label": pa.array(labels.reshape(-1).astype(np.int8))}
    columns.update({name: pa.array(dense[:, i]) for i, name in enumerate(DENSE_FEATURE_NAMES)})
    for f, name in enumerate(SPARSE_FEATURE_NAMES):
        ids = sparse[:, f].astype(np.int64)
        if multi_hot:
            bags = ids[:, None] + np.arange(MULTI_HOT_SIZES[f])
            offsets = np.arange(0, bags.size + 1, MULTI_HOT_SIZES[f], dtype=np.int32)
            columns[name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(bags.reshape(-1)))
        else:
            columns[name] = pa.array(ids)
        if name == SEQUENCE_ITEM:
            columns[HISTORY_COLUMN] = _history_column(ids)
    os.makedirs(target, exist_ok=True)
    pq.write_table(pa.table(columns), path + ".tmp", row_group_size=5000)  # uneven over the batches
    os.replace(path + ".tmp", path)
    return target


def _history_column(items: np.ndarray) -> Any:
    """`HISTORY_COLUMN`: each row's previous rows' items, oldest first, 0 to
    `HISTORY_LENGTHS` - 1 of them (cycling over the rows): empty histories, and longer
    ones than `MAX_HISTORY`, which the loader cuts to their newest."""
    import pyarrow as pa

    rows = np.arange(len(items))
    lengths = np.minimum(rows % HISTORY_LENGTHS, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    # Row r's history is items[r - lengths[r] : r].
    positions = np.repeat(rows - lengths - offsets[:-1], lengths) + np.arange(offsets[-1])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(items[positions]))


def data_flags(case: Case, data_dir: str) -> list[str]:
    """The flags naming the case's data (`DIMENSIONS` ``data_source``)."""
    if case.get("data_source", "criteo_binary") == "criteo_binary":
        argv = ["--in_memory_binary_criteo_path", data_dir]
        return argv + (["--multi_hot_sizes", ",".join(map(str, MULTI_HOT_SIZES))] if case["multi_hot"] else [])
    return [
        "--parquet_path",
        parquet_copy(data_dir, case["multi_hot"]),
        "--dense_columns",
        "int_*",
        "--sparse_columns",
        "cat_*",
        "--dense_transform",
        "none",
        "--id_hashing",
        *(
            # The tables: the vocabulary's kept ids (at most TABLE_ROWS - 1, the flag's cap) + row 0.
            ["vocabulary", "--min_id_count", str(VOCABULARY_MIN_ID_COUNT)]
            if case["data_source"] == PARQUET_VOCABULARY
            # LRU: once a table is full, the next admission evicts (LFU keeps a full table's
            # ids against newcomers of the same count, so a short run may evict none).
            # Shuffled: a second epoch reads other rows than the first, so that it brings new ids.
            else ["zch", "--zch_eviction_interval", str(ZCH_EVICTION_INTERVAL), "--zch_eviction_policy", "lru"]
            + ["--shuffle_training_set"]
            if case["data_source"] == PARQUET_ZCH
            else ["modulo"]
        ),
    ]


def case_argv(case: Case, data_dir: str, device: str) -> list[str]:
    """The training flags of a case (per-rank batch: the global batch over the ranks)."""
    argv = [
        *data_flags(case, data_dir),
        "--device",
        device,
        "--seed",
        "5",
        "--num_embeddings_per_feature",
        ",".join(map(str, ZCH_TABLE_ROWS if case.get("data_source") == PARQUET_ZCH else TABLE_ROWS)),
        "--embedding_dim",
        str(EMBEDDING_DIM),
        "--dense_arch_layer_sizes",
        "16,8",
        "--over_arch_layer_sizes",
        "16,1",
        "--interaction_type",
        case["interaction"],
        "--dcn_num_layers",
        "2",
        "--dcn_low_rank_dim",
        "4",
        "--interaction_branch1_layer_sizes",
        "16,16",
        "--interaction_branch2_layer_sizes",
        "16,16",
        "--optimizer",
        case["optimizer"],
        "--dense_optimizer",
        case["dense_optimizer"],
        "--learning_rate",
        str(learning_rate(case)),
        "--eps",
        str(EPS),
        "--embedding_precision",
        case["precision"],
        "--pipeline",
        case["pipeline"],
        "--sharding_type",
        MIXED_PLAN if case["sharding"] == MIXED else case["sharding"],
        "--batch_size",
        str(GLOBAL_BATCH // case["world_size"]),
        "--limit_train_batches",
        str(batches_per_epoch(case)),
        "--epochs",
        str(epochs(case)),
        "--limit_val_batches",
        "2",
        "--limit_test_batches",
        "2",
        "--log_every_n_steps",
        "100",
        # 4 steps, tested on 128 rows: the cases compare runs with each other, not with a
        # constant predictor, which such a run may not beat yet (training/divergence.py).
        "--allow_divergence",
    ]
    if case.get("validation_within_epoch"):
        argv += ["--validation_freq_within_epoch", str(validation_every(case))]
    if case.get("epoch_shares"):  # a Parquet case's reference (`cases.with_epoch_shares`)
        argv += ["--epoch_shares", str(case["epoch_shares"])]
    if case["amp"]:
        argv.append("--amp")
    if case.get("compute_kernel"):
        argv += ["--compute_kernel", compute_kernel_flag(case)]
    if case.get("allow_tf32"):
        argv.append("--allow_tf32")
    return argv + sequence_flags(case)


# Each sequence interaction's sizes, tiny: DIN's attention MLP, the transformer's
# feed-forward block (its 2 heads divide EMBEDDING_DIM).
SEQUENCE_SIZES = {
    "din": ["--din_attention_layer_sizes", "8"],
    "transformer": ["--transformer_num_layers", "1", "--transformer_ffn_size", "16"],
}


def sequence_flags(case: Case) -> list[str]:
    """The history feature of a sequence case (`DIMENSIONS` ``sequence``); none for the others."""
    sequence = case.get("sequence", NO_SEQUENCE)
    if sequence == NO_SEQUENCE:
        return []
    return [
        "--sequence_columns",
        f"{HISTORY_COLUMN}:{SEQUENCE_ITEM}",
        "--sequence_interaction",
        sequence,
        "--max_history",
        str(MAX_HISTORY),
        *SEQUENCE_SIZES.get(sequence, []),
    ]


def compute_kernel_flag(case: Case) -> str:
    """--compute_kernel of a case: its kernel for the fused tables; data-parallel
    tables (all of them, or MIXED's share) run the dense kernel, the only one they have."""
    if case["sharding"] == "data_parallel":
        return "dense"
    dense = [
        f"t_cat_{i}=dense"
        for i in range(len(TABLE_ROWS))
        if case["sharding"] == MIXED and SHARDING_TYPES[i % len(SHARDING_TYPES)] == "data_parallel"
    ]
    return ",".join([case["compute_kernel"]] + dense)
