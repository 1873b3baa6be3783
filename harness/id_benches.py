"""What the id-mode benches share (bench/zch_collisions.py, bench/id_vocabulary.py and
bench/id_modes.py): the small model they all train, a training run of it read back, and
the raw-id keys of a Parquet table's sparse columns. Here rather than in bench/, whose
every module is a command."""

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from data.parquet.columns import ParquetColumns
from harness.launch import read_log, run_script

# The model every id-mode bench trains, so that their figures compare: DLRM, width 16,
# Adagrad 0.05 (the small-data recipe's), on CPU. The caller adds the data, the tables,
# the batch size and the id mode.
SMALL_MODEL = (
    *("--embedding_dim", "16", "--dense_arch_layer_sizes", "64,16", "--over_arch_layer_sizes", "64,1"),
    *("--learning_rate", "0.05", "--optimizer", "adagrad", "--device", "cpu"),
)


def train_small_model(bench: str, name: str, argv: Sequence[str], log: str, timeout: float = 7200) -> list[Any]:
    """The records of ``dlrm_main.py`` run as `SMALL_MODEL` with ``argv`` (which may
    override it) logging to ``log`` (replaced); a failed run ends the bench with its last
    line, naming ``bench`` and the run's ``name``."""
    if os.path.exists(log):
        os.remove(log)
    proc = run_script(["dlrm_main.py", *SMALL_MODEL, *argv, "--log_path", log], timeout=timeout)
    if proc.returncode:
        lines = proc.stderr.strip().splitlines() or ["(no output)"]
        raise SystemExit(f"{bench}: the {name} run failed: {lines[-1]}")
    return read_log(log)


def column_keys(table: pa.Table, names: Sequence[str]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(keys, bag lengths) of each of ``names``' columns in ``table``: the 64-bit keys the
    hash, the vocabulary and zch map (docs/data.md, "the hash"), as training reads them."""
    converted = ParquetColumns("label", (), tuple(names), (1,) * len(names)).convert(table, labelled=False)
    return list(converted.keys), list(converted.lengths)
