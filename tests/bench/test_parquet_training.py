"""bench/parquet_training.py without its training runs: the Parquet copy holds the
binary's rows, its flags split them as the binary does, and the rate is read from a log."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from bench.parquet_training import parquet_flags, records_per_sec, write_parquet_copy
from data.binary.criteo import CriteoBinaryDataset
from data.config import DataConfig
from data.sources import source_for
from data.synthetic_criteo import SyntheticCriteoSpec, generate_synthetic_criteo


def test_the_parquet_copy_is_the_binarys_rows_in_the_binarys_splits(tmp_path):
    rows_per_day, days = 60, 3
    binary, parquet = str(tmp_path / "binary"), str(tmp_path / "parquet")
    generate_synthetic_criteo(SyntheticCriteoSpec(num_days=days, rows_per_day=rows_per_day), binary, False)
    assert write_parquet_copy(binary, parquet, row_group_rows=25) == rows_per_day * days

    dataset = CriteoBinaryDataset(binary)
    dense, sparse, labels = dataset.read(0, dataset.num_rows)
    table = pq.read_table(parquet)
    assert np.array_equal(table.column("label").to_numpy(), np.asarray(labels).reshape(-1))
    assert np.array_equal(np.stack([table.column(f"I{j + 1}").to_numpy() for j in range(13)], 1), dense)
    assert np.array_equal(np.stack([table.column(f"C{j + 1}").to_numpy() for j in range(26)], 1), sparse)

    flags = parquet_flags(parquet, rows_per_day, days)
    options = {name[2:]: value for name, value in zip(flags[::2], flags[1::2])}
    source = source_for(DataConfig.from_flags(batch_size=8, **options))
    opened = source.open()
    for split, (start, stop) in dataset.split_ranges().items():
        assert opened.num_rows(split) == stop - start, split


def test_the_rate_leaves_out_the_first_interval(tmp_path):
    log = tmp_path / "run.jsonl"
    records = [
        {"event": "start"},
        {"event": "train", "records": 1000, "seconds": 9.0},  # warm-up: left out
        {"event": "train", "records": 2000, "seconds": 1.0},
        {"event": "train", "records": 2000, "seconds": 3.0},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert records_per_sec(str(log)) == pytest.approx(1000.0)
    log.write_text(json.dumps(records[1]) + "\n")
    with pytest.raises(RuntimeError, match="fewer than two train intervals"):
        records_per_sec(str(log))
