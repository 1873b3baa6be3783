"""training/trainer.py: the run's data source is built once from the flags and handed
down (the trainer and its start-up report use that object)."""

import pytest

import data.parquet.files
import data.parquet.loader
from data.sources import DataSource
from data.synthetic_parquet import SyntheticParquetSpec, generate_synthetic_parquet
from training.main import run_training

SMALL = [
    "--embedding_dim",
    "8",
    "--dense_arch_layer_sizes",
    "16,8",
    "--over_arch_layer_sizes",
    "8,1",
    "--num_embeddings",
    "50",
    "--batch_size",
    "16",
    "--limit_train_batches",
    "2",
    "--limit_val_batches",
    "1",
    "--limit_test_batches",
    "1",
]


@pytest.fixture
def counted(monkeypatch):
    """{"sources": data sources built, "listings": recursive listings of a Parquet table}."""
    counts = {"sources": 0, "listings": 0}
    build, list_files = DataSource.__init__, data.parquet.files.list_files

    def counting_build(self, config):
        counts["sources"] += 1
        build(self, config)

    def counting_listing(*args, **kwargs):
        counts["listings"] += 1
        return list_files(*args, **kwargs)

    monkeypatch.setattr(DataSource, "__init__", counting_build)
    monkeypatch.setattr(data.parquet.files, "list_files", counting_listing)
    monkeypatch.setattr(data.parquet.loader, "list_files", counting_listing)
    return counts


def test_one_run_builds_its_source_once_and_lists_the_table_once(tmp_path, counted, capsys):
    """Before, a run built its source from the flags 7 times (the flags' check and
    description, TrainConfig.validate, the trainer, the start-up report three times)
    and listed the table 3 times (twice to describe it, once to open it)."""
    table = str(tmp_path / "clicks")
    generate_synthetic_parquet(
        SyntheticParquetSpec(
            days=2, rows_per_day=64, files_per_day=2, row_group_rows=16, multi_hot_columns=1, max_bag_size=3, seed=3
        ),
        table,
    )
    assert counted == {"sources": 0, "listings": 0}
    code = run_training(
        ["--parquet_path", table, "--dense_columns", "I*", "--sparse_columns", "C*,M*", *SMALL], "dlrm_main.py", ""
    )
    assert code == 0, capsys.readouterr().err
    assert counted == {"sources": 1, "listings": 1}
    assert f"data: {table} | rows: " in capsys.readouterr().out  # the start-up report, from that source
