"""python -m data.histories: every row's history against a brute-force reference over
random logs (ties, days, row groups out of time order), the output's layout and schema,
and the bad input refused in one line."""

import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.errors import EXIT_BAD_INPUT
from data import synthetic_histories
from data.histories import HistoryFlags, build_histories, main, time_blocks
from tests.support.doc_commands import commands_starting, with_flags

FLAGS = ["--user_column", "user", "--item_column", "item", "--time_column", "ts"]


def write_log(root: str, days: list[list[dict]], row_group_size: int) -> None:
    """days[d][k]: the columns of part-k of day d, written under date=2026-11-0(d+1)."""
    for d, files in enumerate(days):
        folder = os.path.join(root, f"date=2026-11-{d + 1:02d}")
        os.makedirs(folder)
        for k, columns in enumerate(files):
            pq.write_table(pa.table(columns), os.path.join(folder, f"part-{k}.parquet"), row_group_size=row_group_size)


def reference(rows: list[dict], max_history: int, positive: str | None) -> list[dict]:
    """Each row's history and past counts by brute force over the log's rows (in the log's
    order: a tie keeps it)."""
    out = []
    for row in rows:
        earlier = [
            (r["ts"], j, r)
            for j, r in enumerate(rows)
            if r["ts"] < row["ts"] and r["user"] is not None and r["user"] == row["user"]
        ]
        hit = [r for _, _, r in sorted(earlier) if r["item"] is not None and (positive is None or r[positive] == 1)]

        def past(key: str) -> tuple[int, int]:
            if row[key] is None:
                return 0, 0
            same = [r for r in rows if r["ts"] < row["ts"] and r[key] == row[key]]
            return len(same), sum(1 for r in same if positive is None or r[positive] == 1)

        user, item = past("user"), past("item")
        out.append(
            {
                "item_history": [r["item"] for r in hit][-max_history:] if row["user"] is not None else [],
                "user_past_events": user[0],
                "user_past_positives": user[1],
                "user_past_positive_rate": user[1] / user[0] if user[0] else None,
                "item_past_events": item[0],
                "item_past_positives": item[1],
                "item_past_positive_rate": item[1] / item[0] if item[0] else None,
            }
        )
    return out


def read_rows(root: str) -> list[dict]:
    """The rows of every file under root in path order, with their date partition."""
    rows = []
    for folder in sorted(os.listdir(root)):
        for name in sorted(os.listdir(os.path.join(root, folder))):
            for row in pq.read_table(os.path.join(root, folder, name)).to_pylist():
                rows.append({**row, "date": folder})
    return rows


@st.composite
def logs(draw):
    """Days of 1 or 2 files of up to 12 rows: 4 users and 6 items (some null), times with
    ties, a day's files overlapping in time, rows in no time order within a file."""
    days = []
    as_text = draw(st.booleans())  # items as strings or integers (two lookups of ids)
    for d in range(draw(st.integers(1, 3))):
        files = []
        for _ in range(draw(st.integers(1, 2))):
            n = draw(st.integers(0, 12))
            ids = st.one_of(st.none(), st.integers(0, 3))
            files.append(
                {
                    "user": pa.array(draw(st.lists(ids, min_size=n, max_size=n)), pa.int64()),
                    "item": pa.array(
                        [
                            None if i is None else f"film{i}" if as_text else 1000 * i - 2000
                            for i in draw(st.lists(ids, min_size=n, max_size=n))
                        ],
                        pa.string() if as_text else pa.int64(),
                    ),
                    "ts": pa.array(draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)), pa.int64())
                    if d == 0 or not draw(st.booleans())
                    else pa.array(
                        [10 * d + t for t in draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))], pa.int64()
                    ),
                    "label": pa.array(draw(st.lists(st.sampled_from([0, 1, None]), min_size=n, max_size=n)), pa.int8()),
                }
            )
        days.append(files)
    return days, draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.booleans())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs())
