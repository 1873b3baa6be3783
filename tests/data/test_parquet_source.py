"""--parquet_path: discovery, splits, the per-rank streaming loader, refusals (in process,
over small Parquet tables written here)."""

import contextlib
import dataclasses
import os
import threading
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.config_flags import FlagError
from common.errors import BadInput
from data.config import DataConfig
from data.parquet.feed import NICE, default_workers, pins_batches, yields_to_training
from data.parquet.id_collisions import CollisionCounter
from data.parquet.id_hashing import embedding_rows, integer_keys
from data.parquet.loader import ParquetLoader, ParquetValueError
from data.parquet.windows import parse_window
from data.sources import source_for
from data.sources.types import FeedJob
from tests.support.thread_ranks import ThreadRanks

# Very different file sizes, and row groups of 1 row among them.
FILE_ROWS = (1, 57, 3, 0, 23, 9)
ROW_GROUP_ROWS = (1, 5, 1, 1, 4, 1)


def _rows(first: int, n: int, rng: np.random.Generator) -> dict[str, pa.Array]:
    return {
        "label": pa.array(rng.integers(0, 2, n), pa.int64()),
        "rid": pa.array(np.arange(first, first + n, dtype=np.float64)),  # the row's identity
        "I2": pa.array(rng.random(n)),
        "C1": pa.array([f"v{v}" for v in rng.integers(0, 40, n)], pa.string()),
        "C2": pa.array(rng.integers(0, 10**12, n), pa.int64()),
        "M1": pa.array([list(rng.integers(0, 100, rng.integers(0, 4))) for _ in range(n)], pa.list_(pa.int64())),
        "ts": pa.array(
            np.datetime64("2026-11-01") + rng.integers(0, 10 * 86400, n).astype("timedelta64[s]"), pa.timestamp("s")
        ),
    }


def _write_table(
    root: str, file_rows: Sequence[int] = FILE_ROWS, row_groups: Sequence[int] = ROW_GROUP_ROWS, seed: int = 0
) -> int:
    rng = np.random.default_rng(seed)
    first = 0
    for i, (rows, group) in enumerate(zip(file_rows, row_groups)):
        os.makedirs(root, exist_ok=True)
        pq.write_table(
            pa.table(_rows(first, rows, rng)), os.path.join(root, f"part-{i:02d}.parquet"), row_group_size=group
        )
        first += rows
    return first


def _config(path: str, **flags) -> DataConfig:
    values = dict(
        parquet_path=path, dense_columns="rid,I2", sparse_columns="C1,C2,M1", dense_transform="none", batch_size=4
    )
    values.update(flags)
    config = DataConfig.from_flags(**values)
    config.validate()
    return config


def _loaders(config: DataConfig, rank: int = 0, world_size: int = 1):
    source = source_for(config)
    return source.loaders(source.open(), [97, 1000, 50], rank, world_size)


def _rids(batch) -> list[int]:
    return [int(v) for v in batch.dense_features[:, 0]]


def _epoch(loader, epoch: int = 0, start: int = 0) -> list[list[int]]:
    loader.set_epoch(epoch, start)
    return [_rids(b) for b in loader]


def _rank_loader(config: DataConfig, rank: int, world_size: int, split: str = "train", **options) -> ParquetLoader:
    """A rank's loader of ``split``, as the source builds it, with ``options`` (agree,
    job, workers) of its own."""
    source = source_for(config)
    dataset = source.open()
    built = source.loaders(dataset, [97, 1000, 50], rank, world_size)[split]
    return ParquetLoader(
        dataset,
        dataset.splits[split],
        built._columns,
        batch_size=config.batch_size,
        rank=rank,
        world_size=world_size,
        shuffle_seed=config.seed if config.shuffle_training_set and split == "train" else None,
        max_buffered_row_groups=config.max_buffered_row_groups,
        **options,
    )


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("world_size", [2, 3])
def test_an_epoch_reads_the_same_rows_at_every_world_size(tmp_path, world_size, shuffle):
    """Each rank reads its own share of the epoch's rows: W ranks take the same number of
    equal batches, as many steps as one rank with a W times larger batch, and together
    the rows one rank reads (but the fewer than W left over), each once, in every split."""
    _write_table(str(tmp_path))
    flags = dict(shuffle_training_set=shuffle, validation_window="0.2", test_window="0.2")
    alone = _loaders(_config(str(tmp_path), batch_size=3 * world_size, test_batch_size=3 * world_size, **flags))
    ranks = [
        _loaders(_config(str(tmp_path), batch_size=3, test_batch_size=3, **flags), rank, world_size)
        for rank in range(world_size)
    ]
    for split in ("train", "validation", "test"):
        one = _epoch(alone[split])
        per_rank = [_epoch(loaders[split]) for loaders in ranks]
        steps = len(per_rank[0])
        assert {len(r) for r in per_rank} == {steps}  # the same number of batches on every rank
        # As many steps as one rank's, but a final global batch of fewer rows than ranks.
        assert all(len(big) < world_size for big in one[steps:]) and len(one) - steps <= 1
        for step in range(steps):
            assert len({len(rank[step]) for rank in per_rank}) == 1  # equal batches (the last shared evenly)
            assert len(one[step]) - world_size * len(per_rank[0][step]) < world_size
        rows = [rid for rank in per_rank for batch in rank for rid in batch]
        everything = [rid for batch in one for rid in batch]
        assert len(set(rows)) == len(rows) and set(rows) <= set(everything)
        assert len(everything) - len(rows) == len(everything) % world_size


