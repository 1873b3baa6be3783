"""Sample weights: the spec's weight channel, the transcoder, the loader's batches, the
weighted loss and metrics, bad weights, and 2 ranks against 1 with weights."""

import math
import os
import shutil
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml

from common.config_flags import FlagError
from data import transcode as transcode_cli
from data.batching import BatchBuilder, WeightedBatch
from data.batching.value_checks import DataValueError
from data.binary.criteo import CriteoBinaryLoader
from data.binary.feature_spec import FeatureSpec, FeatureSpecError
from data.binary.split import SplitBinaryDataset
from data.config import DataConfig
from data.sources import source_for
from harness.launch import launch
from models import build_dlrm_train
from models.config import ModelConfig
from training.distributed import resolve_env
from training.flags import parse_config
from training.metrics import BinaryClassificationMetrics
from training.trainer import Trainer

COLUMNS = ["label", "num_0", "num_1", "cat_0", "cat_1", "w"]
CARDINALITIES = {"cat_0": 11, "cat_1": 23}


def _write_csv(directory: str, rows: dict[str, int], seed: int = 0, ones: bool = False) -> dict[str, np.ndarray]:
    """One CSV chunk per mapping with a weight column ``w`` the input spec does not name
    (the transcoder's --weight_column does); returns each mapping's rows."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory)
    data = {}
    for mapping, n in rows.items():
        ids = np.stack([rng.integers(0, c, n) for c in CARDINALITIES.values()], axis=1)
        dense = rng.random((n, 2))
        # Clicks depend on the first id, so that a model learns something.
        labels = (rng.random(n) < 0.2 + 0.6 * (ids[:, 0] % 2)).astype(float)
        weights = np.ones(n) if ones else np.round(rng.random(n) * 4, 3)  # zeros included
        data[mapping] = np.column_stack([labels, dense, ids, weights])
        np.savetxt(os.path.join(directory, f"{mapping}.csv"), data[mapping], delimiter=",", fmt="%.6g")
    spec = {
        "feature_spec": {
            "label": {},
            "num_0": {},
            "num_1": {},
            "w": {},
            **{name: {"cardinality": c} for name, c in CARDINALITIES.items()},
        },
        "channel_spec": {"label": ["label"], "numerical": ["num_0", "num_1"], "categorical": list(CARDINALITIES)},
        "source_spec": {m: [{"type": "csv", "features": COLUMNS, "files": [f"{m}.csv"]}] for m in rows},
    }
    with open(os.path.join(directory, "feature_spec.yaml"), "w") as f:
        yaml.safe_dump(spec, f)
    return data


@pytest.fixture(scope="module")
def weighted_spec(tmp_path_factory):
    root = tmp_path_factory.mktemp("weighted")
    data = _write_csv(str(root / "csv"), {"train": 100, "test": 40})
    assert (
        transcode_cli.main(
            ["--input", str(root / "csv"), "--output", str(root / "bin"), "--weight_column", "w", "--chunk_size", "30"]
        )
        == 0
    )
    return str(root / "bin" / "feature_spec.yaml"), data


def test_transcoder_stores_the_weight_column_as_float32(weighted_spec):
    spec_path, data = weighted_spec
    written = yaml.safe_load(open(spec_path))
    assert written["channel_spec"]["weight"] == ["w"]
    assert written["feature_spec"]["w"] == {"dtype": "float32"}
    base = os.path.dirname(spec_path)
    for mapping in ("train", "test"):
        assert {"type": "split_binary", "features": ["w"], "files": [f"{mapping}/weight.bin"]} in written[
            "source_spec"
        ][mapping]
        stored = np.fromfile(os.path.join(base, mapping, "weight.bin"), dtype=np.float32)
        np.testing.assert_array_equal(stored, data[mapping][:, 5].astype(np.float32))
        labels = np.fromfile(os.path.join(base, mapping, "label.bin"), dtype=np.bool_)
        np.testing.assert_array_equal(labels, data[mapping][:, 0] == 1)  # the other columns are where they were


@pytest.mark.parametrize("mmap_mode", [False, True])
def test_loader_batches_carry_each_ranks_weights_and_the_global_sum(weighted_spec, mmap_mode):
    spec_path, data = weighted_spec
    dataset = SplitBinaryDataset(spec_path, weight_column="w")
    weights = data["train"][:, 5].astype(np.float32)
    # 100 rows, global batches of 2 x 16: three full ones, then 4 rows split 2 + 2.
    per_rank = [
        list(CriteoBinaryLoader(dataset, "train", batch_size=16, rank=r, world_size=2, mmap_mode=mmap_mode))
        for r in (0, 1)
    ]
    assert [len(batches) for batches in per_rank] == [4, 4]
    for b, (start, size) in enumerate([(0, 16), (32, 16), (64, 16), (96, 2)]):
        total = weights[start : start + 2 * size].sum(dtype=np.float64)
        for rank in (0, 1):
            batch = per_rank[rank][b]
            assert isinstance(batch, WeightedBatch)
            mine = slice(start + rank * size, start + (rank + 1) * size)
            np.testing.assert_array_equal(batch.weights.numpy(), weights[mine])
            np.testing.assert_array_equal(batch.labels.numpy(), data["train"][mine, 0])
            assert batch.weight_normalizer.item() == pytest.approx(total / 2, rel=1e-6)
    moved = per_rank[0][0].to(torch.device("cpu"))
    assert isinstance(moved, WeightedBatch) and torch.equal(moved.weights, per_rank[0][0].weights)


def test_shuffled_batches_carry_the_same_weights_in_memory_and_mapped(weighted_spec):
    """Row permutation and batch shuffling: both modes give the same batches, and each
    normalizer is half the sum of the two ranks' weights of that global batch."""
    spec_path, data = weighted_spec
    dataset = SplitBinaryDataset(spec_path, weight_column="w")
    runs = {}
    for mmap_mode in (False, True):
        loaders = [
            CriteoBinaryLoader(
                dataset,
                "train",
                batch_size=12,
                rank=r,
                world_size=2,
                mmap_mode=mmap_mode,
                row_permutation_seed=7,
                shuffle_batches_seed=7,
            )
            for r in (0, 1)
        ]
        for loader in loaders:
            loader.set_epoch(1)
        runs[mmap_mode] = [list(loader) for loader in loaders]
    for in_memory, mapped in zip(runs[False], runs[True]):
        for a, b in zip(in_memory, mapped):
            assert torch.equal(a.weights, b.weights) and torch.equal(a.weight_normalizer, b.weight_normalizer)
    for first, second in zip(*runs[False]):
        total = (first.weights.double().sum() + second.weights.double().sum()).item()
        assert first.weight_normalizer.item() == second.weight_normalizer.item() == pytest.approx(total / 2, rel=1e-6)
    shown = torch.cat([b.weights for rank in runs[False] for b in rank]).sort().values
    # 100 rows, global batches of 24: 4 full ones, then 4 rows split 2 + 2: every row once.
    np.testing.assert_array_equal(shown.numpy(), np.sort(data["train"][:, 5].astype(np.float32)))