def test_every_history_equals_the_brute_force_one_and_holds_only_earlier_events(log):
    days, row_group_size, max_history, with_label = log
    with tempfile.TemporaryDirectory() as tmp:
        source, out = os.path.join(tmp, "in"), os.path.join(tmp, "out")
        write_log(source, days, row_group_size)
        positive = "label" if with_label else None
        flags = HistoryFlags(source, out, "user", "item", "ts", positive, max_history, aggregates=True)
        if not sum(len(c["ts"]) for files in days for c in files):
            return  # an empty log is refused (tested below)
        summary = build_histories(flags)
        given_rows, written = read_rows(source), read_rows(out)
        assert summary.rows == len(given_rows) == len(written)
        expected = reference(given_rows, max_history, positive)
        for row, got, want in zip(given_rows, written, expected):
            assert {k: got[k] for k in row} == row  # the row itself unchanged
            assert {k: got[k] for k in want} == want, (row, got)
            # the property itself: each history item is as many times in it as the user
            # had positive events of it strictly before the row's time, or fewer
            for item in set(got["item_history"]):
                earlier = [
                    r
                    for r in given_rows
                    if r["user"] == row["user"] and r["item"] == item and r["ts"] < row["ts"]
                    if positive is None or r[positive] == 1
                ]
                assert got["item_history"].count(item) <= len(earlier)


def test_no_history_holds_an_event_at_or_after_its_time(tmp_path):
    """Ties: events of one user at one time see none of each other; the next time sees all."""
    write_log(
        str(tmp_path / "in"),
        [[{"user": [7, 7, 7, 7], "item": [1, 2, 3, 4], "ts": [5, 5, 5, 6]}]],
        row_group_size=1,
    )
    build_histories(HistoryFlags(str(tmp_path / "in"), str(tmp_path / "out"), "user", "item", "ts"))
    got = pq.read_table(tmp_path / "out" / "date=2026-11-01" / "part-0.parquet").column("item_history").to_pylist()
    assert got == [[], [], [], [1, 2, 3]]


def test_a_users_history_spans_days_and_a_date_partition_as_time(tmp_path):
    """With --time_column date (the partition), a day's events are all ties: each day sees
    the days before, newest last, truncated."""
    days = [[{"user": [1, 1], "item": [10, 11]}], [{"user": [1, 2], "item": [12, 13]}], [{"user": [1], "item": [14]}]]
    write_log(str(tmp_path / "in"), days, row_group_size=1)
    build_histories(HistoryFlags(str(tmp_path / "in"), str(tmp_path / "out"), "user", "item", "date", max_history=2))
    assert [r["item_history"] for r in read_rows(str(tmp_path / "out"))] == [[], [], [10, 11], [], [11, 12]]


def test_layout_and_schema_follow_the_input(tmp_path):
    """Same files under the same paths, the same row groups, each file's own columns then
    the new ones (the partition column stays a directory)."""
    ts = pa.array(np.arange(6) * 1000, pa.timestamp("ms", tz="UTC"))
    columns = {"ts": ts, "user": pa.array(["a", "b"] * 3), "item": pa.array([5, 6, 7, 5, 6, 7], pa.int32())}
    next_day = {**columns, "ts": pa.array(np.arange(6) * 1000 + 86_400_000, pa.timestamp("ms", tz="UTC"))}
    write_log(str(tmp_path / "in"), [[columns, columns], [next_day]], row_group_size=4)
    code = main(
        [
            "--parquet_path",
            str(tmp_path / "in"),
            "--output_dir",
            str(tmp_path / "out"),
            *FLAGS,
            "--aggregates",
        ]
    )
    assert code == 0
    found = sorted(
        os.path.relpath(os.path.join(d, f), tmp_path / "out") for d, _, fs in os.walk(tmp_path / "out") for f in fs
    )
    assert found == [
        "date=2026-11-01/part-0.parquet",
        "date=2026-11-01/part-1.parquet",
        "date=2026-11-02/part-0.parquet",
    ]
    written = pq.ParquetFile(tmp_path / "out" / "date=2026-11-01" / "part-1.parquet")
    assert [written.metadata.row_group(g).num_rows for g in range(written.num_row_groups)] == [4, 2]
    schema = written.schema_arrow
    assert schema.names == [
        "ts",
        "user",
        "item",
        "item_history",
        "user_past_events",
        "user_past_positives",
        "user_past_positive_rate",
        "item_past_events",
        "item_past_positives",
        "item_past_positive_rate",
    ]
    assert schema.field("ts").type == pa.timestamp("ms", tz="UTC")
    assert schema.field("item_history").type == pa.list_(pa.int32())
    assert (
        schema.field("user_past_events").type == pa.int64()
        and schema.field("item_past_positive_rate").type == pa.float64()
    )
    # part-1 repeats part-0's times: each row sees both files' earlier rows, part-0's first
    assert written.read().column("item_history").to_pylist() == [[], [], [5, 5], [6, 6], [5, 5, 7, 7], [6, 6, 5, 5]]
    following = pq.read_table(tmp_path / "out" / "date=2026-11-02" / "part-0.parquet")
    assert following.column("item_history").to_pylist()[0] == [5, 5, 7, 7, 6, 6]
    assert following.column("user_past_events").to_pylist()[:2] == [6, 6]
    assert following.column("item_past_positive_rate").to_pylist()[:2] == [1.0, 1.0]


