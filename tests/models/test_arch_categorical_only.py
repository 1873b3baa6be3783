"""Data without numerical features (click logs of ids only, like Avazu) through every
step: feature spec, generator, transcoder, loader, DLRM / DCNv2 / projection models
without a bottom MLP, training on 1 and 2 ranks, checkpoint and resume, export,
predictor and HTTP endpoint.

The 1- and 2-rank runs train with SGD on the same global batches (64 rows per rank on
2 ranks, 128 on one), so losses and weights agree up to float rounding, 1e-6, as in
tests/training/test_sharding_equivalence.py.
"""

import json
import math
import os
import shutil
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torchmetrics.functional.classification import binary_auroc

from data.binary.criteo import CriteoBinaryLoader
from data.binary.feature_spec import FeatureSpec, FeatureSpecError
from data.binary.split import SplitBinaryDataset
from data.synthetic_csv import csv_feature_spec, generate_csv
from data.transcode import transcode
from harness.launch import launch
from harness.matrix import assemble_table, local_weights
from models import ModelConfig, build_dlrm_train
from models.arch import CategoricalOnlyDLRM
from serving import export, predict, serve
from serving.inference_model import ProbabilityModel, load_checkpoint_model
from serving.model_inputs import read_inputs
from serving.quality_gate import evaluate_variants
from tests.support.model_state import assert_same_state, flat_state, interaction_sizes, mlp_params
from training.distributed import resolve_env
from training.flags import parse_config
from training.trainer import Trainer

ROWS = {"train": 1024, "test": 512}
NUM_CATEGORICAL = 4
HOTNESS = [1, 2, 1, 1]  # cat_1: bags of two ids
CARDINALITY = 60
DIM = 8
TOLERANCE = 1e-6
STEPS = 6
INTERACTIONS = {
    "original": [],
    "dcn": ["--dcn_num_layers", "2", "--dcn_low_rank_dim", "4"],
    "projection": ["--interaction_branch1_layer_sizes", "16,16", "--interaction_branch2_layer_sizes", "16,24"],
}


def _make_data(root: str) -> dict[str, str]:
    """CSV of categorical features only -> split_binary; returns both directories."""
    csv_dir, bin_dir = os.path.join(root, "csv"), os.path.join(root, "bin")
    raw = csv_feature_spec(0, NUM_CATEGORICAL, cardinality=CARDINALITY, hotness={1: 2})
    spec = FeatureSpec.from_dict(raw, csv_dir, os.path.join(csv_dir, "feature_spec.yaml"))
    generate_csv(spec, csv_dir, ROWS, seed=7)
    transcode(csv_dir, "feature_spec.yaml", bin_dir, block_rows=300)
    return {"csv": csv_dir, "spec": os.path.join(bin_dir, "feature_spec.yaml")}


def test_spec_generator_transcoder_and_loader(tmp_path):
    paths = _make_data(str(tmp_path))
    assert sorted(os.listdir(os.path.join(paths["csv"], "train"))) == ["categorical.csv", "label.csv"]
    dataset = SplitBinaryDataset(paths["spec"])
    assert dataset.spec.numerical == [] and dataset.sparse_feature_names == [f"cat_{i}" for i in range(4)]
    assert sorted(os.listdir(os.path.join(os.path.dirname(paths["spec"]), "train"))) == [
        "cat_0.bin",
        "cat_1.bin",
        "cat_2.bin",
        "cat_3.bin",
        "label.bin",
    ]  # no numerical file
    for mapping, (start, stop) in (("train", (0, ROWS["train"])), ("test", (ROWS["train"], sum(ROWS.values())))):
        dense, sparse, labels = dataset.read(start, stop)
        assert dense.shape == (stop - start, 0)
        ids = np.loadtxt(os.path.join(paths["csv"], mapping, "categorical.csv"), delimiter=",").astype(np.int64)
        np.testing.assert_array_equal(np.concatenate(sparse, axis=1), ids)
        expected = np.loadtxt(os.path.join(paths["csv"], mapping, "label.csv")).astype(bool)
        np.testing.assert_array_equal(labels, expected)
    # Scattered rows across the train/test boundary keep the empty dense block's row count.
    dense, _, labels = dataset.take(np.array([5, ROWS["train"] + 3, 2]))
    assert dense.shape == (3, 0) and len(labels) == 3
    # Each rank's batches: (B, 0) dense features, the ids and labels of its rows.
    for rank in range(2):
        batches = list(CriteoBinaryLoader(dataset, "train", 64, rank, 2))
        assert len(batches) == ROWS["train"] // 128
        assert batches[1].dense_features.shape == (64, 0)
        _, sparse, labels = dataset.read(128 + 64 * rank, 192 + 64 * rank)
        np.testing.assert_array_equal(batches[1].labels.numpy(), labels)
        np.testing.assert_array_equal(batches[1].sparse_features["cat_1"].values().numpy().reshape(-1, 2), sparse[1])


