"""python -m data.profile: counts against exact ones on a synthetic lake, the collision
formula against the counter the trainer logs, sizing within a budget, the JSON read back,
bad input one line exit 2."""

import glob
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from common.json_fields import FileFieldError
from data.parquet.columns import ParquetColumns
from data.parquet.id_collisions import CollisionCounter
from data.profile import (
    IdCounter,
    collision_share,
    main,
    profile_lake,
    read_profile,
    rows_for_share,
    suggest_sizes,
    write_profile,
)
from data.synthetic_parquet import SyntheticParquetSpec, generate_synthetic_parquet

COLUMNS = "C1,C2,C3,M1"


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("profile") / "lake")
    spec = SyntheticParquetSpec(days=3, rows_per_day=4000, files_per_day=2, row_group_rows=1000, multi_hot_columns=1)
    generate_synthetic_parquet(spec, root)
    return root


def exact_counts(root: str, column: str) -> dict:
    """What the profile must find, from whole days read by pyarrow: keys as training reads them."""
    days = sorted(glob.glob(f"{root}/date=*"))
    seen: set[int] = set()
    values, nulls, new_share, counts = 0, 0, {}, {}
    for day in days:
        table = pq.read_table(day, columns=[column])
        keys, _ = ParquetColumns._bags(table.column(column))
        nulls += table.column(column).null_count
        values += len(keys)
        fresh = ~np.isin(keys, np.fromiter(seen, np.uint64, len(seen)))
        new_share[day.rsplit("=", 1)[1]] = float(fresh.mean())
        seen.update(keys.tolist())
        for key, n in zip(*np.unique(keys, return_counts=True)):
            counts[int(key)] = counts.get(int(key), 0) + int(n)
    ordered = np.cumsum(sorted(counts.values(), reverse=True))
    covering = {share: int(np.searchsorted(ordered, share * ordered[-1] - 1e-9)) + 1 for share in (0.9, 0.99)}
    return {
        "values": values,
        "nulls": nulls,
        "distinct": len(counts),
        "new": new_share,
        "covering": covering,
        "keys": np.fromiter(counts, np.uint64),
    }


def test_exact_counts_match_the_lake(lake):
    profile = profile_lake(lake, COLUMNS, "date", 0.01, None, 16, "fp32")
    assert profile.rows == 12000 and profile.sparse_columns == COLUMNS.split(",")
    for column in profile.columns:
        truth = exact_counts(lake, column.name)
        assert column.distinct_exact and column.distinct_relative_error == 0
        assert (column.values, column.nulls, column.distinct) == (truth["values"], truth["nulls"], truth["distinct"])
        assert column.new_share_by_day == pytest.approx(truth["new"], abs=1e-12)
        assert (column.ids_covering_90, column.ids_covering_99) == (truth["covering"][0.9], truth["covering"][0.99])
    # The synthetic lake's --new_id_rate 0.05 shows on the days after the first.
    assert 0.03 < profile.columns[0].new_share_by_day["2026-11-03"] < 0.08


def test_approximate_counts_within_their_stated_error(lake):
    exact = profile_lake(lake, "C3,M1", "date", 0.01, None, 16, "fp32")
    approx = profile_lake(lake, "C3,M1", "date", 0.01, None, 16, "fp32", exact_ids=1024)
    for e, a in zip(exact.columns, approx.columns):
        assert not a.distinct_exact and 0 < a.distinct_relative_error < 0.06
        assert abs(a.distinct - e.distinct) <= 3 * a.distinct_relative_error * e.distinct
        assert (a.values, a.nulls) == (e.values, e.nulls)  # not sampled
        assert a.ids_covering_99 == pytest.approx(e.ids_covering_99, rel=0.15)


def test_sampling_keeps_whole_ids_and_bounded_memory():
    counter = IdCounter(exact_ids=500)
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**63, 20_000).astype(np.uint64)
    for block in np.array_split(np.concatenate([keys, keys[:5000]]), 10):
        counter.add(block, None, 0)
    distinct = counter.distinct()  # merges what is buffered (at most 2**18 ids between merges)
    assert counter.level > 0 and distinct == pytest.approx(20_000, rel=4 * counter.relative_error())
    assert len(counter._keys) <= 500  # the cap bounds the memory
    assert set(counter._total.tolist()) <= {1, 2}  # a kept id's count is exact


def test_collision_share_predicts_the_counter_the_trainer_logs(lake):
    """The share of distinct ids on a shared row, as the training loader's CollisionCounter
    counts it with the real hash, within 20% of the prediction at the suggested sizes."""
    profile = profile_lake(lake, COLUMNS, "date", 0.25, None, 16, "fp32")
    counter = CollisionCounter(profile.sparse_columns, profile.num_embeddings_per_feature, "hash", 0)
    counter.add([exact_counts(lake, c)["keys"] for c in profile.sparse_columns])
    logged = counter.statistics()
    for column, rows in zip(profile.columns, profile.num_embeddings_per_feature):
        predicted = collision_share(column.distinct, rows)
        assert predicted == pytest.approx(0.25, abs=0.01)
        assert logged[column.name]["colliding_fraction"] == pytest.approx(predicted, rel=0.2)