def test_time_blocks_join_overlapping_row_groups_only():
    """(0, 5) and (3, 6) overlap: one block; (6, 9) touches it: a block of its own, whose
    rows at 6 the state's held events keep from seeing the block before's rows at 6."""
    bounds = [[(0, 5), (6, 9)], [(3, 6), (13, 20)], [(7, 7)]]
    counts = [[1, 1], [1, 1], [0]]
    assert time_blocks(bounds, counts) == [[(2, 0)], [(0, 0), (1, 0)], [(0, 1)], [(1, 1)]]


def test_ties_across_row_groups_cut_no_block_and_see_nothing_of_each_other(tmp_path):
    """A log sorted by whole seconds, a tie across every row-group boundary: the blocks
    are single row groups, and the tied rows still do not see each other."""
    write_log(
        str(tmp_path / "in"),
        [[{"user": [1] * 6, "item": [10, 11, 12, 13, 14, 15], "ts": [1, 2, 2, 2, 3, 3]}]],
        row_group_size=2,
    )
    summary = build_histories(HistoryFlags(str(tmp_path / "in"), str(tmp_path / "out"), "user", "item", "ts"))
    assert summary.largest_block_rows == 3 + 2  # the last row group and the 3 held rows at time 2
    got = [r["item_history"] for r in read_rows(str(tmp_path / "out"))]
    assert got == [[], [10], [10], [10], [10, 11, 12, 13], [10, 11, 12, 13]]


def bad(tmp_path, capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == EXIT_BAD_INPUT and len(lines) == 1 and lines[0].startswith("python -m data.histories: error: "), err
    return lines[0]


@pytest.fixture()
def log_dir(tmp_path):
    columns = {
        "ts": pa.array([1, 2], pa.int64()),
        "when": pa.array(["x", "y"]),
        "user": pa.array([1, 2]),
        "item": pa.array([3, 4]),
        "bag": pa.array([[3], [4]]),
        "label": pa.array(["yes", "no"]),
    }
    write_log(str(tmp_path / "in"), [[columns]], row_group_size=2)
    return str(tmp_path / "in")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"--user_column": "visitor"}, "--user_column visitor: no such column"),
        ({"--time_column": "when"}, "--time_column when is string, which has no order in time"),
        ({"--item_column": "bag"}, "--item_column bag is list<element: int64>: a list"),
        ({"--positive_column": "label"}, "--positive_column label is string"),
    ],
)
def test_bad_columns_are_one_line(log_dir, tmp_path, capsys, change, message):
    flags = dict(zip(FLAGS[::2], FLAGS[1::2]))
    flags.update(change)
    argv = ["--parquet_path", log_dir, "--output_dir", str(tmp_path / "out")]
    line = bad(tmp_path, capsys, argv + [word for pair in flags.items() for word in pair])
    assert message in line and "part-0.parquet" in line
    assert not os.path.exists(tmp_path / "out")


