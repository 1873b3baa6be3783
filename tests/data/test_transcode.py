"""Bring your own dataset: feature spec validation, CSV -> split_binary -> loader, training."""

import os
import shutil

import numpy as np
import pytest
import yaml

import dlrm_main
from data import transcode as transcode_cli
from data.binary.criteo import CriteoBinaryDataset, CriteoBinaryLoader
from data.binary.feature_spec import FeatureSpec, FeatureSpecError
from data.binary.split import SplitBinaryDataset
from data.synthetic_csv import csv_feature_spec, generate_csv
from data.transcode import TranscodeError, transcode
from harness.launch import eval_record, launch, read_log, step_losses
from training.flags import parse_config
from training.recipes import DCNV2

ROWS = {"train": 700, "test": 301}


def _write_csv(directory: str, raw: dict, rows: dict = ROWS, seed: int = 0) -> None:
    spec = FeatureSpec.from_dict(raw, directory, os.path.join(directory, "feature_spec.yaml"), allow_auto=True)
    generate_csv(spec, directory, rows, seed=seed, auto_cardinality=300)


def _csv(directory: str, relative: str) -> np.ndarray:
    return np.loadtxt(os.path.join(directory, relative), delimiter=",", ndmin=2)


@pytest.mark.parametrize(
    "num_numerical, num_categorical, hotness",
    [
        (2, 1, None),
        (13, 10, {3: 4}),
        (30, 30, {0: 2, 29: 3}),
    ],
)
def test_round_trip_csv_transcode_load(tmp_path, num_numerical, num_categorical, hotness):
    """Numerical values come back as the CSV values rounded to the nearest float16
    (relative error at most 2^-11); ids and labels come back exactly."""
    raw = csv_feature_spec(num_numerical, num_categorical, cardinality="auto", hotness=hotness)
    # Declared cardinalities that need each id width; the rest stay auto.
    declared = {0: 100, 1: 40_000}
    for i, cardinality in declared.items():
        if i < num_categorical:
            raw["feature_spec"][f"cat_{i}"]["cardinality"] = cardinality
    csv_dir, out_dir = str(tmp_path / "csv"), str(tmp_path / "bin")
    _write_csv(csv_dir, raw)
    spec = transcode(csv_dir, "feature_spec.yaml", out_dir, block_rows=128)  # several blocks per file

    dataset = SplitBinaryDataset(os.path.join(out_dir, "feature_spec.yaml"))
    assert dataset.sparse_feature_names == [f"cat_{i}" for i in range(num_categorical)]
    widths = [(hotness or {}).get(i, 1) for i in range(num_categorical)]
    train, test = ROWS["train"], ROWS["test"]
    for mapping, (start, stop) in (("train", (0, train)), ("test", (train, train + test))):
        dense, sparse, labels = dataset.read(start, stop)
        expected_dense = _csv(csv_dir, f"{mapping}/numerical.csv")
        assert dense.dtype == np.float16 and dense.shape == (stop - start, num_numerical)
        np.testing.assert_array_equal(dense, expected_dense.astype(np.float16))
        np.testing.assert_allclose(dense.astype(np.float64), expected_dense, rtol=2**-11, atol=2**-24)
        ids = _csv(csv_dir, f"{mapping}/categorical.csv").astype(np.int64)
        columns = np.cumsum([0] + widths)
        for f, part in enumerate(sparse):
            np.testing.assert_array_equal(part, ids[:, columns[f] : columns[f + 1]])
        np.testing.assert_array_equal(labels, _csv(csv_dir, f"{mapping}/label.csv")[:, 0].astype(bool))

    # Cardinalities: declared ones kept, auto ones are the largest id + 1 over both mappings.
    all_ids = np.concatenate([_csv(csv_dir, f"{m}/categorical.csv") for m in ("train", "test")])
    for f, name in enumerate(spec.categorical):
        entry = spec.feature_spec[name]
        largest = int(all_ids[:, columns[f] : columns[f + 1]].max())
        assert entry["cardinality"] == declared.get(f, largest + 1)
        expected_dtype = {100: "int8", 40_000: "int32"}.get(entry["cardinality"], "int16")
        assert entry["dtype"] == expected_dtype
        size = os.path.getsize(os.path.join(out_dir, "train", f"cat_{f}.bin"))
        assert size == train * widths[f] * np.dtype(expected_dtype).itemsize
    assert os.path.getsize(os.path.join(out_dir, "train", "label.bin")) == train
    assert os.path.getsize(os.path.join(out_dir, "train", "numerical.bin")) == train * num_numerical * 2