def test_two_ranks_decode_each_row_of_the_split_once(tmp_path):
    """The reader's own counters: the rows two ranks converted are the split's rows (1.0
    of them, not 2.0 as when every rank checked the whole global batch), and pyarrow
    decoded at most the row group the two shares straddle twice."""
    _write_table(str(tmp_path), file_rows=(40, 24), row_groups=(7, 5))
    config = _config(str(tmp_path), batch_size=5, validation_window="0.1", test_window="0.1")
    rows = source_for(config).open().num_rows("train")
    assert rows % 2 == 0
    loaders = [_rank_loader(config, rank, 2) for rank in range(2)]
    for loader in loaders:
        list(loader)
    counters = [loader.statistics()["reader"] for loader in loaders]
    assert sum(c["rows_decoded"] for c in counters) / rows == 1.0
    one = _rank_loader(config, 0, 1)
    list(one)
    alone = one.statistics()["reader"]
    assert alone["rows_decoded"] == rows and rows <= alone["rows_read"]
    assert alone["rows_read"] <= sum(c["rows_read"] for c in counters) <= alone["rows_read"] + 7
    assert alone["bytes_read"] <= sum(c["bytes_read"] for c in counters)


def test_resume_at_another_world_size_reads_the_rest_of_the_epoch(tmp_path):
    """Two ranks read 3 batches of a shuffled epoch; resumed there on one rank or three
    (the same global batch of 6 rows), the epoch's other rows follow, each once."""
    _write_table(str(tmp_path))
    config = _config(str(tmp_path), batch_size=3, shuffle_training_set=True)
    epoch = sorted(
        r for b in _epoch(_loaders(_config(str(tmp_path), batch_size=6, shuffle_training_set=True))["train"]) for r in b
    )
    read = [rid for rank in range(2) for batch in list(_rank_loader(config, rank, 2))[:3] for rid in _rids(batch)]
    for world_size in (1, 3):
        resumed = dataclasses.replace(config, batch_size=6 // world_size)
        rest = []
        for rank in range(world_size):
            loader = _rank_loader(resumed, rank, world_size, job=lambda: FeedJob(resumed_world_size=2))
            loader.set_epoch(0, 3)
            batches = [_rids(b) for b in loader]
            assert len(batches) == len(loader) - 3
            rest += [rid for batch in batches for rid in batch]
        rows = read + rest
        assert len(set(rows)) == len(rows) and set(rows) <= set(epoch)
        assert len(epoch) - len(rows) < world_size * 2


def _joined_loaders(config: DataConfig, rank: int, world_size: int, **job) -> tuple[dict, str | None, DataConfig]:
    """A rank's loaders of every split, made as the trainer makes them: the source joins
    the job first (which resolves --epoch_shares into the flags); the line it says, and
    the rank's own copy of the flags."""
    config = dataclasses.replace(config, source_options=dataclasses.replace(config.source_options))
    source = source_for(config)
    note = source.join_job(FeedJob(world_size=world_size, **job))
    return source.loaders(source.open(), [97, 1000, 50], rank, world_size), note, config


def _ranks_epoch(
    config: DataConfig, world_size: int, split: str, start: int = 0, epoch: int = 0, **job
) -> list[list[int]]:
    """The global batches W ranks read (each rank's rows, rank after rank), from ``start``."""
    per_rank = [
        _epoch(_joined_loaders(config, r, world_size, **job)[0][split], epoch, start) for r in range(world_size)
    ]
    assert len({len(batches) for batches in per_rank}) == 1
    return [[rid for rank in per_rank for rid in rank[k]] for k in range(len(per_rank[0]))]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("shares, world_size", [(2, 2), (4, 2)])
def test_one_rank_with_the_shares_of_several_reads_their_global_batches(tmp_path, shares, world_size, shuffle):
    """--epoch_shares S: one rank reads at every step exactly the rows W ranks read with
    the same S, rank 0's rows then rank 1's, in every split (a small shuffle window, so
    that a rank's shares are read side by side from windows of their own)."""
    _write_table(str(tmp_path))
    flags = dict(
        shuffle_training_set=shuffle,
        validation_window="0.2",
        test_window="0.2",
        max_buffered_row_groups=2,
        epoch_shares=shares,
    )
    alone = _config(str(tmp_path), batch_size=8, test_batch_size=4, **flags)
    ranks = _config(str(tmp_path), batch_size=8 // world_size, test_batch_size=4 // world_size, **flags)
    for split in ("train", "validation", "test"):
        one = _epoch(_joined_loaders(alone, 0, 1)[0][split])
        assert one == _ranks_epoch(ranks, world_size, split)
        rows = [rid for batch in one for rid in batch]
        assert len(set(rows)) == len(rows) and len(one[0]) == (8 if split == "train" else 4)
    # Shuffled, the order is not the one of S = W ranks (the shares are the unit, not the ranks).
    default = _epoch(_loaders(_config(str(tmp_path), batch_size=8, **{**flags, "epoch_shares": None}))["train"])
    assert (default != _epoch(_joined_loaders(alone, 0, 1)[0]["train"])) == (shuffle or shares > 1)


@pytest.mark.parametrize(
    "shares, world_size, batch_size, test_batch_size, message",
    [
        (3, 2, 3, None, "--epoch_shares 3 must be a multiple of the 2 ranks"),
        (4, 2, 3, None, "--epoch_shares 4 must divide the global batch: --batch_size 3 x 2 rank(s) = 6 rows"),
        (2, 1, 4, 3, "--epoch_shares 2 must divide the global batch: --test_batch_size 3 x 1 rank(s) = 3 rows"),
    ],
)
def test_epoch_shares_refused_at_start_up(tmp_path, shares, world_size, batch_size, test_batch_size, message):
    """Refused when the job joins and when the loaders are made (with --rolling_windows
    before any collective), one line naming the flag."""
    _write_table(str(tmp_path))
    config = _config(str(tmp_path), batch_size=batch_size, test_batch_size=test_batch_size, epoch_shares=shares)
    source = source_for(config)
    with pytest.raises(FlagError) as joined:
        source.join_job(FeedJob(world_size=world_size))
    with pytest.raises(FlagError) as made:
        source.loaders(source.open(), [97, 1000, 50], 0, world_size)
    assert str(joined.value) == str(made.value) == message
    with pytest.raises(FlagError, match="--epoch_shares must be at least 1, got 0"):
        DataConfig.from_flags(parquet_path=str(tmp_path), sparse_columns="C1", epoch_shares=0).validate()


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_resume_at_another_world_size_keeps_the_checkpoints_shares(tmp_path, shuffle):
    """Two ranks (S = 2 by default) read 3 batches; resumed there on one rank, the run
    keeps S = 2 (and records it in the flags): the rest of the epoch is the two ranks'
    batches from batch 3 on, step for step, and the next epoch too. Resumed on three
    ranks, S = 2 cannot be kept: the line says so, and the rest is each row once."""
    _write_table(str(tmp_path))
    config = _config(str(tmp_path), batch_size=3, shuffle_training_set=shuffle)
    two = _ranks_epoch(config, 2, "train")
    one = dataclasses.replace(config, batch_size=6)
    loaders, note, recorded = _joined_loaders(one, 0, 1, resumed_world_size=2, resumed_epoch_shares=2)
    assert note is None and loaders["train"].shares() == 2 and recorded.epoch_shares == 2
    assert _epoch(loaders["train"], 0, 3) == two[3:]
    assert _epoch(loaders["train"], 1) == _ranks_epoch(config, 2, "train", epoch=1)
    # An older checkpoint records no shares: its world size's.
    assert _ranks_epoch(one, 1, "train", 3, resumed_world_size=2) == two[3:]
    three = dataclasses.replace(config, batch_size=2)
    loaders, note, recorded = _joined_loaders(three, 0, 3, resumed_world_size=2, resumed_epoch_shares=2)
    assert note is not None and note.startswith("the checkpoint's run cut its epochs into 2 shares (--epoch_shares)")
    assert recorded.epoch_shares == 3
    rest = _ranks_epoch(three, 3, "train", 3, resumed_world_size=2, resumed_epoch_shares=2)
    rows = [rid for batch in two[:3] + rest for rid in batch]
    epoch = [rid for batch in two for rid in batch]
    assert len(set(rows)) == len(rows) and len(rows) >= len(epoch) - 2  # each once, but the fewer than 3 left over
    assert set(rows) <= set(range(source_for(config).open().num_rows("train")))


def test_workers_convert_the_same_batches_in_order(tmp_path):
    """Three converting threads hand out the batches one thread does, bit for bit, in
    order; on CPU they run at a lower priority than the thread that iterates."""
    import torch

    _write_table(str(tmp_path))
    config = _config(str(tmp_path), shuffle_training_set=True, weight_column="I2", dense_columns="rid")
    niceness = []

    def batches(workers: int) -> list:
        out = []
        for batch in _rank_loader(config, 0, 1, workers=workers):
            for thread in threading.enumerate():
                if thread.name.startswith("parquet-") and thread.native_id is not None:
                    with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                        niceness.append(os.getpriority(os.PRIO_PROCESS, thread.native_id))
            out.append(batch)
        return out

    one, three = batches(1), batches(3)
    assert len(one) == len(three)
    for a, b in zip(one, three):
        assert torch.equal(a.dense_features, b.dense_features) and torch.equal(a.labels, b.labels)
        assert torch.equal(a.sparse_features.values(), b.sparse_features.values())
        assert torch.equal(a.sparse_features.lengths(), b.sparse_features.lengths())
        assert torch.equal(a.weights, b.weights) and torch.equal(a.weight_normalizer, b.weight_normalizer)
    main = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert niceness and min(niceness) == min(19, main + NICE)


def test_what_the_job_decides_of_the_feed():
    """CUDA batches are pinned by the workers, CPU ones are not; on CPU the feed yields
    the cores to training; unset, --data_workers is the rank's share of the cores."""
    assert pins_batches("cuda") and not pins_batches("cpu")
    assert yields_to_training("cpu") and not yields_to_training("cuda")
    assert [default_workers(n, cores=16) for n in (1, 2, 8, 32)] == [16, 8, 2, 1]


def test_data_workers_default_to_the_ranks_share_of_the_cores(tmp_path):
    from common.cores import rank_cpu_share

    _write_table(str(tmp_path))
    config = _config(str(tmp_path))
    source = source_for(config)
    loader = source.loaders(source.open(), [97, 1000, 50], 0, 2)["train"]
    source.join_job(FeedJob(local_world_size=2))
    assert loader.workers() == rank_cpu_share(2) and loader.prefetch_depth() == max(2, 2 * rank_cpu_share(2))
    source = source_for(_config(str(tmp_path), data_workers=3))
    assert source.loaders(source.open(), [97, 1000, 50], 0, 2)["train"].workers() == 3


def test_every_training_row_once_in_file_order(tmp_path):
    _write_table(str(tmp_path))
    config = _config(str(tmp_path))
    rows = [rid for batch in _epoch(_loaders(config)["train"]) for rid in batch]
    dataset = source_for(config).open()
    assert rows == list(range(dataset.num_rows("train")))  # files in path order, row groups, rows


def test_start_batch_skips_exactly(tmp_path):
    _write_table(str(tmp_path))
    loader = _loaders(_config(str(tmp_path), shuffle_training_set=True))["train"]
    whole = _epoch(loader, epoch=1)
    assert _epoch(loader, epoch=1, start=5) == whole[5:]


def test_shuffle_is_deterministic_and_per_epoch(tmp_path):
    _write_table(str(tmp_path))
    first = _epoch(_loaders(_config(str(tmp_path), shuffle_training_set=True))["train"])
    again = _epoch(_loaders(_config(str(tmp_path), shuffle_training_set=True))["train"])
    other_epoch = _epoch(_loaders(_config(str(tmp_path), shuffle_training_set=True))["train"], epoch=1)
    plain = _epoch(_loaders(_config(str(tmp_path)))["train"])
    assert first == again
    assert first != other_epoch
    flat = sorted(r for b in first for r in b)
    assert flat == sorted(r for b in plain for r in b) and first != plain


def test_multi_hot_bags_and_hashing(tmp_path):
    _write_table(str(tmp_path), file_rows=(6,), row_groups=(6,))
    table = pq.read_table(str(tmp_path / "part-00.parquet"))
    batch = next(iter(_loaders(_config(str(tmp_path), validation_window="0.1", test_window="0.1"))["train"]))
    kjt = batch.sparse_features.to_dict()
    bags = table.column("M1").to_pylist()[:4]
    assert kjt["M1"].lengths().tolist() == [len(b) for b in bags]
    expected = embedding_rows(integer_keys(np.array([v for b in bags for v in b], dtype=np.int64)), 0, 50)
    assert kjt["M1"].values().tolist() == expected.tolist()


def test_time_split_never_leaks(tmp_path):
    _write_table(str(tmp_path))
    config = _config(str(tmp_path), time_column="ts", validation_window="2d", test_window="1d")
    times = pq.read_table(str(tmp_path), columns=["ts"]).column("ts").to_numpy()
    # Read back with every partition as a column of its own file order.
    loaders = _loaders(config)
    dataset = source_for(config).open()
    ranges = dataset.time_ranges()
    seen = {split: [r for b in _epoch(loader) for r in b] for split, loader in loaders.items()}
    order = np.concatenate(
        [
            pq.read_table(str(tmp_path / f"part-{i:02d}.parquet"), columns=["ts"]).column("ts").to_numpy()
            for i in range(len(FILE_ROWS))
        ]
    )
    assert len(order) == len(times)
    validation_start = np.datetime64(ranges["validation"][0])
    test_start = np.datetime64(ranges["test"][0])
    assert all(order[r] < validation_start for r in seen["train"])
    assert all(validation_start <= order[r] < test_start for r in seen["validation"])
    assert all(order[r] >= test_start for r in seen["test"])
    assert test_start == np.datetime64(ranges["test"][1]) - np.timedelta64(1, "D")
    assert sum(len(v) for v in seen.values()) == len(order) - 0  # eval splits keep every row (no drop_last)


def test_hive_date_partitions_test_on_the_last_day(tmp_path):
    rng = np.random.default_rng(1)
    for day, rows in enumerate((5, 8, 3, 4)):
        folder = tmp_path / f"date=2026-11-0{day + 1}"
        folder.mkdir()
        pq.write_table(pa.table(_rows(day * 100, rows, rng)), str(folder / "part-0.parquet"), row_group_size=2)
    config = _config(str(tmp_path), time_column="date", batch_size=2)
    dataset = source_for(config).open()
    assert dataset.time_ranges() == {
        "train": ("2026-11-01", "2026-11-03"),
        "validation": ("2026-11-03", "2026-11-04"),
        "test": ("2026-11-04", "2026-11-05"),
    }
    assert [dataset.num_rows(s) for s in ("train", "validation", "test")] == [13, 3, 4]
    test_rows = [r for b in _epoch(_loaders(config)["test"]) for r in b]
    assert test_rows == [300, 301, 302, 303]


def test_glob_single_file_and_file_url(tmp_path):
    _write_table(str(tmp_path))
    for path, rows in (
        (str(tmp_path / "part-0[12].parquet"), 60),
        (str(tmp_path / "part-01.parquet"), 57),
        ("file://" + str(tmp_path), sum(FILE_ROWS)),
    ):
        dataset = source_for(_config(path)).open()
        assert sum(dataset.num_rows(s) for s in ("train", "validation", "test")) == rows


@pytest.mark.parametrize(
    "pattern, path, matches",
    [
        ("lake/*.parquet", "lake/date=2026-11-01/part-0.parquet", False),
        ("lake/*/part-?.parquet", "lake/date=2026-11-01/part-0.parquet", True),
        ("lake/**/*.parquet", "lake/a.parquet", True),
        ("lake/**/*.parquet", "lake/x/y/a.parquet", True),
        ("lake/**/*.parquet", "lake/x/_tmp/a.parquet", False),
        ("lake/*", "lake/.crc", False),
        ("lake/part-0[!12].parquet", "lake/part-01.parquet", False),
        ("lake/part-0[!12].parquet", "lake/part-03.parquet", True),
        ("lake/[]x].p", "lake/].p", True),
        ("lake/[^x].p", "lake/^.p", True),
        ("lake/[[]x", "lake/[x", True),
        ("lake/a[b", "lake/a[b", True),
        ("lake/a.b", "lake/aXb", False),
    ],
)
def test_glob_regex(pattern, path, matches):
    from data.parquet.files import glob_regex

    assert bool(glob_regex(pattern).fullmatch(path)) is matches


def test_globs_have_path_semantics(tmp_path):
    """``*`` stays within a path segment, ``**`` crosses them, a matched directory is read
    as a directory is (hidden names skipped), and no wildcard matches a hidden name."""
    from data.parquet.files import list_files

    lake = tmp_path / "lake"
    for day in ("2026-11-01", "2026-11-02", "2026-11-03"):
        _write_table(str(lake / f"date={day}"), file_rows=(3, 4), row_groups=(3, 4))
    (lake / "date=2026-11-01" / "_SUCCESS").write_text("")
    (lake / "_tmp").mkdir()
    pq.write_table(pa.table(_rows(0, 2, np.random.default_rng(1))), str(lake / "_tmp" / "part-00.parquet"))
    pq.write_table(pa.table(_rows(0, 2, np.random.default_rng(1))), str(lake / "top.parquet"))

    def listed(pattern):
        return [os.path.relpath(f, lake) for f in list_files(str(lake / pattern))[2]]

    assert listed("*.parquet") == ["top.parquet"]  # fnmatch's * crossed / and read every partition
    every = [f"date=2026-11-0{d}/part-0{p}.parquet" for d in (1, 2, 3) for p in (0, 1)]
    assert listed("**/part-*.parquet") == every  # _tmp/ is hidden from wildcards
    assert listed("date=*") == every  # directories matched: read as directories
    assert listed("date=2026-11-0[12]/") == every[:4]
    assert listed("*/part-01.parquet") == every[1::2]
    assert listed("**") == every + ["top.parquet"]
    dataset = source_for(
        _config(str(lake / "date=*"), time_column="date", validation_window="1d", test_window="1d")
    ).open()  # the partitions are columns below the glob too
    assert [f.partitions["date"].isoformat() for f in dataset.footers] == [f"2026-11-0{d}" for d in (1, 1, 2, 2, 3, 3)]
    with pytest.raises(BadInput, match="no Parquet file there"):
        list_files(str(lake / "*.csv"))


def _bad_type(root):
    t = pa.table(_rows(0, 4, np.random.default_rng(0))).set_column(3, "C1", pa.array([1.5] * 4))
    pq.write_table(t, os.path.join(root, "part-00.parquet"))
    return "part-00.parquet: column C1 is double, but a sparse column holds integer or string ids"


def _type_change(root):
    _write_table(root, file_rows=(4,), row_groups=(4,))
    t = pa.table(_rows(4, 4, np.random.default_rng(0)))
    t = t.set_column(4, "C2", pa.array([str(v) for v in t.column("C2").to_pylist()]))
    pq.write_table(t, os.path.join(root, "part-01.parquet"))
    return "part-01.parquet: column C2 is string, but"


def _missing(root):
    pq.write_table(
        pa.table(_rows(0, 4, np.random.default_rng(0))).drop_columns(["label"]), os.path.join(root, "part-00.parquet")
    )
    return "part-00.parquet: no column label (the label column"


def _not_parquet(root):
    _write_table(root, file_rows=(4,), row_groups=(4,))
    with open(os.path.join(root, "part-01.parquet"), "w") as f:
        f.write("label,C1\n1,2\n")
    return "part-01.parquet: not a Parquet file, or truncated"


def _truncated(root):
    _write_table(root, file_rows=(4, 5), row_groups=(4, 5))
    path = os.path.join(root, "part-01.parquet")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    return "part-01.parquet: not a Parquet file, or truncated"


def _empty(root):
    _write_table(root, file_rows=(0, 0), row_groups=(1, 1))
    return "the table has no rows (2 file(s))"


def _empty_split(root):
    _write_table(root, file_rows=(10,), row_groups=(10,))
    return "the validation split has no rows"


@pytest.mark.parametrize("make", [_bad_type, _type_change, _missing, _not_parquet, _truncated, _empty, _empty_split])
def test_bad_tables_refused_naming_the_file(tmp_path, make):
    expected = make(str(tmp_path))
    flags = {"validation_window": "0.01", "test_window": "0.3"} if make is _empty_split else {}
    with pytest.raises(BadInput, match=None) as caught:
        source_for(_config(str(tmp_path), **flags)).open()
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "column, value, what",
    [
        ("label", 2, "label 2 is not 0 or 1"),
        ("I2", float("nan"), "dense value nan is not finite"),
    ],
)
def test_bad_value_names_file_row_group_row_column(tmp_path, column, value, what):
    _write_table(str(tmp_path), file_rows=(3, 20), row_groups=(3, 4))
    path = str(tmp_path / "part-01.parquet")
    table = pq.read_table(path)
    values = table.column(column).to_pylist()
    values[9] = value  # row group 2 (rows 8-11) of the file
    table = table.set_column(
        table.schema.get_field_index(column), column, pa.array(values, table.schema.field(column).type)
    )
    pq.write_table(table, path, row_group_size=4)
    with pytest.raises(ParquetValueError) as caught:
        for split in _loaders(_config(str(tmp_path), validation_window="0.1", test_window="0.1")).values():
            list(split)
    assert str(caught.value) == f"{path}: row group 2, row 9, column {column}: {what}"


def test_a_footer_that_lies_about_a_row_group_stops_every_rank_at_the_same_batch(tmp_path):
    """Row group 0 of part-01 holds 10 rows and its footer says 12: pyarrow reads the
    10 and the splits count 12. The rank whose share holds it finds it; the ranks agree
    on every batch, so both raise its line at the same batch (training: exit 2 on every
    rank)."""
    from tests.support.hostile import rewrite_row_group_rows

    _write_table(str(tmp_path), file_rows=(20, 20), row_groups=(4, 10))
    path = str(tmp_path / "part-01.parquet")
    rewrite_row_group_rows(path, 0, 12)
    config = _config(str(tmp_path), batch_size=2, validation_window="0.05", test_window="0.05")
    ranks = ThreadRanks(2)

    def stop(rank: int) -> tuple[int, str]:
        loader = _rank_loader(config, rank, 2, agree=ranks.agreement(rank))
        batches = 0
        with pytest.raises(ParquetValueError) as caught:
            for _ in loader:
                batches += 1
        assert caught.value.seen_by_every_rank
        return batches, str(caught.value)

    stops = ranks.run(stop)
    # 38 training rows (the footers' count): rank 1's share is rows 19-37, the lying
    # row group in its first batch; rank 0's is part-00 alone.
    line = (
        f"{path}: row group 0 holds 10 rows, but the file's footer says 12 (a corrupt or "
        "rewritten footer) (batch 0 of the split)"
    )
    assert stops == [(0, line)] * 2


def test_workers_that_read_a_row_group_together_stop_at_the_footer_that_lies(tmp_path):
    """Three workers read each row group's columns in three parts: the part that finds the
    lie fails the batches of every worker that needs the row group, with the same line."""
    from tests.support.hostile import rewrite_row_group_rows

    _write_table(str(tmp_path), file_rows=(20, 20), row_groups=(4, 10))
    path = str(tmp_path / "part-01.parquet")
    rewrite_row_group_rows(path, 0, 12)
    config = _config(str(tmp_path), batch_size=2, validation_window="0.05", test_window="0.05")
    with pytest.raises(ParquetValueError) as caught:
        for _ in _rank_loader(config, 0, 1, workers=3):
            pass
    assert str(caught.value).startswith(f"{path}: row group 0 holds 10 rows, but the file's footer says 12")


def test_workers_read_hive_partition_columns_as_one_worker_does(tmp_path):
    """A row group read in parts by three workers: the partition column (made from the
    path) rides with the first part, and the batches are one worker's, in order."""
    import torch

    rng = np.random.default_rng(1)
    for day, rows in enumerate((5, 8, 3, 4)):
        folder = tmp_path / f"C1=shop{day}"  # the sparse column C1 is the partition's
        folder.mkdir()
        columns = {k: v for k, v in _rows(day * 100, rows, rng).items() if k != "C1"}
        pq.write_table(pa.table(columns), str(folder / "part-0.parquet"), row_group_size=2)
    config = _config(str(tmp_path), batch_size=2, dense_columns="rid", validation_window="0.2", test_window="0.2")
    one, three = list(_rank_loader(config, 0, 1, workers=1)), list(_rank_loader(config, 0, 1, workers=3))
    assert len(one) == len(three) == 6
    assert len({int(v) for b in one for v in b.sparse_features["C1"].values()}) == 2  # 12 rows: two days
    for a, b in zip(one, three):
        assert torch.equal(a.dense_features, b.dense_features) and torch.equal(a.labels, b.labels)
        assert torch.equal(a.sparse_features.values(), b.sparse_features.values())


def test_a_bad_value_in_one_ranks_rows_stops_every_rank_at_that_batch(tmp_path):
    """A NaN in rank 1's rows of batch 2: rank 1 alone converts them, the ranks agree on
    each batch, and both raise its line there (nothing of batch 2 is handed out)."""
    _write_table(str(tmp_path), file_rows=(20, 20), row_groups=(4, 4))
    path = str(tmp_path / "part-01.parquet")
    table = pq.read_table(path)
    values = table.column("I2").to_pylist()
    values[3] = float("nan")  # rank 1's share: rows 18-35 (part-00 18-19, part-01 0-15), its batch 2 rows 4-5
    pq.write_table(table.set_column(table.schema.get_field_index("I2"), "I2", pa.array(values)), path, row_group_size=4)
    config = _config(str(tmp_path), batch_size=2, validation_window="0.05", test_window="0.05")
    ranks = ThreadRanks(2)

    def stop(rank: int) -> tuple[int, str]:
        batches = 0
        with pytest.raises(ParquetValueError) as caught:
            for _ in _rank_loader(config, rank, 2, agree=ranks.agreement(rank)):
                batches += 1
        return batches, str(caught.value)

    line = f"{path}: row group 0, row 3, column I2: dense value nan is not finite (batch 2 of the split)"
    assert ranks.run(stop) == [(2, line)] * 2


@pytest.mark.parametrize(
    "flags, message",
    [
        (dict(sparse_columns=None), "--parquet_path needs --sparse_columns"),
        (dict(multi_hot_sizes=[2] * 26), "--multi_hot_sizes expands one-hot data; Parquet list columns"),
        (dict(shuffle_batches=True), "--shuffle_batches reads batches in random order"),
        (dict(test_window="1d"), "--test_window 1d is a duration, which needs --time_column"),
        (dict(validation_window="0.5", test_window="0.5"), "leave no training rows"),
        (dict(test_window="1w"), "--test_window 1w: give a duration (1d, 6h, 30m, 90s) or a fraction (0.1)"),
        (dict(test_window="1.5"), "--test_window 1.5: a fraction must be between 0 and 1"),
        (dict(rolling_windows=3), "--rolling_windows splits the data by time: give --time_column"),
        (dict(max_buffered_row_groups=0), "--max_buffered_row_groups must be at least 1"),
        (dict(data_workers=0), "--data_workers must be at least 1, got 0"),
    ],
)
def test_flag_refusals(tmp_path, flags, message):
    values = dict(parquet_path=str(tmp_path), sparse_columns="C1")
    values.update(flags)
    with pytest.raises(FlagError, match=None) as caught:
        DataConfig.from_flags(**values).validate()
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "flags", [dict(sparse_columns="C1"), dict(time_column="ts"), dict(hash_seed=3), dict(test_window="0.1")]
)
def test_parquet_flags_need_parquet_path(flags):
    with pytest.raises(FlagError, match="is for parquet data: it needs --parquet_path"):
        DataConfig.from_flags(**flags).validate()


