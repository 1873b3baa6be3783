"""python -m data.synthetic_parquet: the layout, the column types, determinism, learnability."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from common.errors import BadInput
from data.parquet.columns import ParquetColumns
from data.synthetic_parquet import (
    DENSE_COLUMNS,
    SPARSE_COLUMNS,
    SyntheticParquetSpec,
    generate_synthetic_parquet,
    main,
)

DATES = ("2026-11-01", "2026-11-02", "2026-11-03")
SPEC = SyntheticParquetSpec(days=3, rows_per_day=3000, files_per_day=2, row_group_rows=600, seed=5)


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("log") / "clicks")
    generate_synthetic_parquet(SPEC, out)
    return out


def day_table(directory: str, date: str) -> pa.Table:
    day = os.path.join(directory, f"date={date}")
    return pa.concat_tables(pq.read_table(os.path.join(day, f"part-{k}.parquet")) for k in range(2))


def test_layout_is_day_partitions_of_part_files_with_several_row_groups(log_dir):
    days = sorted(os.listdir(log_dir))
    assert days == ["date=2026-11-01", "date=2026-11-02", "date=2026-11-03"]
    for day in days:
        assert sorted(os.listdir(os.path.join(log_dir, day))) == ["part-0.parquet", "part-1.parquet"]
        files = [pq.ParquetFile(os.path.join(log_dir, day, f"part-{k}.parquet")) for k in range(2)]
        assert [f.metadata.num_rows for f in files] == [1500, 1500]
        assert [f.metadata.num_row_groups for f in files] == [3, 3]
    assert not [name for name in os.listdir(os.path.dirname(log_dir)) if name != "clicks"]  # no staging left


def test_column_types_nulls_and_values(log_dir):
    table = day_table(log_dir, "2026-11-02")
    schema = table.schema
    assert schema.names == ["ts", "label"] + DENSE_COLUMNS + SPARSE_COLUMNS + ["M1", "M2"]
    assert schema.field("ts").type == pa.timestamp("ms", tz="UTC")
    assert schema.field("label").type == pa.int8()
    assert all(schema.field(c).type == pa.int64() for c in DENSE_COLUMNS)
    assert [str(schema.field(c).type) for c in SPARSE_COLUMNS[:4]] == ["string", "int64", "string", "int64"]
    assert schema.field("M1").type == pa.list_(pa.int64()) and schema.field("M2").type == pa.list_(pa.string())

    ts = table["ts"].to_numpy()
    assert (np.diff(ts.astype(np.int64)) >= 0).all()  # ascending across the day's parts
    assert str(ts.min().astype("datetime64[D]")) == str(ts.max().astype("datetime64[D]")) == "2026-11-02"
    assert set(pc.unique(table["label"]).to_pylist()) == {0, 1}
    assert 0.1 < table["I1"].null_count / len(table) < 0.2
    assert sum(table[c].null_count for c in SPARSE_COLUMNS) > 0
    assert pc.all(pc.equal(pc.utf8_length(table["C1"]), 8)).as_py()
    assert pc.min(table["C2"]).as_py() >= 1_000_000_000 and pc.max(table["C2"]).as_py() > 2**32
    lengths = pc.list_value_length(table["M1"])
    assert table["M1"].null_count > 0 and pc.sum(pc.equal(lengths, 0)).as_py() > 0
    assert pc.max(lengths).as_py() == SPEC.max_bag_size


def test_every_day_brings_new_ids(log_dir):
    seen = set(day_table(log_dir, "2026-11-01")["C2"].to_pylist())
    following = set(day_table(log_dir, "2026-11-02")["C2"].to_pylist())
    assert len(following - seen) > 0.02 * len(following)


def test_a_drifting_catalogue_births_and_retires_ids_every_day(tmp_path):
    """--id_lifetime_days 2: each day half of a feature's catalogue is born and half
    dies, so day 3 shares no catalogue id with day 1, and consecutive days share some."""
    spec = SyntheticParquetSpec(**{**vars(SPEC), "days": 3, "id_lifetime_days": 2, "new_id_rate": 0.0})
    generate_synthetic_parquet(spec, str(tmp_path / "drift"))
    days = [set(day_table(str(tmp_path / "drift"), d)["C2"].drop_null().to_pylist()) for d in DATES]
    assert not days[0] & days[2]
    assert len(days[0] & days[1]) > 0.2 * len(days[1]) and len(days[1] & days[2]) > 0.2 * len(days[2])
    # The steady log's ids live on: its first and last day share most of them.
    generate_synthetic_parquet(SyntheticParquetSpec(**{**vars(spec), "id_lifetime_days": 0}), str(tmp_path / "steady"))
    steady = [set(day_table(str(tmp_path / "steady"), d)["C2"].drop_null().to_pylist()) for d in DATES]
    assert len(steady[0] & steady[2]) > 0.5 * len(steady[2])


def test_project_converter_reads_it(log_dir):
    table = day_table(log_dir, "2026-11-01")
    columns = ParquetColumns(
        label="label", dense=tuple(DENSE_COLUMNS), sparse=tuple(SPARSE_COLUMNS) + ("M1", "M2"), table_sizes=(1000,) * 28
    )
    columns.check_schema(table.schema, "part")
    rows = columns.convert(table)
    assert rows.num_rows == 3000 and rows.dense.shape == (3000, 13)
    assert rows.lengths[-1].max() == SPEC.max_bag_size and rows.lengths[0].max() == 1


def _auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(order))
    ranks[order] = np.arange(1, len(order) + 1)
    pos = labels.sum()
    return float((ranks[labels == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(labels) - pos)))


def test_labels_are_learnable_from_yesterday(tmp_path):
    """Per-value click rates counted on day 0 (a naive-Bayes score) rank day 1's rows well above chance."""
    spec = SyntheticParquetSpec(days=2, rows_per_day=20000, files_per_day=2, row_group_rows=10000, seed=1)
    out = str(tmp_path / "log")
    generate_synthetic_parquet(spec, out)
    train, test = day_table(out, "2026-11-01"), day_table(out, "2026-11-02")
    base = np.asarray(train["label"]).mean()
    score = np.zeros(len(test))
    for name in SPARSE_COLUMNS:
        values = pc.cast(train[name], pa.string()).fill_null("").to_numpy(zero_copy_only=False)
        labels = np.asarray(train["label"], dtype=np.float64)
        keys, inverse = np.unique(values, return_inverse=True)
        rate = (np.bincount(inverse, labels) + 10 * base) / (np.bincount(inverse) + 10)
        lookup = dict(zip(keys.tolist(), rate.tolist()))
        tested = pc.cast(test[name], pa.string()).fill_null("").to_numpy(zero_copy_only=False)
        score += np.log([lookup.get(v, base) / base for v in tested.tolist()])
    assert _auroc(score, np.asarray(test["label"])) > 0.6  # labels independent of ids: 0.5 +- 0.01