def test_spec_without_categorical_features_is_refused(tmp_path):
    raw = csv_feature_spec(2, 0)
    with pytest.raises(FeatureSpecError, match="channel_spec categorical lists no feature"):
        FeatureSpec.from_dict(raw, str(tmp_path), "spec.yaml", allow_auto=True)
    raw = csv_feature_spec(0, 2)
    raw["source_spec"]["train"].append({"type": "csv", "features": [], "files": ["x.csv"]})
    with pytest.raises(FeatureSpecError, match="^spec.yaml: source_spec train chunk 2 lists no features$"):
        FeatureSpec.from_dict(raw, str(tmp_path), "spec.yaml", allow_auto=True)


def _config(interaction: str, **sizes: Any) -> ModelConfig:
    return ModelConfig(
        [10, 20, 30, 40],
        sparse_feature_names=[f"cat_{i}" for i in range(4)],
        dense_in_features=0,
        embedding_dim=DIM,
        interaction_type=interaction,
        over_arch_layer_sizes=[16, 1],
        dense_arch_layer_sizes=[3, 5],  # not used: no bottom MLP, and not checked
        interaction=interaction_sizes(
            interaction,
            dcn_num_layers=2,
            dcn_low_rank_dim=4,
            interaction_branch1_layer_sizes=[16, 16],
            interaction_branch2_layer_sizes=[16, 24],
        ),
        **sizes,
    )