def test_weight_column_with_parquet(tmp_path):
    """Each rank's batch carries its rows' weights and the normalizer of the global
    batch: both ranks' weight sums (agreed on), over the ranks."""
    _write_table(str(tmp_path), file_rows=(12,), row_groups=(5,))
    config = _config(str(tmp_path), dense_columns="rid", weight_column="I2", batch_size=3)
    ranks = ThreadRanks(2)
    first = ranks.run(lambda rank: next(iter(_rank_loader(config, rank, 2, agree=ranks.agreement(rank)))))
    weights = pq.read_table(str(tmp_path), columns=["I2"]).column("I2").to_numpy()
    share = source_for(config).open().num_rows("train") // 2
    assert np.allclose(first[0].weights.numpy(), weights[:3])
    assert np.allclose(first[1].weights.numpy(), weights[share : share + 3])
    expected = (weights[:3].sum() + weights[share : share + 3].sum()) / 2
    assert all(np.isclose(float(batch.weight_normalizer), expected) for batch in first)


def test_one_rank_normalizes_the_weighted_loss_by_its_batch_weight_sum(tmp_path):
    """One rank's normalizer is its batch's weight sum, as the binary layouts' (it was 1:
    a weighted sum of the losses, not their weighted mean)."""
    _write_table(str(tmp_path), file_rows=(12,), row_groups=(5,))
    config = _config(str(tmp_path), dense_columns="rid", weight_column="I2", batch_size=4)
    batch = next(iter(_loaders(config)["train"]))
    weights = pq.read_table(str(tmp_path), columns=["I2"]).column("I2").to_numpy()[:4]
    assert np.isclose(float(batch.weight_normalizer), weights.sum())