def test_sizes_meet_the_target_and_the_budget():
    assert collision_share(1, 10) == 0 and collision_share(5, 1) == 1
    assert collision_share(1001, 10**6) == pytest.approx(1 - (1 - 1e-6) ** 1000)
    for distinct, target in ((2, 0.5), (1000, 0.01), (10**7, 0.001)):
        rows = rows_for_share(distinct, target)
        assert collision_share(distinct, rows) <= target < collision_share(distinct, rows - 1)
    free = suggest_sizes([1000, 50_000], 0.01, None, 64)
    assert free.share == 0.01 and all(s <= 0.01 for s in free.shares)
    budget = free.table_bytes // 4
    tight = suggest_sizes([1000, 50_000], 0.01, budget, 64)
    assert tight.table_bytes <= budget and tight.share > 0.01
    assert max(tight.shares) == pytest.approx(tight.share, rel=1e-3)  # every feature collides alike
    assert tight.table_bytes > 0.99 * budget  # the budget is used


def test_cli_prints_the_flag_line_and_writes_json_read_back(lake, tmp_path, capsys):
    output = str(tmp_path / "profile.json")
    argv = ["--parquet_path", lake, "--time_column", "date", "--sparse_columns", COLUMNS, "--output", output]
    assert main([*argv, "--memory_gb", "0.001", "--embedding_dim", "16", "--embedding_precision", "fp16"]) == 0
    printed = capsys.readouterr().out.splitlines()
    profile = read_profile(open(output, "rb").read(), output)
    assert printed[-2] == "--num_embeddings_per_feature " + ",".join(map(str, profile.num_embeddings_per_feature))
    assert profile.table_bytes <= 0.001 * 2**30 and profile.table_bytes == sum(profile.num_embeddings_per_feature) * 32
    assert profile == profile_lake(lake, COLUMNS, "date", 0.01, 0.001, 16, "fp16")  # written and read back whole
    rewritten = str(tmp_path / "again.json")
    write_profile(profile, rewritten)
    assert json.load(open(rewritten))["version"] == 1


def test_default_columns_are_the_string_and_list_ones(lake, capsys):
    assert main(["--parquet_path", lake]) == 0
    names = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()[1:-2]]
    assert names == [f"C{i}" for i in range(1, 27, 2)] + ["M1"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sparse_columns", "C1,Z9"], "--sparse_columns Z9: no such column"),
        (["--sparse_columns", "I1,ts"], "column ts is timestamp[ms, tz=UTC], but a sparse column holds"),
        (["--sparse_columns", "C1", "--time_column", "C2"], "--time_column C2 is int64: the profile counts days"),
        (["--target_collision_share", "1.5"], "--target_collision_share must be between 0 and 1, got 1.5"),
        (["--memory_gb", "0"], "--memory_gb must be positive"),
        (["--memory_gb", "0.0000001", "--sparse_columns", "C3"], "is too little for even the smallest tables"),
    ],
)
def test_bad_input_is_one_line_exit_2(lake, capsys, argv, message):
    assert main(["--parquet_path", lake, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_missing_lake_and_an_unwritable_output(tmp_path, lake, capsys):
    assert main(["--parquet_path", str(tmp_path / "nowhere")]) == 2
    assert main(["--parquet_path", lake, "--sparse_columns", "C1", "--output", str(tmp_path / "no" / "p.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--output" in err[1]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(version=9), "version is 9, newer than this code reads"),
        (lambda d: d["columns"][0].update(distinct=10**9), "columns[0] (C1) counts 1,000,000,000 distinct ids"),
        (lambda d: d["columns"][1].pop("nulls"), "columns[1].nulls is missing"),
        (lambda d: d.update(num_embeddings_per_feature=[5]), "num_embeddings_per_feature must be 4 positive"),
        (lambda d: d["columns"][0]["new_share_by_day"].update(x=2), "columns[0].new_share_by_day must be an object"),
    ],
)
def test_a_profile_that_lies_is_refused_naming_the_field(lake, tmp_path, edit, message):
    path = str(tmp_path / "p.json")
    write_profile(profile_lake(lake, COLUMNS, "date", 0.01, None, 16, "fp32"), path)
    document = json.load(open(path))
    edit(document)
    with pytest.raises(FileFieldError, match=re.escape(message)):
        read_profile(json.dumps(document).encode(), path)


def test_list_nulls_and_empty_bags(tmp_path):
    path = str(tmp_path / "t.parquet")
    table = pa.table(
        {"M": pa.array([[1, 2], None, [], [2, None], [3]], pa.list_(pa.int64())), "S": ["a", None, "b", "a", None]}
    )
    pq.write_table(table, path)
    profile = profile_lake(path, "M,S", None, 0.1, None, 4, "fp32")
    m, s = profile.columns
    assert (m.values, m.nulls, m.distinct, m.new_share_by_day) == (4, 1, 3, {})
    assert (s.values, s.nulls, s.distinct) == (3, int(pc.sum(pc.is_null(table["S"])).as_py()), 2)