def test_without_weight_column_batches_are_plain_and_the_weights_unread(weighted_spec):
    spec_path, _ = weighted_spec
    dataset = SplitBinaryDataset(spec_path)
    assert "weight.bin" not in " ".join(f.path for f in dataset.value_files())
    batch = next(iter(CriteoBinaryLoader(dataset, "train", batch_size=8, rank=0, world_size=1)))
    assert type(batch).__name__ == "Batch"


def test_weight_column_must_be_the_specs_weight(weighted_spec, tmp_path):
    spec_path, _ = weighted_spec
    with pytest.raises(
        FeatureSpecError,
        match=r"weight column 'x' is not the spec's channel_spec weight "
        r"\(its weight is 'w'\)",
    ):
        SplitBinaryDataset(spec_path, weight_column="x")
    with pytest.raises(
        FlagError,
        match=r"^--weight_column needs data with sample weights \(--dataset_path or "
        r"--parquet_path\); "
        r"random data has none$",
    ):
        DataConfig(weight_column="w").validate()


@pytest.mark.parametrize("bad", ["-0.5", "nan", "inf", "1e39"])
def test_bad_weight_in_csv_is_one_line_with_file_line_and_column(tmp_path, capsys, bad):
    csv_dir = str(tmp_path / "csv")
    _write_csv(csv_dir, {"train": 50, "test": 20})
    path = os.path.join(csv_dir, "test.csv")
    lines = open(path).readlines()
    lines[12] = lines[12].rsplit(",", 1)[0] + f",{bad}\n"
    open(path, "w").writelines(lines)
    assert transcode_cli.main(["--input", csv_dir, "--output", str(tmp_path / "bin"), "--weight_column", "w"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"python -m data.transcode: error: {path}: line 13: weight 'w' is {float(bad)}; "
        "weights must be finite float32 values, not negative"
    )
    assert not os.path.exists(tmp_path / "bin")


@pytest.mark.parametrize("mmap_mode", [False, True])
def test_bad_weight_in_split_binary_is_refused_naming_file_row_and_column(weighted_spec, tmp_path, mmap_mode):
    spec_path, _ = weighted_spec
    copy = tmp_path / "bin"
    shutil.copytree(os.path.dirname(spec_path), copy)
    weights = np.memmap(copy / "train" / "weight.bin", dtype=np.float32, mode="r+")
    weights[37] = np.nan
    weights.flush()
    message = f"{copy}/train/weight.bin row 37 column w: weight nan (weights must be finite and not negative)"
    config = DataConfig.from_flags(dataset_path=str(copy / "feature_spec.yaml"), weight_column="w", mmap_mode=mmap_mode)
    if not mmap_mode:
        with pytest.raises(DataValueError) as error:
            source_for(config).open()
    else:
        loader = CriteoBinaryLoader(
            source_for(config).open(), "train", batch_size=16, rank=1, world_size=2, mmap_mode=True
        )
        with pytest.raises(DataValueError) as error:
            list(loader)  # row 37 is rank 0's, in the global batch whose weight sum rank 1 needs too
    assert str(error.value) == message


def _model_and_batch(weights: list[float]):
    config = ModelConfig(
        num_embeddings_per_feature=list(CARDINALITIES.values()),
        sparse_feature_names=list(CARDINALITIES),
        dense_in_features=2,
        embedding_dim=4,
        dense_arch_layer_sizes=[8, 4],
        over_arch_layer_sizes=[8, 1],
    )
    torch.manual_seed(0)
    weighted = build_dlrm_train(
        config, dense_device=torch.device("cpu"), embedding_device=torch.device("cpu"), weighted=True
    )
    plain = build_dlrm_train(config, dense_device=torch.device("cpu"), embedding_device=torch.device("cpu"))
    plain.load_state_dict(weighted.state_dict())
    rng = np.random.default_rng(1)
    n = len(weights)
    arrays = (
        rng.random((n, 2)),
        np.stack([rng.integers(0, c, n) for c in CARDINALITIES.values()], axis=1),
        rng.integers(0, 2, n),
    )
    build = BatchBuilder(list(CARDINALITIES))
    w = np.asarray(weights, dtype=np.float32)
    return weighted, plain, build(*arrays), build(*arrays, weights=w, weight_normalizer=float(w.sum()))


def test_weighted_loss_is_the_weighted_mean_by_hand():
    weights = [0.0, 1.0, 2.5, 0.25, 3.0, 1.0]
    weighted, plain, _, batch = _model_and_batch(weights)
    loss, (_, logits, labels, carried) = weighted(batch)
    p = torch.sigmoid(logits.double())
    y = labels.double()
    by_hand = sum(w * -(yi * math.log(pi) + (1 - yi) * math.log(1 - pi)) for w, pi, yi in zip(weights, p, y)) / sum(
        weights
    )
    assert loss.item() == pytest.approx(float(by_hand), rel=1e-6)
    assert torch.equal(carried, batch.weights)


def test_weight_one_everywhere_is_the_unweighted_loss_bit_for_bit():
    weighted, plain, unweighted_batch, batch = _model_and_batch([1.0] * 64)
    loss, _ = weighted(batch)
    reference, _ = plain(unweighted_batch)
    assert loss.item() == reference.item()
    loss.backward()
    reference.backward()
    for (name, a), b in zip(weighted.named_parameters(), plain.parameters()):
        assert torch.equal(a.grad, b.grad), name


def test_integer_weights_are_repeated_rows_in_the_metrics():
    """Weighted metrics of rows with weights k equal the unweighted metrics of the rows
    repeated k times: log loss, accuracy, NE, calibration, positive rate, and the AUROC
    (same histogram)."""
    rng = np.random.default_rng(2)
    logits = torch.from_numpy(rng.normal(size=300)).float()
    labels = torch.from_numpy((rng.random(300) < torch.sigmoid(logits).numpy()).astype(np.int32))
    counts = torch.from_numpy(rng.integers(0, 4, 300))
    weighted = BinaryClassificationMetrics(torch.device("cpu"), weighted=True)
    weighted.update(logits, labels, counts.float())
    repeated = BinaryClassificationMetrics(torch.device("cpu"), auroc_bins=1_000_000)
    repeated.update(logits.repeat_interleave(counts), labels.repeat_interleave(counts))
    got, expected = weighted.compute(), repeated.compute()
    assert got["num_samples"] == 300
    for name in ("auroc", "auroc_error_bound", "log_loss", "accuracy", "ne", "calibration", "positive_rate"):
        assert got[name] == pytest.approx(expected[name], rel=1e-6), name  # the unweighted sum is in float32
    target = labels.double()
    losses = F.binary_cross_entropy_with_logits(logits.double(), target, reduction="none")
    by_hand = (counts * losses).sum() / counts.sum()
    assert got["log_loss"] == pytest.approx(by_hand.item(), rel=1e-6)


def _train(argv_list: list[list[str]]) -> list[dict[str, Any]]:
    results = []
    for argv in argv_list:
        result = Trainer(parse_config(argv, "test", "test"), resolve_env("cpu")).fit()
        results.append({"losses": result.train_losses, "test": result.test})
    dist.destroy_process_group()
    return results


@pytest.mark.slow
def test_two_ranks_with_weights_match_one_rank_and_weight_one_matches_unweighted(tmp_path):
    specs = {}
    for name, ones in (("weighted", False), ("ones", True)):
        _write_csv(str(tmp_path / name), {"train": 512, "test": 256}, seed=4, ones=ones)
        assert (
            transcode_cli.main(
                ["--input", str(tmp_path / name), "--output", str(tmp_path / f"{name}_bin"), "--weight_column", "w"]
            )
            == 0
        )
        specs[name] = str(tmp_path / f"{name}_bin" / "feature_spec.yaml")
    common = [
        "--embedding_dim",
        "4",
        "--dense_arch_layer_sizes",
        "8,4",
        "--over_arch_layer_sizes",
        "8,1",
        "--optimizer",
        "adagrad",
        "--learning_rate",
        "0.05",
        "--seed",
        "3",
        "--log_every_n_steps",
        "100",
        "--limit_val_batches",
        "0",
        "--device",
        "cpu",
        "--auroc_bins",
        "1000",
    ]
    weighted = ["--dataset_path", specs["weighted"], "--weight_column", "w", *common]
    two = launch(_train, [[*weighted, "--batch_size", "32"]], nproc=2)
    one = launch(
        _train,
        [
            [*weighted, "--batch_size", "64"],
            ["--dataset_path", specs["ones"], "--weight_column", "w", *common, "--batch_size", "64"],
            ["--dataset_path", specs["ones"], *common, "--batch_size", "64"],
        ],
        nproc=1,
    )
    sharded, reference = two[0][0], one[0][0]
    assert len(reference["losses"]) == 8
    np.testing.assert_allclose(sharded["losses"], reference["losses"], rtol=1e-5)
    for name in ("auroc", "log_loss", "accuracy", "calibration", "positive_rate"):
        assert sharded["test"][name] == pytest.approx(reference["test"][name], rel=1e-5), name
    ones, unweighted = one[0][1], one[0][2]
    assert ones["losses"] == unweighted["losses"]  # weight 1 everywhere: the unweighted run, bit for bit
    # The weighted metrics sum in float64, the unweighted log loss in float32.
    for name in ("log_loss", "accuracy", "calibration", "positive_rate"):
        assert ones["test"][name] == pytest.approx(unweighted["test"][name], rel=1e-6), name


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda raw: raw["channel_spec"].update(weight=["w", "num_0"]),
            "channel_spec weight lists at most one feature, got 2",
        ),
        (
            lambda raw: raw["feature_spec"]["w"].update(dtype="float16"),
            "source_spec train chunk 2: split_binary stores weight feature 'w' as float32, but feature_spec gives "
            "dtype float16",
        ),
        (lambda raw: raw["channel_spec"].update(label=["w"]), "feature 'w' is in channel_spec label and weight"),
    ],
)
def test_bad_weight_channel_is_one_clear_error(weighted_spec, tmp_path, change, message):
    spec_path, _ = weighted_spec
    raw = yaml.safe_load(open(spec_path))
    change(raw)
    with pytest.raises(FeatureSpecError) as error:
        FeatureSpec.from_dict(raw, os.path.dirname(spec_path), "spec.yaml")
    assert str(error.value) == f"spec.yaml: {message}"


def test_input_spec_may_name_the_weight_itself(tmp_path):
    csv_dir = str(tmp_path / "csv")
    data = _write_csv(csv_dir, {"train": 30, "test": 10})
    raw = yaml.safe_load(open(os.path.join(csv_dir, "feature_spec.yaml")))
    raw["channel_spec"]["weight"] = ["w"]
    yaml.safe_dump(raw, open(os.path.join(csv_dir, "feature_spec.yaml"), "w"))
    assert transcode_cli.main(["--input", csv_dir, "--output", str(tmp_path / "bin")]) == 0
    dataset = SplitBinaryDataset(str(tmp_path / "bin" / "feature_spec.yaml"), weight_column="w")
    np.testing.assert_array_equal(
        dataset.take_weights(np.array([29, 30, 0])),
        np.float32([data["train"][29, 5], data["test"][0, 5], data["train"][0, 5]]),
    )
    # The flag naming another column than the spec's: refused.
    assert transcode_cli.main(["--input", csv_dir, "--output", str(tmp_path / "bin2"), "--weight_column", "num_0"]) == 2
