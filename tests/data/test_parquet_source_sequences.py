"""--parquet_path with --sequence_columns: the features described, the KJT a batch holds
(histories after the sparse features, cut to --max_history, in the item's table), and
bad input refused in one line: a history that is not a list, holds another kind of id
than its item, or (with --user_column and --time_column) holds the row's own future."""

import glob
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.config_flags import FlagError
from common.errors import BadInput
from data.config import DataConfig
from tests.support.history_log import HISTORY, ITEM, TIME, USER, leaking_copy, write_history_log

FLAGS = dict(
    sparse_columns="user_id,item_id",
    dense_columns="category",
    time_column=TIME,
    sequence_columns=[f"{HISTORY}:{ITEM}"],
    max_history=3,
    batch_size=8,
)


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    return write_history_log(str(tmp_path_factory.mktemp("history_log")), days=3, rows_per_day=60)


def _source(path: str, **flags):
    config = DataConfig.from_flags(parquet_path=path, **{**FLAGS, **flags})
    return config.validate()


def test_histories_follow_the_sparse_features_in_the_items_table(log):
    source = _source(log)
    description = source.describe()
    assert description.sparse_feature_names == ("user_id", "item_id")
    assert description.kjt_keys == ["user_id", "item_id", HISTORY] and description.max_history == 3
    dataset = source.open()
    loader = source.loaders(dataset, [11, 37], 0, 1)["train"]
    batches = list(loader)
    columns = loader._columns
    plain = columns.__class__(columns.label, (), (ITEM,), (37,), hash_seed=columns.hash_seed)

    def rows_of(values: list[int]) -> list[int]:
        table = pa.table({"label": pa.array([0] * len(values)), ITEM: pa.array(values, pa.int64())})
        return plain.convert(table).ids[0].tolist()

    # Every batch's rows read back: each history's newest 3, hashed as the item ids are.
    split = pa.concat_tables(dataset.read_segment(s, [ITEM, HISTORY]) for s in dataset.splits["train"])
    cut = 0
    for b, batch in enumerate(batches):
        kjt = batch.sparse_features.to_dict()
        assert list(kjt) == ["user_id", "item_id", HISTORY]
        rows = split.slice(8 * b, len(batch.labels))
        histories = rows.column(HISTORY).to_pylist()
        newest = [h[-3:] for h in histories]
        assert kjt[HISTORY].lengths().tolist() == [len(h) for h in newest]
        assert kjt[ITEM].values().tolist() == rows_of(rows.column(ITEM).to_pylist())
        assert kjt[HISTORY].values().tolist() == rows_of([i for h in newest for i in h])
        cut += sum(len(h) > 3 for h in histories)
    assert cut > 0  # histories longer than --max_history were cut


def test_a_column_pattern_leaves_the_history_out(log):
    assert _source(log, sparse_columns="user_id,item*").describe().sparse_feature_names == ("user_id", "item_id")
    with pytest.raises(FlagError, match=f"{HISTORY}'? is already a feature of the data"):
        _source(log, sparse_columns=f"user_id,item_id,{HISTORY}").describe()
    with pytest.raises(FlagError, match="^--sequence_columns nope:item_id: no column nope "):
        _source(log, sequence_columns=["nope:item_id"]).describe()


@pytest.mark.parametrize(
    "flags, message",
    [
        (dict(sequence_columns=[]), "--user_column checks the histories of --sequence_columns: give them"),
        (dict(time_column=None), "--user_column checks histories against the rows' times: give --time_column"),
    ],
)
def test_user_column_needs_histories_and_times(log, flags, message):
    with pytest.raises(FlagError, match=re.escape(message)):
        _source(log, user_column=USER, **flags)


def _rewrite(path: str, change) -> None:
    table = pq.read_table(path, partitioning=None)
    pq.write_table(change(table), path, row_group_size=23)


def _copy(log: str, tmp_path) -> str:
    import shutil

    copy = str(tmp_path / "log")
    shutil.copytree(log, copy)
    return copy


@pytest.mark.parametrize(
    "history, expected",
    [
        (
            lambda t: t.column(ITEM),
            f"column {HISTORY} is int64, but a history column is a list of {ITEM}'s ids (list<int64>)",
        ),
        (
            lambda t: pa.array([[str(i)] for i in t.column(ITEM).to_pylist()]),
            f"column {HISTORY} holds string, but {ITEM}, whose embedding table it shares, is int64: the same "
            "id would hash to another row",
        ),
    ],
)
def test_a_history_of_the_wrong_type_is_refused_naming_the_file(log, tmp_path, history, expected):
    table = _copy(log, tmp_path)
    path = sorted(glob.glob(os.path.join(table, "*", "*.parquet")))[1]
    _rewrite(path, lambda t: t.set_column(t.schema.get_field_index(HISTORY), HISTORY, history(t)))
    with pytest.raises(BadInput) as bad:
        _source(table).open()
    assert str(bad.value) == f"{path}: {expected}", str(bad.value)


def test_what_data_histories_writes_passes_the_future_check(log):
    source = _source(log, user_column=USER)
    source.check_values(source.open())


def test_a_history_holding_the_rows_own_future_names_file_row_group_row_column(log, tmp_path):
    """(On every rank alike, before any collective: tests/training/test_trainer_sequences_parquet.py.)"""
    path, group, row = leaking_copy(log, str(tmp_path / "log"))
    source = _source(str(tmp_path / "log"), user_column=USER)
    dataset = source.open()
    with pytest.raises(BadInput) as bad:
        source.check_values(dataset)
    line = str(bad.value)
    assert line.startswith(f"{path}: row group {group}, row {row}, column {HISTORY}: item "), line
    assert "first had an event of it at" in line and "not before the row's time" in line and "\n" not in line
    _source(str(tmp_path / "log")).check_values(dataset)  # without --user_column: not checked


def test_history_ids_feed_their_items_seen_filter_but_not_its_unseen_count(tmp_path):
    """Item 999 is in histories only: training reads (and trains) its row, so serving will
    not call it unseen; an evaluation's unseen count is of the candidates, as serving's."""
    n = 40
    table = pa.table(
        {
            "label": pa.array([i % 2 for i in range(n)], pa.int8()),
            "user_id": pa.array(range(n), pa.int64()),
            "item_id": pa.array([7 if 20 <= i < 30 else i % 5 for i in range(n)], pa.int64()),
            HISTORY: pa.array([[999, i % 5] for i in range(n)], pa.list_(pa.int64())),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=10)
    flags = dict(FLAGS, time_column=None, dense_columns=None, validation_window="0.25", test_window="0.25")
    source = _source(str(tmp_path / "t.parquet"), **flags)
    loaders = source.loaders(source.open(), [11, 37], 0, 1)
    list(loaders["train"])
    plain = loaders["train"]._columns.__class__("label", (), (ITEM,), (37,))
    keys = plain.convert(pa.table({"label": pa.array([0, 0]), ITEM: pa.array([999, 7], pa.int64())})).keys[0]
    assert source.seen_ids().unseen([np.zeros(0, np.uint64), keys]) == [0, 1]  # 999 seen, 7 (validation only) not
    list(loaders["validation"])
    features, unseen, ids = source.unseen_counts("validation")
    assert features == ["user_id", "item_id"] and ids.tolist() == [10, 10] and unseen[1] == 10  # item 7: 10 rows