@pytest.mark.parametrize("interaction", list(INTERACTIONS))
def test_model_interacts_over_the_embeddings_alone(interaction):
    """Parameter count from first principles, and the logits recomputed by hand from
    the pooled embeddings and the model's own weights."""
    torch.manual_seed(0)
    config = _config(interaction)
    model = build_dlrm_train(config, embedding_device=torch.device("cpu"))
    dlrm = model.model
    assert isinstance(dlrm, CategoricalOnlyDLRM) and not hasattr(dlrm, "dense_arch")
    F, D = NUM_CATEGORICAL, DIM
    if interaction == "original":
        interaction_params, over_in = 0, math.comb(F, 2)
    elif interaction == "dcn":
        interaction_params, over_in = 2 * (F * D * 4 * 2 + F * D), F * D
    else:
        interaction_params = mlp_params(F * D, [16, 16]) + mlp_params(F * D, [16, 24])
        over_in = (16 // D) * (24 // D)
    expected = sum(config.num_embeddings_per_feature) * D + interaction_params + mlp_params(over_in, [16, 1])
    assert sum(p.numel() for p in model.parameters()) == expected

    rng = np.random.default_rng(0)
    ids = torch.as_tensor((rng.random((5, F)) * np.array([10, 20, 30, 40])).astype(np.int64))
    probabilities = ProbabilityModel(dlrm, config.sparse_feature_names)(torch.zeros(5, 0), ids)
    embeddings = torch.stack(
        [dlrm.sparse_arch.embedding_bag_collection.embedding_bags[f"t_cat_{f}"].weight[ids[:, f]] for f in range(F)],
        dim=1,
    )  # (B, F, D)
    flat = embeddings.flatten(1)
    if interaction == "original":
        over_input = torch.stack(
            [(embeddings[:, i] * embeddings[:, j]).sum(1) for i in range(F) for j in range(i + 1, F)], dim=1
        )
    elif interaction == "dcn":
        over_input = dlrm.inter_arch.crossnet(flat)
    else:
        left = dlrm.inter_arch.interaction_branch1(flat).reshape(5, -1, D)
        right = dlrm.inter_arch.interaction_branch2(flat).reshape(5, D, -1)
        over_input = torch.einsum("bid,bdj->bij", left, right).flatten(1)
    assert over_input.shape == (5, over_in)
    expected_probabilities = torch.sigmoid(dlrm.over_arch(over_input).squeeze(-1))
    torch.testing.assert_close(probabilities, expected_probabilities, rtol=0, atol=1e-6)


def test_original_interaction_needs_two_features(tmp_path, capsys):
    """One categorical feature has no pair to multiply: one line, exit 2, from the flags."""
    csv_dir, bin_dir = str(tmp_path / "csv"), str(tmp_path / "bin")
    spec = FeatureSpec.from_dict(csv_feature_spec(0, 1, cardinality=10), csv_dir, "spec.yaml")
    generate_csv(spec, csv_dir, {"train": 20, "test": 10})
    transcode(csv_dir, "feature_spec.yaml", bin_dir)
    argv = ["--dataset_path", os.path.join(bin_dir, "feature_spec.yaml")]
    with pytest.raises(SystemExit) as exit_info:
        parse_config(argv, "dlrm_main.py", "")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "dlrm_main.py: error: --interaction_type original on data without numerical features multiplies pairs of "
        "embeddings and needs at least two categorical features, the data has 1: use dcn or projection"
    )
    assert parse_config(argv + ["--interaction_type", "dcn"], "dlrm_main.py", "").model.dense_in_features == 0


# --- end to end ------------------------------------------------------------------


def _flags(spec: str, interaction: str, ckpt: str, batch: int, *extra: str) -> list[str]:
    return [
        "--dataset_path",
        spec,
        "--interaction_type",
        interaction,
        *INTERACTIONS[interaction],
        "--embedding_dim",
        str(DIM),
        "--over_arch_layer_sizes",
        "16,1",
        "--optimizer",
        "sgd",
        "--learning_rate",
        "0.5",
        "--seed",
        "5",
        "--batch_size",
        str(batch),
        "--limit_train_batches",
        str(STEPS),
        "--limit_val_batches",
        "2",
        "--limit_test_batches",
        "2",
        "--log_every_n_steps",
        "100",
        "--device",
        "cpu",
        "--checkpoint_dir",
        ckpt,
        "--checkpoint_every_n_steps",
        "3",
        "--checkpoint_at_epoch_end",
        *extra,
    ]