def test_windows_parse():
    assert parse_window("1d", "--w").microseconds == 86_400_000_000
    assert parse_window("6h", "--w").microseconds == 6 * 3_600_000_000
    assert parse_window("30m", "--w").microseconds == 30 * 60_000_000
    assert parse_window("0.1", "--w").fraction == 0.1


def test_describe_resolves_patterns_with_partitions(tmp_path):
    folder = tmp_path / "date=2026-11-01"
    folder.mkdir()
    pq.write_table(pa.table(_rows(0, 3, np.random.default_rng(0))), str(folder / "part-0.parquet"))
    description = source_for(_config(str(tmp_path), dense_columns="I*", sparse_columns="C*,date")).describe()
    assert description.dense_feature_names == ("I2",)
    assert description.sparse_feature_names == ("C1", "C2", "date")
    assert description.cardinalities is None


def test_collision_counts_exact_and_estimated():
    keys = np.random.default_rng(0).integers(0, 2**63, 5000, dtype=np.int64).view(np.uint64)
    exact = CollisionCounter(["f"], [3000], "hash", 7)
    exact.add([keys[:2000]])
    exact.add([keys])  # repeats count once
    rows = embedding_rows(keys, 7, 3000)
    _, inverse, counts = np.unique(rows, return_inverse=True, return_counts=True)
    stats = exact.statistics()["f"]
    assert stats == {"distinct": 5000, "colliding_fraction": float((counts[inverse] > 1).mean()), "exact": True}
    sampled = CollisionCounter(["f"], [3000], "hash", 7, exact_cap=500)
    sampled.add([keys])
    estimate = sampled.statistics()["f"]
    assert not estimate["exact"] and abs(estimate["distinct"] - 5000) < 1000
    assert abs(estimate["colliding_fraction"] - stats["colliding_fraction"]) < 0.1


