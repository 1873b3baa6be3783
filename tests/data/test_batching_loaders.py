"""Synthetic data generator, per-rank batch layout, the binary loader, and what a data set must be."""

import json
import os
import re
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from common.errors import BadInput
from data.batching.batches import RankBatchLayout
from data.batching.loaders import build_loaders
from data.binary.criteo import CriteoBinaryDataset, CriteoBinaryLoader
from data.binary.criteo_layout import METADATA_VERSION, NUM_DENSE_FEATURES, NUM_SPARSE_FEATURES, read_metadata
from data.config import DataConfig
from data.sources import source_for
from data.synthetic_criteo import SyntheticCriteoSpec, generate_synthetic_criteo
from harness.small_data import SMALL_SPEC

SPEC = SyntheticCriteoSpec(num_days=3, rows_per_day=1000, seed=1)


def test_generator_layout_and_metadata(tmp_path):
    out = str(tmp_path / "d")
    metadata = generate_synthetic_criteo(SPEC, out, show_progress=False)
    for day in range(3):
        dense = np.load(os.path.join(out, f"day_{day}_dense.npy"))
        sparse = np.load(os.path.join(out, f"day_{day}_sparse.npy"))
        labels = np.load(os.path.join(out, f"day_{day}_labels.npy"))
        assert dense.dtype == np.float32 and dense.shape == (1000, NUM_DENSE_FEATURES)
        assert sparse.dtype == np.int32 and sparse.shape == (1000, NUM_SPARSE_FEATURES)
        assert labels.dtype == np.int32 and labels.shape == (1000, 1)
        assert dense.min() >= np.log(3.0) - 1e-6  # log(x + 3) of counts >= 0
        assert (sparse >= 0).all() and (sparse < np.asarray(SPEC.cardinalities)).all()
        assert set(np.unique(labels)) <= {0, 1}
    on_disk = json.load(open(os.path.join(out, "metadata.json")))
    assert read_metadata(out) == metadata
    assert on_disk["version"] == METADATA_VERSION and on_disk["format"] == "criteo_binary"
    assert on_disk["num_embeddings_per_feature"] == SPEC.cardinalities
    assert 0.05 < on_disk["positive_rate"] < 0.95
    assert not [f for f in os.listdir(out) if ".tmp" in f]


def test_generator_is_deterministic_and_skips_identical(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    generate_synthetic_criteo(SPEC, a, show_progress=False)
    generate_synthetic_criteo(SPEC, b, show_progress=False)
    arrays = sorted(name for name in os.listdir(a) if name.endswith(".npy"))
    assert arrays and arrays == sorted(name for name in os.listdir(b) if name.endswith(".npy"))  # not none compared
    for name in arrays:
        assert np.array_equal(np.load(os.path.join(a, name)), np.load(os.path.join(b, name)))
    before = os.stat(os.path.join(a, "day_0_dense.npy")).st_mtime_ns
    generate_synthetic_criteo(SPEC, a, show_progress=False)  # identical spec: nothing rewritten
    assert os.stat(os.path.join(a, "day_0_dense.npy")).st_mtime_ns == before
    other = SyntheticCriteoSpec(num_days=3, rows_per_day=1000, seed=2)
    generate_synthetic_criteo(other, a, show_progress=False)
    assert not np.array_equal(
        np.load(os.path.join(a, "day_0_sparse.npy")), np.load(os.path.join(b, "day_0_sparse.npy"))
    )


def test_labels_depend_on_features():
    """A logistic fit on the dense features alone already beats chance: the data is learnable."""
    from data.synthetic_criteo import _hidden_model, generate_rows

    rng = np.random.default_rng(0)
    dense, sparse, labels = generate_rows(SPEC, _hidden_model(SPEC), rng, 20000)
    effect = _hidden_model(SPEC).id_effects
    score = sum(effect[f][sparse[:, f]] for f in range(NUM_SPARSE_FEATURES))
    y = labels[:, 0]
    order = np.argsort(score)
    ranks = np.empty(len(order))
    ranks[order] = np.arange(1, len(order) + 1)
    pos = y.sum()
    auroc = (ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(y) - pos))
    assert auroc > 0.75