def _train_variants(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Trains each run in turn on this launch's process group; a run with ``resume``
    (1-rank launches only) first gets a copy of that checkpoint in its own directory.
    Returns per run the losses and this rank's weights."""
    results = []
    for run in runs:
        if "resume" in run:
            source, target = run["resume"]
            os.makedirs(target)
            shutil.copytree(source, os.path.join(target, os.path.basename(source)))
        trainer = Trainer(parse_config(run["argv"], "test", "test"), resolve_env("cpu"))
        result = trainer.fit()
        results.append({"losses": result.train_losses, **local_weights(trainer.model)})
    dist.destroy_process_group()
    return results


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Each interaction on 2 ranks (batch 64, table-wise) and 1 rank (batch 128), with checkpoints
    at steps 3 and 6, and on 1 rank resumed from its step-3 checkpoint."""
    root = str(tmp_path_factory.mktemp("categorical_only"))
    paths = _make_data(root)
    ckpt = {
        (name, kind): os.path.join(root, f"ckpt_{name}_{kind}")
        for name in INTERACTIONS
        for kind in ("two", "one", "resumed")
    }
    # Table-wise: the sharded tables return their features grouped by rank, which the
    # model must put back in order.
    two = launch(
        _train_variants,
        [{"argv": _flags(paths["spec"], n, ckpt[n, "two"], 64, "--sharding_type", "table_wise")} for n in INTERACTIONS],
        nproc=2,
    )
    one_runs = []
    for name in INTERACTIONS:
        one_runs.append({"argv": _flags(paths["spec"], name, ckpt[name, "one"], 128)})
        one_runs.append(
            {
                "argv": _flags(paths["spec"], name, ckpt[name, "resumed"], 128, "--resume"),
                "resume": (os.path.join(ckpt[name, "one"], "step_000000003"), ckpt[name, "resumed"]),
            }
        )
    one = launch(_train_variants, one_runs, nproc=1)[0]
    results = {}
    for i, name in enumerate(INTERACTIONS):
        model_dir = os.path.join(root, f"model_{name}")
        assert (
            export.main(
                [
                    "--checkpoint",
                    ckpt[name, "two"],
                    "--output",
                    model_dir,
                    "--quantize",
                    "int8" if name == "original" else "none",
                ]
            )
            == 0
        )
        results[name] = {
            "two": [two[0][i], two[1][i]],
            "one": one[2 * i],
            "resumed": one[2 * i + 1],
            "ckpt": {kind: ckpt[name, kind] for kind in ("two", "one", "resumed")},
            "model": model_dir,
        }
    return {"paths": paths, "runs": results}


@pytest.mark.slow
@pytest.mark.parametrize("interaction", list(INTERACTIONS))
def test_two_ranks_train_like_one(trained, interaction):
    run = trained["runs"][interaction]
    reference, per_rank = run["one"], run["two"]
    assert len(reference["losses"]) == len(per_rank[0]["losses"]) == STEPS
    for a, b in zip(reference["losses"], per_rank[0]["losses"]):
        assert math.isclose(a, b, rel_tol=0, abs_tol=TOLERANCE), (reference["losses"], per_rank[0]["losses"])
    assert reference["losses"][-1] < reference["losses"][0]
    cardinalities = SplitBinaryDataset(trained["paths"]["spec"]).num_embeddings_per_feature
    for f, rows in enumerate(cardinalities):
        expected = assemble_table([reference], f"t_cat_{f}", rows, DIM)
        got = assemble_table(per_rank, f"t_cat_{f}", rows, DIM)
        assert torch.allclose(got, expected, rtol=0, atol=TOLERANCE), (f, (got - expected).abs().max())
    assert reference["dense"].keys() == per_rank[0]["dense"].keys()
    assert not any("dense_arch" in key for key in reference["dense"])
    for key, expected in reference["dense"].items():
        for result in per_rank:
            assert torch.allclose(result["dense"][key], expected, rtol=0, atol=TOLERANCE), key


@pytest.mark.slow
@pytest.mark.parametrize("interaction", list(INTERACTIONS))
def test_resume_is_bit_identical(trained, interaction, tmp_path):
    run = trained["runs"][interaction]
    assert run["resumed"]["losses"] == run["one"]["losses"][3:]  # steps 4..6, identical
    final = "step_000000006"
    assert_same_state(
        flat_state(os.path.join(run["ckpt"]["one"], final), tmp_path),
        flat_state(os.path.join(run["ckpt"]["resumed"], final), tmp_path),
    )


def _csv_rows(csv_dir: str) -> list[str]:
    """The test mapping as the predictor's rows: label, then the ids."""
    parts = [
        open(os.path.join(csv_dir, "test", f"{name}.csv")).read().splitlines() for name in ("label", "categorical")
    ]
    return [",".join(fields) for fields in zip(*parts)]


@pytest.mark.slow
@pytest.mark.parametrize("interaction", list(INTERACTIONS))
def test_exported_model_equals_eager(trained, interaction, tmp_path):
    """The exported program gives the eager model's probabilities (the 2-rank
    checkpoint loaded in one process), through the quality gate and from CSV rows of
    ids only."""
    model_dir = trained["runs"][interaction]["model"]
    inputs = read_inputs(model_dir)
    assert inputs.dense_feature_names == [] and inputs.sparse_hotness == HOTNESS
    assert inputs.csv_columns == ["label", "cat_0", "cat_1[0]", "cat_1[1]", "cat_2", "cat_3"]
    dataset = SplitBinaryDataset(trained["paths"]["spec"])
    dense, sparse, labels = dataset.read(ROWS["train"], ROWS["train"] + ROWS["test"])
    ids = np.concatenate(sparse, axis=1).astype(np.int64)
    model, _ = load_checkpoint_model(inputs.checkpoint)
    with torch.no_grad():
        eager = ProbabilityModel(model.model, inputs.sparse_feature_names, inputs.sparse_hotness)(
            torch.as_tensor(dense.astype(np.float32)), torch.as_tensor(ids)
        ).numpy()
    assert eager.std() > 100 * 1e-6  # rows differ by far more than the tolerance below
    predictor = predict.Predictor(model_dir)
    np.testing.assert_allclose(predictor.predict_transformed(dense, ids), eager, rtol=0, atol=1e-6)

    # The quality gate reads the test split (second half of the test mapping) the same way.
    half = ROWS["test"] // 2
    gate = evaluate_variants(model_dir)
    assert gate.rows == half
    assert gate.auroc["fp32"] == pytest.approx(
        float(binary_auroc(torch.as_tensor(eager[half:]), torch.as_tensor(labels[half:].astype(np.int64)))), abs=1e-6
    )

    rows = _csv_rows(trained["paths"]["csv"])
    labelled, unlabelled = tmp_path / "labelled.csv", tmp_path / "unlabelled.csv"
    labelled.write_text("\n".join(rows) + "\n")
    unlabelled.write_text("".join(row.split(",", 1)[1] + "\n" for row in rows))
    for source in (labelled, unlabelled):
        output = tmp_path / f"{source.stem}.txt"
        assert predict.main(["--model", model_dir, "--input", str(source), "--output", str(output)]) == 0
        np.testing.assert_allclose(np.loadtxt(output, dtype=np.float32), eager, rtol=1e-6)  # printed, 7 digits


@pytest.mark.slow
def test_http_endpoint_takes_rows_of_ids(trained, capsys, tmp_path):
    model_dir = trained["runs"]["original"]["model"]
    rows = _csv_rows(trained["paths"]["csv"])[:6]
    body = "".join(row + "\n" for row in rows).encode()
    predictor = predict.Predictor(model_dir, "int8")
    expected = predictor.predict_lines(body)
    with serve.serving_in_background(predictor, max_batch_delay_ms=0) as (base_url, _):
        url = base_url + "/predict"
        with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST")) as r:
            answer = np.array(r.read().decode().split(), dtype=np.float32)
        np.testing.assert_allclose(answer, expected, rtol=1e-6)
        assert len(answer) == 6
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(urllib.request.Request(url, data=body + b"1,2\n", method="POST"))
        assert bad.value.code == 400
        assert (
            json.loads(bad.value.read())["error"]
            == "request line 7: has 2 columns, expected 6 (label, 5 categorical ids) as the first line"
        )
    # A row with a numerical column too many: the predictor names the layout it expects.
    source = tmp_path / "in.csv"
    source.write_text("0.5," + rows[0] + "\n")
    assert predict.main(["--model", model_dir, "--input", str(source)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"python -m serving.predict: error: {source} line 1: has 7 columns, expected 6 (label, 5 categorical ids) "
        "or 5 without the label"
    )