def test_training_loader_reports_collisions_and_nulls(tmp_path):
    _write_table(str(tmp_path), file_rows=(12,), row_groups=(5,))
    path = str(tmp_path / "part-00.parquet")
    table = pq.read_table(path)
    table = table.set_column(2, "I2", pa.array([None, 1.0] * 6, pa.float64()))
    pq.write_table(table, path)
    loader = _loaders(_config(str(tmp_path), validation_window="0.1", test_window="0.1"))["train"]
    list(loader)
    stats = loader.statistics()
    assert stats["dense_nulls"] == {"rid": 0, "I2": 5}  # the 10 training rows
    assert stats["id_collisions"]["C2"]["distinct"] == len(set(table.column("C2").to_pylist()[:10]))


def test_statistics_lines_say_what_was_counted_and_nothing_before_a_row(tmp_path, capsys, monkeypatch):
    """The console's lines after an evaluation: the collisions and the null counts per
    column of the training rows read; none before any (--mode test printed `id
    collisions: C1 0.0% of 0 values`), and the nulls printed, not only logged (the
    note pointed to a run log there may not be)."""
    from data.sources.parquet import statistics_lines

    _write_table(str(tmp_path), file_rows=(12,), row_groups=(5,))
    path = str(tmp_path / "part-00.parquet")
    table = pq.read_table(path)
    pq.write_table(table.set_column(2, "I2", pa.array([None, 1.0] * 6, pa.float64())), path)
    loaders = _loaders(_config(str(tmp_path), validation_window="0.3", test_window="0.3"))
    loader = loaders["train"]
    assert statistics_lines(loader.statistics()) is None
    monkeypatch.setattr("data.parquet.loader._NULLS_REPORTED", set())  # the note is said once per process
    list(loaders["test"])  # what --mode test reads: the note says no counts follow
    assert capsys.readouterr().err == "note: dense column(s) I2 hold nulls, read as 0, as in training\n"
    monkeypatch.setattr("data.parquet.loader._NULLS_REPORTED", set())
    list(loader)
    assert capsys.readouterr().err == (
        "note: dense column(s) I2 hold nulls, read as 0 (the training rows' counts per "
        "column follow each evaluation, and go to the run log with --log_path)\n"
    )
    collisions, nulls = statistics_lines(loader.statistics()).split("\n")
    assert collisions.startswith("id collisions (share of a feature's distinct values on a row another also has")
    assert nulls.startswith("dense nulls read as 0 (this rank's training rows): I2 ")