def test_loader_reads_each_ranks_rows_of_every_global_batch(tmp_path):
    csv_dir, out_dir = str(tmp_path / "csv"), str(tmp_path / "bin")
    _write_csv(csv_dir, csv_feature_spec(3, 2, hotness={1: 2}))
    transcode(csv_dir, "feature_spec.yaml", out_dir)
    dataset = SplitBinaryDataset(os.path.join(out_dir, "feature_spec.yaml"))
    batch_size, train, test = 64, ROWS["train"], ROWS["test"]
    for split, (start, stop) in (
        ("train", (0, train)),
        ("validation", (train, train + test // 2)),
        ("test", (train + test // 2, train + test)),
    ):
        ranks = [list(CriteoBinaryLoader(dataset, split, batch_size, rank, 2)) for rank in range(2)]
        assert len(ranks[0]) == len(ranks[1])
        labels = np.concatenate([b.labels.numpy() for pair in zip(*ranks) for b in pair])
        dense = np.concatenate([b.dense_features.numpy() for pair in zip(*ranks) for b in pair])
        expected_dense, expected_sparse, expected_labels = dataset.read(start, start + len(labels))
        assert stop - start - len(labels) < 2  # at most world_size - 1 rows dropped
        np.testing.assert_array_equal(labels, expected_labels)
        np.testing.assert_array_equal(dense, expected_dense.astype(np.float32))
        first = ranks[1][0].sparse_features.to_dict()["cat_1"]
        np.testing.assert_array_equal(
            first.values().numpy().reshape(-1, 2), expected_sparse[1][batch_size : 2 * batch_size]
        )
    # Lazy reads from the memory map give the in-memory loader's batches, in file
    # order and in a row permutation (scattered reads with `take`).
    for seed in (None, 5):
        loaders = [
            CriteoBinaryLoader(dataset, "train", batch_size, 1, 2, row_permutation_seed=seed, mmap_mode=mmap)
            for mmap in (False, True)
        ]
        for a, b in zip(*loaders):
            assert a.sparse_features.values().tolist() == b.sparse_features.values().tolist()
            assert a.labels.tolist() == b.labels.tolist()


def test_several_files_per_chunk_and_chunks_of_unequal_length(tmp_path):
    csv_dir = str(tmp_path / "csv")
    raw = csv_feature_spec(2, 3, cardinality=500)
    _write_csv(csv_dir, raw)
    # Split train/categorical.csv into two files of one chunk: the rows are read in file order.
    lines = open(os.path.join(csv_dir, "train", "categorical.csv")).readlines()
    for part, chunk in (("a", lines[:250]), ("b", lines[250:])):
        with open(os.path.join(csv_dir, "train", f"categorical_{part}.csv"), "w") as f:
            f.writelines(chunk)
    raw["source_spec"]["train"][1]["files"] = ["train/categorical_a.csv", "train/categorical_b.csv"]
    with open(os.path.join(csv_dir, "feature_spec.yaml"), "w") as f:
        yaml.safe_dump(raw, f)
    spec = transcode(csv_dir, "feature_spec.yaml", str(tmp_path / "bin"), block_rows=100)
    _, sparse, _ = SplitBinaryDataset(spec.path).read(0, ROWS["train"])
    np.testing.assert_array_equal(np.concatenate(sparse, axis=1), _csv(csv_dir, "train/categorical.csv"))

    raw["source_spec"]["train"][1]["files"] = ["train/categorical_a.csv"]
    with open(os.path.join(csv_dir, "feature_spec.yaml"), "w") as f:
        yaml.safe_dump(raw, f)
    with pytest.raises(
        FeatureSpecError,
        match=r"source_spec train chunk 1 files hold 250 rows but chunk 0 files "
        r"hold 700$",
    ):
        transcode(csv_dir, "feature_spec.yaml", str(tmp_path / "bin"))


def test_rerun_replaces_output_and_bad_id_keeps_it(tmp_path, capsys):
    csv_dir, out_dir = str(tmp_path / "csv"), str(tmp_path / "bin")
    _write_csv(csv_dir, csv_feature_spec(2, 2))
    argv = ["--input", csv_dir, "--output", out_dir]
    assert transcode_cli.main(argv) == 0
    _write_csv(csv_dir, csv_feature_spec(2, 2), rows={"train": 500, "test": 100}, seed=1)
    assert transcode_cli.main(argv) == 0
    assert SplitBinaryDataset(os.path.join(out_dir, "feature_spec.yaml")).num_rows == 600  # not 1001 + 600
    assert sorted(os.listdir(tmp_path)) == ["bin", "csv"]  # no staging or old directories left

    # A declared cardinality at or below an id in the data: one line naming the feature and the id.
    ids = _csv(csv_dir, "train/categorical.csv")
    raw = csv_feature_spec(2, 2)
    raw["feature_spec"]["cat_1"]["cardinality"] = int(ids[:, 1].max())
    with open(os.path.join(csv_dir, "feature_spec.yaml"), "w") as f:
        yaml.safe_dump(raw, f)
    capsys.readouterr()
    assert transcode_cli.main(argv) == 2
    line = int(np.flatnonzero(ids[:, 1] == ids[:, 1].max())[0]) + 1
    err = capsys.readouterr().err.strip()
    assert err == (
        f"python -m data.transcode: error: {csv_dir}/train/categorical.csv: line {line}: feature 'cat_1' "
        f"has id {int(ids[:, 1].max())}, but its declared cardinality is {int(ids[:, 1].max())} "
        f"(ids 0..{int(ids[:, 1].max()) - 1})"
    )
    assert SplitBinaryDataset(os.path.join(out_dir, "feature_spec.yaml")).num_rows == 600  # previous output kept


@pytest.fixture(scope="module")
def binary_spec(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("byo_spec")
    _write_csv(str(root / "csv"), csv_feature_spec(2, 2, cardinality=300))
    transcode(str(root / "csv"), "feature_spec.yaml", str(root / "bin"))
    return str(root / "bin" / "feature_spec.yaml")


def _break_spec(raw: dict, base: str, problem: str) -> None:
    features, chunks = raw["feature_spec"], raw["source_spec"]
    if problem == "unknown feature":
        chunks["train"][2]["features"].append("bogus")
    elif problem == "feature in no chunk":
        chunks["test"] = [c for c in chunks["test"] if c["features"] != ["cat_1"]]
    elif problem == "missing cardinality":
        del features["cat_0"]["cardinality"]
    elif problem == "dtype too small":
        features["cat_0"].update(dtype="int8", cardinality=1000)
    elif problem == "file missing":
        os.remove(os.path.join(base, "train", "cat_1.bin"))
    elif problem == "file length":
        with open(os.path.join(base, "test", "label.bin"), "ab") as f:
            f.write(b"\x01")
    elif problem == "label size":
        raw["channel_spec"]["label"] = []
    elif problem == "numerical dtype":
        features["num_1"]["dtype"] = "float32"


@pytest.mark.parametrize(
    "problem, message",
    [
        ("unknown feature", "source_spec train chunk 2 lists unknown feature 'bogus' (not in channel_spec)"),
        ("feature in no chunk", "feature 'cat_1' is in no chunk of source_spec test"),
        ("missing cardinality", "categorical feature 'cat_0' has no cardinality"),
        ("dtype too small", "categorical feature 'cat_0': dtype int8 is too small for cardinality 1000 (needs int16)"),
        ("file missing", "file train/cat_1.bin of source_spec train is missing"),
        ("file length", "file test/label.bin holds 302 rows but test/numerical.bin holds 301 (source_spec test)"),
        ("label size", "channel_spec label must list exactly one feature, got 0"),
        (
            "numerical dtype",
            "source_spec train chunk 0: split_binary stores numerical feature 'num_1' as float16, "
            "but feature_spec gives dtype float32",
        ),
    ],
)
def test_each_spec_problem_is_one_clear_error(binary_spec, tmp_path, capsys, problem, message):
    base = str(tmp_path / "data")
    shutil.copytree(os.path.dirname(binary_spec), base)
    with open(binary_spec) as f:
        raw = yaml.safe_load(f)
    _break_spec(raw, base, problem)
    path = os.path.join(base, "feature_spec.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(raw, f)
    with pytest.raises(FeatureSpecError) as error:
        SplitBinaryDataset(path)
    if problem == "file missing":
        message += f" ({base}/train/cat_1.bin)"
    assert str(error.value) == f"{path}: {message}"
    # Through the entry point's flags: exit 2 and the same line on stderr. Problems in
    # the files show when the data set opens (on every rank, before any collective).
    if problem not in ("file missing", "file length"):
        with pytest.raises(SystemExit) as exit_info:
            parse_config(["--dataset_path", path], "dlrm_main.py", "")
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.strip() == f"dlrm_main.py: error: --dataset_path: {path}: {message}"


def test_both_entry_points_take_feature_counts_from_the_spec(binary_spec):
    for prog, defaults in (("dlrm_main.py", None), ("dcnv2_main.py", DCNV2)):
        config = parse_config(["--dataset_path", binary_spec], prog, "", defaults)
        assert config.model.sparse_feature_names == ["cat_0", "cat_1"]
        assert config.model.dense_in_features == 2
        assert config.model.num_embeddings_per_feature == [300, 300]


@pytest.mark.slow
def test_two_ranks_learn_from_byo_data(tmp_path):
    csv_dir, out_dir, log = str(tmp_path / "csv"), str(tmp_path / "bin"), str(tmp_path / "log.jsonl")
    raw = csv_feature_spec(7, 5, cardinality="auto", hotness={2: 3})
    _write_csv(csv_dir, raw, rows={"train": 16_384, "test": 4096}, seed=3)
    transcode(csv_dir, "feature_spec.yaml", out_dir)
    argv = [
        "--dataset_path",
        os.path.join(out_dir, "feature_spec.yaml"),
        "--log_path",
        log,
        "--log_every_n_steps",
        "1",
        "--seed",
        "3",
        "--batch_size",
        "128",
        "--embedding_dim",
        "16",
        "--dense_arch_layer_sizes",
        "32,16",
        "--over_arch_layer_sizes",
        "32,1",
        "--optimizer",
        "adagrad",
        "--learning_rate",
        "0.05",
    ]
    assert launch(dlrm_main.main, argv) == {0: 0, 1: 0}
    records = read_log(log)
    assert len(step_losses(records)) == 64  # 16384 rows / (128 x 2 ranks)
    test = eval_record(records, "test")
    assert test["num_samples"] == 2048  # the second half of the test mapping
    assert test["auroc"] > 0.65, test


def test_criteo_days_through_a_generated_spec(synthetic_dir, tmp_path, capsys):
    from data.criteo_feature_spec import main as criteo_spec_main

    out = str(tmp_path / "criteo_byo")
    assert criteo_spec_main(["--input", synthetic_dir, "--output", out, "--chunk_size", "10000"]) == 0
    criteo, byo = CriteoBinaryDataset(synthetic_dir), SplitBinaryDataset(os.path.join(out, "feature_spec.yaml"))
    assert byo.split_ranges() == criteo.split_ranges()
    assert byo.num_embeddings_per_feature == criteo.num_embeddings_per_feature
    for name, cardinality in zip(byo.sparse_feature_names, byo.num_embeddings_per_feature):
        assert byo.spec.feature_spec[name]["dtype"] == ("int8" if cardinality <= 128 else "int16")
    for start, stop in ((24_000, 26_000), (49_152, 49_500), (73_000, 73_728)):  # across a day, validation, test
        dense, sparse, labels = criteo.read(start, stop)
        got_dense, got_sparse, got_labels = byo.read(start, stop)
        np.testing.assert_array_equal(got_dense, dense.astype(np.float16))
        np.testing.assert_array_equal(np.concatenate(got_sparse, axis=1), sparse)
        np.testing.assert_array_equal(got_labels, labels[:, 0].astype(bool))


@pytest.mark.parametrize(
    "bad, reason",
    [
        ("3,abc", "column 2 is not a number: 'abc'"),
        ("3", "has 1 columns, expected 2"),
        ("", "empty line"),
        ("#1,2", "column 1 is not a number: '#1'"),
    ],
)
def test_bad_csv_line_is_named_exactly(tmp_path, bad, reason):
    """The exact line, also in the second block of a file and for a blank line (which
    numpy's reader would skip, shifting every later row)."""
    csv_dir = str(tmp_path / "csv")
    _write_csv(csv_dir, csv_feature_spec(2, 2, cardinality=500))
    path = os.path.join(csv_dir, "train", "categorical.csv")
    lines = open(path).readlines()
    lines[149] = bad + "\n"
    with open(path, "w") as f:
        f.writelines(lines)
    with pytest.raises(TranscodeError) as error:
        transcode(csv_dir, "feature_spec.yaml", str(tmp_path / "bin"), block_rows=100)
    assert str(error.value) == f"{path}: line 150: {reason}"
    assert not os.path.exists(tmp_path / "bin")


@pytest.mark.parametrize(
    "bad, reason",
    [
        ("nan", "feature 'num_1' is nan; numerical values must be finite"),
        ("-inf", "feature 'num_1' is -inf; numerical values must be finite"),
        ("70000", "feature 'num_1' is 70000, beyond float16's range (+-65504) that split_binary stores"),
    ],
)
def test_numerical_value_split_binary_cannot_hold_is_refused(tmp_path, bad, reason):
    csv_dir = str(tmp_path / "csv")
    _write_csv(csv_dir, csv_feature_spec(2, 2, cardinality=500))
    path = os.path.join(csv_dir, "test", "numerical.csv")
    lines = open(path).readlines()
    lines[41] = lines[41].split(",")[0] + f",{bad}\n"
    with open(path, "w") as f:
        f.writelines(lines)
    with pytest.raises(TranscodeError) as error:
        transcode(csv_dir, "feature_spec.yaml", str(tmp_path / "bin"))
    assert str(error.value) == f"{path}: line 42: {reason}"


def test_empty_mapping_is_refused(tmp_path):
    csv_dir = str(tmp_path / "csv")
    _write_csv(csv_dir, csv_feature_spec(2, 2, cardinality=500))
    for name in ("numerical", "categorical", "label"):
        open(os.path.join(csv_dir, "test", f"{name}.csv"), "w").close()
    with pytest.raises(TranscodeError) as error:
        transcode(csv_dir, "feature_spec.yaml", str(tmp_path / "bin"))
    assert str(error.value) == f"{csv_dir}/feature_spec.yaml: source_spec test chunk 0: its files hold no rows"