def test_same_seed_same_files_and_longer_log_extends_shorter(tmp_path):
    generate_synthetic_parquet(SPEC, str(tmp_path / "a"))
    generate_synthetic_parquet(SPEC, str(tmp_path / "b"))
    longer = SyntheticParquetSpec(**{**vars(SPEC), "days": 4})
    generate_synthetic_parquet(longer, str(tmp_path / "c"))
    other = SyntheticParquetSpec(**{**vars(SPEC), "seed": 6})
    generate_synthetic_parquet(other, str(tmp_path / "d"))
    for date in ("2026-11-01", "2026-11-03"):
        a = day_table(str(tmp_path / "a"), date)
        assert a.equals(day_table(str(tmp_path / "b"), date)) and a.equals(day_table(str(tmp_path / "c"), date))
        assert not a.equals(day_table(str(tmp_path / "d"), date))
    assert os.listdir(tmp_path / "c") != os.listdir(tmp_path / "a")


def test_replaces_an_earlier_log_and_refuses_other_files(tmp_path):
    out = str(tmp_path / "log")
    generate_synthetic_parquet(SPEC, out)
    generate_synthetic_parquet(SyntheticParquetSpec(**{**vars(SPEC), "days": 1}), out)
    assert os.listdir(out) == ["date=2026-11-01"]  # the earlier, longer log's days are gone
    with open(os.path.join(out, "notes.txt"), "w") as f:
        f.write("mine")
    with pytest.raises(BadInput, match=r"holds notes.txt, which is no part of a generated log"):
        generate_synthetic_parquet(SPEC, out)
    assert sorted(os.listdir(out)) == ["date=2026-11-01", "notes.txt"]  # untouched


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--start_date", "2026-13-01"], "--start_date '2026-13-01': expected YYYY-MM-DD"),
        (["--new_id_rate", "1.5"], "--new_id_rate must be within [0, 1], got 1.5"),
        (["--id_lifetime_days", "-1"], "--id_lifetime_days must not be negative, got -1"),
        (["--rows_per_day", "2", "--files_per_day", "3"], "--files_per_day 3 is more than --rows_per_day 2"),
    ],
)
def test_bad_flags_are_one_line(tmp_path, capsys, argv, message):
    assert main(["--output_dir", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"python -m data.synthetic_parquet: error: {message}\n"
    assert not os.path.exists(tmp_path / "out")