@pytest.mark.parametrize(
    "rows, batch, world, drop_last",
    [
        (1000, 64, 2, False),
        (1000, 64, 2, True),
        (1001, 50, 4, False),
        (7, 2, 2, False),
        (130, 64, 1, False),
    ],
)
def test_layout_covers_rows_once_with_equal_batches(rows, batch, world, drop_last):
    layouts = [RankBatchLayout(rows, batch, r, world, drop_last) for r in range(world)]
    assert len({len(l) for l in layouts}) == 1
    seen = []
    for b in range(len(layouts[0])):
        spans = [l.rows(b) for l in layouts]
        assert len({hi - lo for lo, hi in spans}) == 1 and spans[0][1] > spans[0][0]
        for lo, hi in spans:
            seen.extend(range(lo, hi))
    assert len(seen) == len(set(seen))
    dropped = rows - len(seen)
    if drop_last:
        assert dropped == rows % (batch * world)
    else:
        assert 0 <= dropped < world


def _concat(loader):
    batches = list(loader)
    dense = np.concatenate([b.dense_features.numpy() for b in batches])
    labels = np.concatenate([b.labels.numpy() for b in batches])
    return batches, dense, labels


def test_splits_ranks_and_mmap(synthetic_dir):
    dataset = CriteoBinaryDataset(synthetic_dir)
    n = SMALL_SPEC.rows_per_day
    assert dataset.split_ranges() == {
        "train": (0, 2 * n),
        "validation": (2 * n, 2 * n + n // 2),
        "test": (2 * n + n // 2, 3 * n),
    }
    all_dense = np.concatenate([np.load(os.path.join(synthetic_dir, f"day_{d}_dense.npy")) for d in range(3)])
    for mmap in (False, True):
        parts = [_concat(CriteoBinaryLoader(dataset, "validation", 100, r, 2, mmap_mode=mmap)) for r in range(2)]
        (b0, d0, _), (b1, d1, _) = parts
        assert len(b0) == len(b1)
        # rank r holds the r-th half of every global batch of 200 rows
        assert np.array_equal(d0[:100], all_dense[2 * n : 2 * n + 100])
        assert np.array_equal(d1[:100], all_dense[2 * n + 100 : 2 * n + 200])
        assert len(d0) + len(d1) == n // 2  # 12288 rows split without remainder
        kjt = b0[0].sparse_features
        assert kjt.keys()[0] == "cat_0" and kjt.values().numel() == NUM_SPARSE_FEATURES * 100


def test_shuffling_is_identical_across_ranks_and_covers_rows(synthetic_dir):
    dataset = CriteoBinaryDataset(synthetic_dir)
    loaders = [
        CriteoBinaryLoader(dataset, "train", 128, r, 2, row_permutation_seed=3, shuffle_batches_seed=3)
        for r in range(2)
    ]
    labels = [np.concatenate([b.labels.numpy() for b in l]) for l in loaders]
    dense = [np.concatenate([b.dense_features.numpy() for b in l]) for l in loaders]
    train_dense = np.concatenate([np.load(os.path.join(synthetic_dir, f"day_{d}_dense.npy")) for d in range(2)])
    together = np.concatenate(dense)
    # every training row exactly once, in an order different from the files'
    assert sorted(map(tuple, together)) == sorted(map(tuple, train_dense))
    assert not np.array_equal(dense[0][:128], train_dense[:128])
    # same permutation on both ranks: a new pair of loaders reproduces both streams
    again = [
        np.concatenate(
            [
                b.labels.numpy()
                for b in CriteoBinaryLoader(dataset, "train", 128, r, 2, row_permutation_seed=3, shuffle_batches_seed=3)
            ]
        )
        for r in range(2)
    ]
    assert all(np.array_equal(x, y) for x, y in zip(labels, again))
    loaders[0].set_epoch(1)
    assert not np.array_equal(np.concatenate([b.labels.numpy() for b in loaders[0]]), labels[0])


@pytest.mark.parametrize("order", [dict(shuffle_batches_seed=5), dict(row_permutation_seed=5, shuffle_batches_seed=5)])
def test_mmap_loader_in_random_order_equals_in_memory(synthetic_dir, order):
    """Shuffled reads from the memory map (read-ahead off, each batch prefetched, pages
    released every 64 KiB here) give the in-memory loader's batches, across days."""
    dataset = CriteoBinaryDataset(synthetic_dir)
    in_memory = list(CriteoBinaryLoader(dataset, "train", 100, 1, 2, **order))
    mapped = list(
        CriteoBinaryLoader(dataset, "train", 100, 1, 2, mmap_mode=True, release_every_bytes=64 << 10, **order)
    )
    assert len(mapped) == len(in_memory) > 1
    for a, b in zip(mapped, in_memory):
        assert torch.equal(a.dense_features, b.dense_features) and torch.equal(a.labels, b.labels)
        assert torch.equal(a.sparse_features.values(), b.sparse_features.values())


def test_modulo_applied_when_tables_are_smaller(synthetic_dir):
    dataset = CriteoBinaryDataset(synthetic_dir)
    small = [5] * 26
    batch = next(iter(CriteoBinaryLoader(dataset, "test", 64, 0, 1, num_embeddings_per_feature=small)))
    assert int(batch.sparse_features.values().max()) < 5
    raw = np.load(os.path.join(synthetic_dir, "day_2_sparse.npy"))[SMALL_SPEC.rows_per_day // 2 :][:64]
    assert np.array_equal(batch.sparse_features.values().numpy(), (raw % 5).T.reshape(-1))


def test_bad_layout_is_one_clear_error(tmp_path):
    with pytest.raises(BadInput, match="needs at least two day files"):
        CriteoBinaryDataset(str(tmp_path))
    generate_synthetic_criteo(SPEC, str(tmp_path / "d"), show_progress=False)
    np.save(str(tmp_path / "d" / "day_1_dense.npy"), np.zeros((1000, 12), np.float32))
    with pytest.raises(BadInput, match=rf"day_1_dense.npy: expected float32 of shape \(N, {NUM_DENSE_FEATURES}\)"):
        CriteoBinaryDataset(str(tmp_path / "d"))


def test_random_loader_is_world_size_independent():
    config = DataConfig(batch_size=8, limit_train_batches=3, seed=4)
    one = build_loaders(config, None, [100] * NUM_SPARSE_FEATURES, 0, 1)["train"]
    config.batch_size = 4
    halves = [build_loaders(config, None, [100] * NUM_SPARSE_FEATURES, r, 2)["train"] for r in range(2)]
    for whole, a, b in zip(one, *halves):
        assert np.array_equal(
            whole.dense_features.numpy(), np.concatenate([a.dense_features.numpy(), b.dense_features.numpy()])
        )
    assert len(one) == 3 and source_for(config).open() is None


# --- data must be what it claims -------------------------------------------------------

CLAIM_SPEC = SyntheticCriteoSpec(num_days=3, rows_per_day=300, cardinalities=[50] * NUM_SPARSE_FEATURES, seed=5)
LAYOUTS = ("one_hot", "multi_hot", "split_binary")


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict:
    """The same small data set in the three layouts: {layout: directory}."""
    from data.criteo_feature_spec import criteo_to_split_binary
    from data.synthetic_criteo import generate_multi_hot_criteo

    root = tmp_path_factory.mktemp("layouts")
    generate_synthetic_criteo(CLAIM_SPEC, str(root / "one_hot"), show_progress=False)
    generate_multi_hot_criteo(CLAIM_SPEC, str(root / "multi_hot"), [2] * NUM_SPARSE_FEATURES)
    criteo_to_split_binary(str(root / "one_hot"), str(root / "split_binary"))
    return {layout: str(root / layout) for layout in LAYOUTS}


def _data_config(layout: str, directory: str, **flags) -> DataConfig:
    path = {
        "one_hot": "in_memory_binary_criteo_path",
        "multi_hot": "synthetic_multi_hot_criteo_path",
        "split_binary": "dataset_path",
    }[layout]
    where = os.path.join(directory, "feature_spec.yaml") if layout == "split_binary" else directory
    return DataConfig.from_flags(**{path: where}, batch_size=64, **flags)


def _rewrite(path: str, change) -> None:
    """Applies change(array) to an .npy, a split_binary file (viewed with its dtype and
    row width) or one array of a multi-hot .npz."""
    import shutil

    from data.batching.multi_hot import write_multi_hot_npz

    if path.endswith(".npy"):
        array = np.load(path)
        change(array)
        np.save(path, array)
    elif ".npz:" in path:
        npz, key = path.split(":")
        with np.load(npz) as saved:
            arrays = [saved[str(f)] for f in range(NUM_SPARSE_FEATURES)]
        change(arrays[int(key)])
        write_multi_hot_npz(npz + ".new", arrays)
        shutil.move(npz + ".new", npz)
    else:
        dtype, width = {"numerical.bin": (np.float16, NUM_DENSE_FEATURES), "label.bin": (np.uint8, 1)}.get(
            os.path.basename(path), (np.int8, 1)
        )
        array = np.fromfile(path, dtype).reshape(-1, width)
        change(array)
        array.tofile(path)


# Day 1, row 17 of the Criteo layouts is row 317 of the split_binary train files.
BAD_VALUES = {
    "id too large": ("sparse", 3, 50, "id 50 is not below the cardinality 50 {declared}"),
    "negative id": ("sparse", 3, -7, "negative id -7 (ids must be from 0 to the cardinality - 1)"),
    "label": ("labels", 0, 2, "label 2 (labels must be 0 or 1)"),
    "nan": ("dense", 4, np.nan, "dense value nan (dense values must be finite)"),
    "inf": ("dense", 4, -np.inf, "dense value -inf (dense values must be finite)"),
}


def _break_value(layout: str, directory: str, problem: str) -> str:
    """Writes one bad value; returns the message expected for it."""
    kind, column, value, reason = BAD_VALUES[problem]
    names = {"sparse": f"cat_{column}", "labels": "label", "dense": f"int_{column}"}
    if layout == "split_binary":
        relative = {"sparse": f"cat_{column}.bin", "labels": "label.bin", "dense": "numerical.bin"}[kind]
        path, row, where = os.path.join(directory, "train", relative), 317, None
        col = column if kind == "dense" else 0
        declared = f"in {os.path.join(directory, 'feature_spec.yaml')}"
    else:
        path, row, col = os.path.join(directory, f"day_1_{kind}.npy"), 17, column
        where, declared = path, "in metadata.json"
        if layout == "multi_hot" and kind == "sparse":
            npz = os.path.join(directory, "day_1_sparse_multi_hot.npz")
            path, where, col = f"{npz}:{column}", f"{npz} array '{column}'", 1
    _rewrite(path, lambda a: a.__setitem__((row, col), value))
    return f"{where or path} row {row} column {names[kind]}: {reason.format(declared=declared)}"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("problem", list(BAD_VALUES))
def test_bad_value_refused_naming_file_row_and_column(layouts, tmp_path, layout, problem):
    """At open (every file, before any collective), or with --mmap_mode when the batch
    holding it is read; never handed to FBGEMM or the loss."""
    import shutil

    from data.batching.value_checks import DataValueError

    directory = str(tmp_path / layout)
    shutil.copytree(layouts[layout], directory)
    assert source_for(_data_config(layout, directory)).open() is not None
    message = _break_value(layout, directory, problem)
    with pytest.raises(DataValueError) as error:
        source_for(_data_config(layout, directory)).open()
    assert str(error.value) == message
    config = _data_config(layout, directory, mmap_mode=True)
    loaders = build_loaders(config, source_for(config).open(), [50] * 26, rank=0, world_size=1)
    with pytest.raises(DataValueError) as error:
        for loader in loaders.values():
            list(loader)
    assert str(error.value) == message


def test_ids_beyond_flag_table_sizes_are_taken_modulo_not_refused(layouts):
    """Tables smaller than the declared cardinalities (--num_embeddings_per_feature) are
    a legitimate configuration: the ids are in range of the data set, the loader maps them."""
    for layout in LAYOUTS:
        for mmap in (False, True):
            config = _data_config(layout, layouts[layout], mmap_mode=mmap)
            batch = next(
                iter(build_loaders(config, source_for(config).open(), [7] * NUM_SPARSE_FEATURES, 0, 1)["train"])
            )
            assert int(batch.sparse_features.values().min()) >= 0 and int(batch.sparse_features.values().max()) < 7


@pytest.mark.slow
def test_nan_in_test_split_exits_2_on_every_rank_before_training(layouts, tmp_path):
    import shutil

    import dlrm_main
    from harness.launch import launch

    directory = str(tmp_path / "d")
    shutil.copytree(layouts["one_hot"], directory)
    _rewrite(os.path.join(directory, "day_2_dense.npy"), lambda a: a.__setitem__((250, 0), np.nan))
    log = str(tmp_path / "log.jsonl")
    argv = [
        "--in_memory_binary_criteo_path",
        directory,
        "--batch_size",
        "32",
        "--embedding_dim",
        "8",
        "--dense_arch_layer_sizes",
        "16,8",
        "--over_arch_layer_sizes",
        "8,1",
        "--log_path",
        log,
    ]
    assert launch(dlrm_main.main, argv) == {0: 2, 1: 2}
    assert not os.path.exists(log)  # nothing trained


def test_days_are_what_metadata_lists(tmp_path):
    """A shorter data set written over a longer one: the writers remove the old days; a
    leftover day (an older writer's, or a copy) is refused by name, as is a day whose
    row count disagrees with metadata.json."""
    import shutil

    from data.synthetic_criteo import generate_multi_hot_criteo

    longer = SyntheticCriteoSpec(num_days=4, rows_per_day=100, cardinalities=[50] * NUM_SPARSE_FEATURES, seed=1)
    shorter = SyntheticCriteoSpec(num_days=2, rows_per_day=100, cardinalities=[50] * NUM_SPARSE_FEATURES, seed=2)
    one_hot, multi_hot = str(tmp_path / "one_hot"), str(tmp_path / "multi_hot")
    generate_synthetic_criteo(longer, one_hot, show_progress=False)
    generate_synthetic_criteo(shorter, one_hot, show_progress=False)
    generate_multi_hot_criteo(longer, multi_hot, [2] * NUM_SPARSE_FEATURES)
    generate_multi_hot_criteo(shorter, multi_hot, [2] * 26)
    for directory in (one_hot, multi_hot):
        assert not [name for name in os.listdir(directory) if name.startswith(("day_2", "day_3"))]
    assert CriteoBinaryDataset(one_hot).rows_per_day == [100, 100]
    shutil.copy(
        os.path.join(multi_hot, "day_1_sparse_multi_hot.npz"), os.path.join(multi_hot, "day_2_sparse_multi_hot.npz")
    )
    with pytest.raises(BadInput) as error:
        CriteoBinaryDataset(multi_hot, multi_hot=True)
    assert str(error.value) == (
        f"{multi_hot}/day_2_sparse_multi_hot.npz: not part of the data set (metadata.json "
        "lists days 0 to 1); a leftover of an earlier data set? remove it"
    )
    for kind in ("dense", "sparse", "labels"):
        path = os.path.join(one_hot, f"day_1_{kind}.npy")
        np.save(path, np.load(path)[:99])
    with pytest.raises(BadInput, match=r"day_1_dense.npy: holds 99 rows, but metadata.json says day 1 has 100"):
        CriteoBinaryDataset(one_hot)


def test_empty_split_and_unfinished_preprocessing_are_refused(tmp_path):
    directory = str(tmp_path / "d")
    generate_synthetic_criteo(SyntheticCriteoSpec(num_days=2, rows_per_day=100, seed=1), directory, show_progress=False)
    os.remove(os.path.join(directory, "metadata.json"))
    for kind, width, dtype in (("dense", 13, np.float32), ("sparse", 26, np.int32), ("labels", 1, np.int32)):
        np.save(os.path.join(directory, f"day_0_{kind}.npy"), np.zeros((0, width), dtype))
    with pytest.raises(BadInput, match=r"/d: the train split has no rows \(rows per day: 0, 100\)"):
        CriteoBinaryDataset(directory)
    open(os.path.join(directory, "day_0.done.json"), "w").close()
    with pytest.raises(BadInput, match=r"/d: preprocessing did not finish \(day markers but no metadata.json\)"):
        CriteoBinaryDataset(directory)


@pytest.mark.slow
def test_mmap_mode_stops_at_the_bad_batch_naming_the_file(layouts, tmp_path):
    """--mmap_mode reads rows only batch by batch: the batch holding a bad id stops the
    rank with one line naming rank, step, file, row and column (no traceback)."""
    import shutil

    from harness.launch import run_script

    directory = str(tmp_path / "d")
    shutil.copytree(layouts["one_hot"], directory)
    message = _break_value("one_hot", directory, "negative id")
    proc = run_script(
        [
            "dlrm_main.py",
            "--in_memory_binary_criteo_path",
            directory,
            "--mmap_mode",
            "--batch_size",
            "100",
            "--embedding_dim",
            "8",
            "--dense_arch_layer_sizes",
            "16,8",
            "--over_arch_layer_sizes",
            "8,1",
            "--log_path",
            str(tmp_path / "log.jsonl"),
        ]
    )
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dlrm_main.py: error:")]
    assert (
        len(errors) == 1
        and re.fullmatch(
            r"dlrm_main.py: error: rank 0 of 1 failed at step \d \(epoch 0, training\): DataValueError: (.*)", errors[0]
        ).group(1)
        == message
    ), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_batch_check_of_bags_with_different_cardinalities():
    """The bags of a batch are compared at once, each id against its own feature's
    cardinality: a clean batch passes, and the first bad row is found."""
    from data.batching.value_checks import BatchValueCheck

    rng = np.random.default_rng(0)
    cardinalities = [3, 1000, 20]
    bags = [
        rng.integers(0, c, size=(64, k)).astype(dtype)
        for c, k, dtype in zip(cardinalities, (1, 4, 2), (np.int8, np.int16, np.int8))
    ]
    dense, labels = np.zeros((64, 2), np.float16), np.ones(64, np.bool_)
    check = BatchValueCheck(cardinalities)
    assert check.first_invalid_row(dense, bags, labels) is None
    bags[2][40, 1] = 20
    bags[1][51, 0] = -1
    assert check.first_invalid_row(dense, bags, labels) == 40
    assert BatchValueCheck(None).first_invalid_row(dense, bags, labels) == 51


def _write_large_days(directory: str, rows_per_day: Sequence[int]) -> int:
    """Day files of ``rows_per_day`` rows with row-dependent values, written in chunks
    (no generator: it would take minutes at this size); returns the bytes of the
    training split (every day but the last)."""
    chunk = 1 << 20
    for day, (day_start, rows_in_day) in enumerate(zip(np.cumsum([0, *rows_per_day]), rows_per_day)):
        arrays = {
            kind: np.lib.format.open_memmap(
                os.path.join(directory, f"day_{day}_{kind}.npy"), mode="w+", dtype=dtype, shape=(rows_in_day, width)
            )
            for kind, dtype, width in (("dense", np.float32, 13), ("sparse", np.int32, 26), ("labels", np.int32, 1))
        }
        for lo in range(0, rows_in_day, chunk):
            rows = np.arange(day_start + lo, day_start + min(lo + chunk, rows_in_day))
            arrays["dense"][lo : lo + len(rows)] = (rows % 997)[:, None] * np.arange(1, 14, dtype=np.float32)
            arrays["sparse"][lo : lo + len(rows)] = (rows[:, None] * np.arange(7, 33)) % 100_003
            arrays["labels"][lo : lo + len(rows), 0] = rows % 3 == 0
        for array in arrays.values():
            array.flush()
    last_day = f"day_{len(rows_per_day) - 1}_"
    return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory) if not f.startswith(last_day))


def _mmap_loader_rss_growth_and_digest(directory: str, release: bool):
    """In a fresh process: the growth of the peak RSS while one rank's --mmap_mode loader
    reads the whole training split, and a digest of every batch it built."""
    import hashlib

    from data.binary.mapped_pages import RELEASE_EVERY_BYTES

    loader = CriteoBinaryLoader(
        CriteoBinaryDataset(directory),
        "train",
        4096,
        0,
        1,
        mmap_mode=True,
        release_every_bytes=RELEASE_EVERY_BYTES if release else None,
    )
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak RSS (VmHWM) to the current RSS

    def status(key: str) -> int:
        with open("/proc/self/status") as f:
            return int(re.search(rf"{key}:\s+(\d+) kB", f.read()).group(1)) << 10

    before, digest = status("VmRSS"), hashlib.sha256()
    for batch in loader:
        for tensor in (batch.dense_features, batch.sparse_features.values(), batch.labels):
            digest.update(tensor.numpy().tobytes())
    return status("VmHWM") - before, digest.hexdigest()


@pytest.mark.slow
def test_mmap_loader_rss_stays_bounded_on_a_large_file(tmp_path):
    """Over 1.2 GB of training files the loader's RSS grows by a small fraction of
    them, while the same loader keeping the pages it read mapped grows by nearly all of
    them (the measurement can tell); the batches are the same either way."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # The last day (validation and test) is small: the test reads the training split only.
    train_bytes = _write_large_days(str(tmp_path), rows_per_day=[3_750_000, 3_750_000, 4096])
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        released, digest = pool.submit(_mmap_loader_rss_growth_and_digest, str(tmp_path), True).result()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        kept, kept_digest = pool.submit(_mmap_loader_rss_growth_and_digest, str(tmp_path), False).result()
    assert train_bytes > 1.1e9
    assert released < 0.15 * train_bytes, (released, train_bytes)
    assert kept > 0.8 * train_bytes, (kept, train_bytes)
    assert digest == kept_digest


def test_one_raw_day_is_written_and_one_binary_day_refused(tmp_path, capsys):
    """`--format tsv --num_days 1` writes the one raw day a user scores with
    serving.predict (it was refused as if it were a training set); the binary layout,
    which the trainer splits into train and eval days, still needs 2."""
    from data.synthetic_criteo import main

    raw = tmp_path / "raw"
    assert main(["--format", "tsv", "--num_days", "1", "--rows_per_day", "50", "--output_dir", str(raw)]) == 0
    assert capsys.readouterr().out == (
        f"raw Criteo TSV: 1 day (enough to score with serving.predict; training needs 2) of 50 lines at {raw}\n"
    )
    assert os.listdir(raw) == ["day_0"]
    with open(raw / "day_0") as f:
        lines = f.read().splitlines()
    assert len(lines) == 50 and {len(line.split("\t")) for line in lines} == {40}
    assert main(["--num_days", "1", "--rows_per_day", "50", "--output_dir", str(tmp_path / "bin")]) == 2
    assert capsys.readouterr().err.strip().endswith("--num_days must be at least 2 (train + eval), got 1")