def test_an_existing_output_is_refused_unless_overwrite(log_dir, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    argv = ["--parquet_path", log_dir, "--output_dir", str(out), *FLAGS]
    assert "not empty; give a new or empty directory, or --overwrite" in bad(tmp_path, capsys, argv)
    assert (out / "keep.txt").read_text() == "mine"
    assert main([*argv, "--overwrite"]) == 0
    assert sorted(os.listdir(out)) == ["date=2026-11-01"]


def test_an_output_inside_the_input_and_a_url_with_credentials_are_refused(log_dir, tmp_path, capsys):
    inside = ["--parquet_path", log_dir, "--output_dir", os.path.join(log_dir, "out"), *FLAGS]
    assert "is inside --parquet_path" in bad(tmp_path, capsys, inside)
    secret = ["--parquet_path", "s3://KEY:hush@bucket/log", "--output_dir", str(tmp_path / "out"), *FLAGS]
    line = bad(tmp_path, capsys, secret)
    assert "credentials in a URL" in line and "hush" not in line


def test_a_null_time_names_file_row_group_row_and_column(tmp_path, capsys):
    columns = {"ts": pa.array([1, None, 3], pa.int64()), "user": pa.array([1, 1, 1]), "item": pa.array([1, 2, 3])}
    write_log(str(tmp_path / "in"), [[columns]], row_group_size=2)
    argv = ["--parquet_path", str(tmp_path / "in"), "--output_dir", str(tmp_path / "out"), *FLAGS]
    line = bad(tmp_path, capsys, argv)
    assert "part-0.parquet: row group 0, row 1, column ts: the time is null" in line
    assert not os.path.exists(tmp_path / "out")


def test_the_documented_lines_run(tmp_path, monkeypatch, capsys):
    """docs/data.md's Histories block, on 4 days of 500 rows: generate, then build the
    histories and aggregates it names, in the directories it names."""
    (generate,) = commands_starting("docs/data.md", "python", "-m", "data.synthetic_histories")
    (histories,) = commands_starting("docs/data.md", "python", "-m", "data.histories")
    monkeypatch.chdir(tmp_path)
    assert synthetic_histories.main(with_flags(generate, ["--rows_per_day", "500", "--users", "50"])[3:]) == 0
    assert main(histories[3:]) == 0
    out = capsys.readouterr().out
    assert "histories: 2000 rows in 4 files at data_cache/sessions_history" in out
    written = pq.read_table(tmp_path / "data_cache" / "sessions_history")
    assert {"item_id_history", "user_id_past_positive_rate", "item_id_past_events"} <= set(written.schema.names)
    assert max(len(h) for h in written.column("item_id_history").to_pylist()) > 1


def test_row_groups_out_of_time_order_keep_their_file_order(tmp_path):
    """A file whose later row group holds earlier times: that row group's block comes
    first, and its new columns wait until the one before it in the file is written."""
    columns = {"user": [1, 1, 1, 1], "item": [30, 31, 10, 11], "ts": [30, 31, 10, 11]}
    write_log(str(tmp_path / "in"), [[columns]], row_group_size=2)
    build_histories(HistoryFlags(str(tmp_path / "in"), str(tmp_path / "out"), "user", "item", "ts"))
    written = pq.ParquetFile(tmp_path / "out" / "date=2026-11-01" / "part-0.parquet")
    assert written.metadata.num_row_groups == 2
    table = written.read()
    assert table.column("ts").to_pylist() == [30, 31, 10, 11]
    assert table.column("item_history").to_pylist() == [[10, 11], [10, 11, 30], [], [10]]


def test_a_tie_across_blocks_keeps_the_logs_order(tmp_path):
    """part-1's first row group (times 3 to 5) comes before part-0's (time 5) in time, so
    their events at 5 meet as a block and the held tie before it: in a later history
    they stand in the log's order, part-0's first."""
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(pa.table({"user": [1], "item": [50], "ts": [5]}), folder / "part-0.parquet")
    later = pa.table({"user": [1, 1, 1], "item": [30, 51, 60], "ts": [3, 5, 6]})
    pq.write_table(later, folder / "part-1.parquet", row_group_size=2)
    build_histories(HistoryFlags(str(folder), str(tmp_path / "out"), "user", "item", "ts"))
    last = pq.read_table(tmp_path / "out" / "part-1.parquet").column("item_history").to_pylist()[-1]
    assert last == [30, 50, 51]