def test_zch_hands_over_the_unreduced_ids_of_every_column_kind_with_two_workers(tmp_path):
    """--id_hashing zch over string (C1), int (C2) and multi-hot (M1) columns: the loader
    hands over each id's `zch_ids` (not reduced to the table, whose modules map them),
    and 2 converting threads (--data_workers 2) hand out the batches one does, bit for bit."""
    import torch

    from data.parquet.id_hashing import string_keys, zch_ids

    _write_table(str(tmp_path))
    config = _config(str(tmp_path), id_hashing="zch", hash_seed=3, shuffle_training_set=True)
    one, two = (list(_rank_loader(config, 0, 1, workers=w)) for w in (1, 2))
    assert len(one) == len(two) > 1
    for a, b in zip(one, two):
        assert torch.equal(a.dense_features, b.dense_features)
        assert torch.equal(a.sparse_features.values(), b.sparse_features.values())
        assert torch.equal(a.sparse_features.lengths(), b.sparse_features.lengths())
    table = pa.concat_tables(pq.read_table(os.path.join(tmp_path, f)) for f in sorted(os.listdir(tmp_path)))
    rid = table.column("rid").to_numpy().astype(int)
    batch = one[0]
    rows = [int(np.flatnonzero(rid == r)[0]) for r in _rids(batch)]
    kjt = batch.sparse_features.to_dict()
    users = [table.column("C1")[r].as_py().encode() for r in rows]
    offsets = np.cumsum([0] + [len(u) for u in users])
    expected = {
        "C1": zch_ids(string_keys(np.frombuffer(b"".join(users), np.uint8), offsets), 3),
        "C2": zch_ids(integer_keys(np.array([table.column("C2")[r].as_py() for r in rows])), 3),
        "M1": zch_ids(integer_keys(np.array([v for r in rows for v in table.column("M1")[r].as_py()], np.int64)), 3),
    }
    for name, ids in expected.items():
        assert kjt[name].values().tolist() == ids.tolist(), name
    assert kjt["M1"].lengths().tolist() == [len(table.column("M1")[r].as_py()) for r in rows]
    assert max(kjt["C2"].values().tolist()) >= 1000  # above every table: not taken modulo
