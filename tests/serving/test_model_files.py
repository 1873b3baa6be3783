"""The typed files (a checkpoint's meta.json, an export's inputs.json) and the
predictor's input layouts."""

import copy
import dataclasses
import json
import os
import re

import numpy as np
import pytest

from checkpoints.errors import CheckpointError
from checkpoints.meta import CheckpointMeta, WarmStartOrigin, meta_section
from checkpoints.opened import read_meta
from common.json_fields import FileFieldError
from common.manifest import entry_of_bytes
from data.preprocess.criteo_transforms import transform_dense, transform_sparse
from data.sources import source_for
from serving.layouts.base import MalformedLineError
from serving.layouts.criteo_lines import CriteoLines
from serving.layouts.csv_rows import CsvRows
from serving.model_inputs import CriteoPreprocessing, FeatureSpecColumns, ModelInputs, Variant, read_inputs
from training.checkpoint_policy import find_restore_point
from training.config import OptimizerConfig
from training.flags import parse_config

PLAN = {"t_cat_0": {"sharding_type": "table_wise", "compute_kernel": "fused", "shards": [[0, 0, 10, 8, 1]]}}
EARLY_STOPPING = {
    "metric": "auroc",
    "best_step": 4,
    "best_validation": {"auroc": 0.7},
    "validations_without_improvement": 0,
}


def train_config():
    return parse_config(
        [
            "--num_embeddings",
            "10",
            "--embedding_dim",
            "8",
            "--dense_arch_layer_sizes",
            "16,8",
            "--over_arch_layer_sizes",
            "16,1",
            "--batch_size",
            "32",
            "--optimizer",
            "rowwise_adagrad",
        ],
        "dlrm_main.py",
        "",
    )


def version_1_meta(config) -> dict:
    """meta.json as the trainer wrote it before CheckpointMeta (format_version 1): a
    document of its own, which a test may change."""
    return {
        "format_version": 1,
        "step": 12,
        "epoch": 1,
        "batch_in_epoch": 2,
        "global_batch_size": config.data.batch_size * 2,
        "world_size": 2,
        "model": flat_model(config),
        "optim": {**dataclasses.asdict(config.optim), "dense_optimizer": config.optim.resolved_dense_optimizer},
        "config": {**dataclasses.asdict(config), "model": flat_model(config)},
        "plan": copy.deepcopy(PLAN),
        "run_id": "r1",
        "early_stopping": EARLY_STOPPING,
    }


# config.model's interaction fields before meta version 4: every interaction's, flat,
# the defaults of those the run did not use.
FLAT_INTERACTION_DEFAULTS = {
    "dcn_num_layers": 3,
    "dcn_low_rank_dim": 512,
    "interaction_branch1_layer_sizes": [2048, 2048],
    "interaction_branch2_layer_sizes": [2048, 2048],
}


def flat_model(config) -> dict:
    """config.model as meta versions 1 to 3 recorded the model of ``config``."""
    model = dataclasses.asdict(config.model)
    return {
        **{name: value for name, value in model.items() if name != "interaction"},
        **FLAT_INTERACTION_DEFAULTS,
        **model["interaction"],
    }


def write_checkpoint_meta(directory, data: bytes) -> str:
    """A checkpoint directory holding just meta.json and its manifest."""
    os.makedirs(directory)
    open(os.path.join(directory, "meta.json"), "wb").write(data)
    json.dump(
        {"manifest_version": 1, "files": {"meta.json": entry_of_bytes(data)}},
        open(os.path.join(directory, "COMPLETE"), "w"),
    )
    return str(directory)


def current_meta(config) -> CheckpointMeta:
    """What the trainer writes of the run of ``config``."""
    source = source_for(config.data)
    return CheckpointMeta(
        step=12,
        epoch=1,
        batch_in_epoch=2,
        world_size=2,
        config=dataclasses.asdict(config),
        plan=PLAN,
        run_id="r1",
        early_stopping=EARLY_STOPPING,
        data_source=source.name,
        data_features=source.describe(),
        serving_layout=source.serving_layout,
        serving_facts=source.serving_facts(source.open()),
    )


def test_checkpoint_meta_round_trips_and_versions_1_to_3_still_load(tmp_path):
    config = train_config()
    origin = WarmStartOrigin(path="/runs/day_01/step_000000120", step=120, meta_sha256="ab" * 32, run_id="r0")
    meta = dataclasses.replace(current_meta(config), warm_start=origin)
    saved = read_meta(write_checkpoint_meta(tmp_path / "v7", meta.to_json()))
    assert saved == meta
    document = json.loads(meta.to_json())
    assert list(document)[0] == "version" and document["version"] == 7
    assert document["warm_start"] == dataclasses.asdict(origin)
    version_6 = {**{k: v for k, v in document.items() if k != "warm_start"}, "version": 6}
    meta = dataclasses.replace(meta, warm_start=None)  # a run from scratch, and what older versions read as
    assert read_meta(write_checkpoint_meta(tmp_path / "v6", json.dumps(version_6).encode())) == dataclasses.replace(
        meta, version=6
    )
    document = version_6
    assert (document["serving_layout"], document["serving_facts"]) == ("criteo_raw", {})  # random data: no facts
    assert document["calibration"] is None  # without --calibrate
    version_5 = {**{k: v for k, v in document.items() if not k.startswith("serving_")}, "version": 5}
    meta = dataclasses.replace(meta, serving_layout=None, serving_facts=None)  # what older versions read as
    assert read_meta(write_checkpoint_meta(tmp_path / "v5", json.dumps(version_5).encode())) == dataclasses.replace(
        meta, version=5
    )
    document = version_5
    version_4 = {**{k: v for k, v in document.items() if k != "calibration"}, "version": 4}
    assert read_meta(write_checkpoint_meta(tmp_path / "v4old", json.dumps(version_4).encode())) == dataclasses.replace(
        meta, version=4
    )
    assert document["config"]["model"]["interaction"] == {}  # DLRM's dot products have no sizes
    assert not {"model", "optim", "global_batch_size"} & set(document)  # stored once, in config
    assert document["data_source"] == "random"
    assert document["data_features"] == {
        "dense_feature_names": [f"int_{i}" for i in range(13)],
        "sparse_feature_names": [f"cat_{i}" for i in range(26)],
        "cardinalities": None,
        "hotness": None,
        "sequence_columns": [],  # no --sequence_columns
        "max_history": None,
    }

    version_3 = {**document, "version": 3, "config": {**document["config"], "model": flat_model(config)}}
    old = read_meta(write_checkpoint_meta(tmp_path / "v3", json.dumps(version_3, indent=1).encode()))
    assert old == dataclasses.replace(meta, version=3) and old.model == config.model
    version_2 = {key: value for key, value in version_3.items() if key not in ("data_source", "data_features")}
    for version, old_document in ((1, version_1_meta(config)), (2, {**version_2, "version": 2})):
        old = read_meta(write_checkpoint_meta(tmp_path / f"v{version}", json.dumps(old_document, indent=1).encode()))
        assert old == dataclasses.replace(meta, data_source=None, data_features=None, version=version)
        assert (old.source_name, old.features) == (meta.source_name, meta.features)  # derived from the flags
        assert old.model == config.model
        assert meta_section(old.config, "optim", OptimizerConfig, "meta.json") == config.optim
        assert old.global_batch_size == 64 and old.data_path is None


INTERACTION_FLAGS = [
    "--dcn_num_layers",
    "2",
    "--dcn_low_rank_dim",
    "4",
    "--interaction_branch1_layer_sizes",
    "16,16",
    "--interaction_branch2_layer_sizes",
    "16,24",
]


@pytest.mark.parametrize("interaction", ["original", "dcn", "projection"])
def test_version_3_checkpoint_of_each_interaction_resumes_and_evaluates(tmp_path, interaction):
    """A checkpoint written before the interactions had their own configs (its
    config.model flat, every interaction's sizes in it) gives its model to a resume
    (compared with the run's), to --mode test (taken from it) and to export (meta.model)."""
    checkpoint_dir = str(tmp_path / "ckpt")
    argv = [
        "--num_embeddings",
        "10",
        "--embedding_dim",
        "8",
        "--dense_arch_layer_sizes",
        "16,8",
        "--over_arch_layer_sizes",
        "16,1",
        "--interaction_type",
        interaction,
        "--checkpoint_dir",
        checkpoint_dir,
    ]
    config = parse_config(argv + INTERACTION_FLAGS, "dlrm_main.py", "")
    document = json.loads(current_meta(config).to_json())
    document = {**document, "version": 3, "config": {**document["config"], "model": flat_model(config)}}
    path = write_checkpoint_meta(tmp_path / "ckpt" / "step_000000012", json.dumps(document).encode())
    assert read_meta(path).model == config.model

    resumed = find_restore_point(parse_config(argv + INTERACTION_FLAGS + ["--resume"], "dlrm_main.py", ""))
    assert resumed is not None and resumed.path == path and resumed.meta.model == config.model
    tested = parse_config(["--mode", "test", "--checkpoint_dir", checkpoint_dir], "dlrm_main.py", "")
    assert tested.model == config.model
    # Only the run's own interaction sizes are compared: the other interactions' (all
    # recorded before version 4) built nothing, and may differ (before version 4 a
    # resume refused them).
    changed = parse_config(
        argv + INTERACTION_FLAGS + ["--resume", "--dcn_num_layers", "1", "--interaction_branch1_layer_sizes", "8"],
        "dlrm_main.py",
        "",
    )
    if interaction == "original":
        assert find_restore_point(changed).meta.model == config.model
    else:
        differing = {"dcn": "dcn_num_layers is 2", "projection": "interaction_branch1_layer_sizes is [16, 16]"}
        with pytest.raises(
            CheckpointError, match=re.escape(f"does not match this run: interaction.{differing[interaction]}")
        ):
            find_restore_point(changed)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.update(format_version=8), "format_version is 8, newer than this code reads (7)"),
        (
            lambda d: d.update(warm_start={"path": "p", "step": 1, "meta_sha256": "not hex", "run_id": None}),
            'warm_start.meta_sha256 must be a SHA-256 in hex, got "not hex"',
        ),
        (lambda d: d.update(step="12"), 'step must be a count, got "12"'),
        (lambda d: d.pop("plan"), "plan is missing"),
        (lambda d: d["plan"]["t_cat_0"].update(shards=[[0, 0, 10]]), "plan.t_cat_0.shards must be a list of"),
        (
            lambda d: d["config"]["data"].update(batch_size=0),
            "config.data.batch_size must be a positive integer, got 0",
        ),
        (lambda d: d["config"]["model"].update(embeding_dim=8), "config.model does not describe a ModelConfig"),
        (
            lambda d: d["config"]["model"].update(interaction_type="exec"),
            'config.model.interaction_type must be original or dcn or projection, got "exec"',
        ),
        (lambda d: d.update(config=[]), "config must be an object, got []"),
    ],
)
def test_bad_checkpoint_meta_is_one_line_naming_the_file_and_field(tmp_path, change, message):
    document = version_1_meta(train_config())
    change(document)
    path = write_checkpoint_meta(tmp_path / "ckpt", json.dumps(document).encode())
    with pytest.raises(FileFieldError) as error:
        read_meta(path)
    assert str(error.value).startswith(f"{path}/meta.json: {message}"), str(error.value)
    assert "\n" not in str(error.value)


def test_an_optimizer_section_this_code_does_not_know_is_refused_by_training_only(tmp_path):
    """The format reads the model's section; training reads its optimizers' (an export
    needs none), refusing one it does not know before the run builds anything."""
    config = train_config()
    document = json.loads(current_meta(config).to_json())
    document["config"]["optim"]["momentum"] = 0.9
    path = write_checkpoint_meta(tmp_path / "ckpt", json.dumps(document).encode())
    assert read_meta(path).step == 12
    run = dataclasses.replace(config, checkpoint=dataclasses.replace(config.checkpoint, restore_checkpoint_path=path))
    with pytest.raises(FileFieldError) as error:
        find_restore_point(run)
    assert str(error.value).startswith(f"{path}/meta.json: config.optim does not describe a OptimizerConfig ("), str(
        error.value
    )


CRITEO_INPUTS = ModelInputs(
    dense_feature_names=[f"int_{i}" for i in range(13)],
    sparse_feature_names=["cat_0", "cat_1"],
    sparse_hotness=[1, 1],
    num_embeddings_per_feature=[7, 50],
    preprocessing=CriteoPreprocessing(frequency_threshold=0, modulo_num_embeddings_per_feature=[7, 1000]),
    data_path="/data/criteo",
    checkpoint="/ckpt/step_000000012",
    step=12,
    variants={"fp32": Variant("fp32.pt2", "torch.export", 1000), "int8": Variant("int8.pt", "torchscript", 300)},
)
CSV_INPUTS = ModelInputs(
    dense_feature_names=["num_0", "num_1"],
    sparse_feature_names=["cat_0", "cat_1"],
    sparse_hotness=[1, 2],
    num_embeddings_per_feature=[5, 300],
    preprocessing=FeatureSpecColumns(label_name="label", cardinalities=[5, 400]),
    data_path="/data/spec.yaml",
    checkpoint="/ckpt/step_000000012",
    step=12,
    variants={"fp32": Variant("fp32.pt2", "torch.export", 1000)},
)


def version_1_inputs(inputs: ModelInputs) -> dict:
    """inputs.json as export wrote it before ModelInputs (format_version 1)."""
    document = {
        "format_version": 1,
        "num_dense_features": inputs.num_dense_features,
        "sparse_feature_names": inputs.sparse_feature_names,
        "table_names": [f"t_{n}" for n in inputs.sparse_feature_names],
        "num_embeddings_per_feature": inputs.num_embeddings_per_feature,
        "embedding_dim": 8,
        "interaction_type": "original",
        "output": "float32 (B,) click probability",
        "layout": inputs.layout,
        "dense_feature_names": inputs.dense_feature_names,
        "sparse_hotness": inputs.sparse_hotness,
        "inputs": {"dense": "...", "sparse": "..."},
        "data_path": inputs.data_path,
        "checkpoint": inputs.checkpoint,
        "step": inputs.step,
        "variants": {name: dataclasses.asdict(v) for name, v in inputs.variants.items()},
    }
    if isinstance(inputs.preprocessing, FeatureSpecColumns):
        document.update(
            cardinalities=inputs.preprocessing.cardinalities,
            label_name=inputs.preprocessing.label_name,
            csv_columns=inputs.csv_columns,
            preprocessing={"numerical": "...", "categorical": "..."},
        )
    else:
        document["preprocessing"] = {"dense_offset": 3.0, **dataclasses.asdict(inputs.preprocessing)}
    return document


def write_inputs(directory, data: bytes) -> str:
    os.makedirs(directory)
    open(os.path.join(directory, "inputs.json"), "wb").write(data)
    return str(directory)


@pytest.mark.parametrize("inputs", [CRITEO_INPUTS, CSV_INPUTS], ids=["criteo", "feature_spec"])
def test_model_inputs_round_trip_and_version_1_still_loads(tmp_path, inputs):
    assert read_inputs(write_inputs(tmp_path / "v2", inputs.to_json())) == inputs
    old = read_inputs(write_inputs(tmp_path / "v1", json.dumps(version_1_inputs(inputs)).encode()))
    assert old == inputs
    # The oldest exports: Criteo without a layout, hotness or dense names.
    if inputs is CRITEO_INPUTS:
        document = version_1_inputs(inputs)
        for key in ("layout", "sparse_hotness", "dense_feature_names"):
            del document[key]
        assert read_inputs(write_inputs(tmp_path / "v0", json.dumps(document).encode())) == inputs


def test_csv_columns_name_each_id_column():
    assert CSV_INPUTS.csv_columns == ["label", "num_0", "num_1", "cat_0", "cat_1[0]", "cat_1[1]"]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.update(version=5), "version is 5, newer than this code reads (4)"),
        (lambda d: d.update(histories=[{"name": "h", "item": "nope", "max_history": 3}]), "histories[0].item must be"),
        (
            lambda d: d.update(histories=[{"name": "cat_0", "item": "cat_1", "max_history": 3}]),
            "histories[0].name cat_0 is named twice",
        ),
        (lambda d: d.update(histories=[{"name": "h", "item": "cat_1", "max_history": 0}]), "histories[0].max_history"),
        (lambda d: d.update(num_embeddings_per_feature=[7]), "num_embeddings_per_feature must be 2 positive integers"),
        (
            lambda d: d.update(layout="parquet"),
            'layout must be criteo_raw or feature_spec_csv or parquet_columns, got "parquet"',
        ),
        (
            lambda d: d["variants"]["fp32"].update(format="onnx"),
            "variants.fp32.format must be torch.export or torchscript",
        ),
        (lambda d: d["preprocessing"].pop("frequency_threshold"), "preprocessing.frequency_threshold is missing"),
        (lambda d: d.pop("step"), "step is missing"),
    ],
)
def test_bad_model_inputs_are_one_line_naming_the_file_and_field(tmp_path, change, message):
    document = json.loads(CRITEO_INPUTS.to_json())
    change(document)
    model_dir = write_inputs(tmp_path / "model", json.dumps(document).encode())
    with pytest.raises(FileFieldError) as error:
        read_inputs(model_dir)
    assert str(error.value).startswith(f"{model_dir}/inputs.json: {message}"), str(error.value)


def criteo_line(label: bool, ints, hashes) -> bytes:
    fields = ([b"1"] if label else []) + [b"" if v is None else str(v).encode() for v in ints]
    return b"\t".join(fields + [b"" if h is None else b"%x" % h for h in hashes]) + b"\n"


def test_criteo_lines_parse_both_layouts_and_apply_the_preprocessing():
    layout = CriteoLines(
        dataclasses.replace(
            CRITEO_INPUTS,
            sparse_feature_names=[f"cat_{i}" for i in range(26)],
            sparse_hotness=[1] * 26,
            num_embeddings_per_feature=[7] * 26,
            preprocessing=CriteoPreprocessing(),
        )
    )
    ints = [5, None, -3] + list(range(10))
    hashes = [0xDEADBEEF, None] + list(range(1, 25))
    labelled = criteo_line(True, ints, hashes) * 2
    unlabelled = criteo_line(False, ints, hashes) * 2
    assert layout.is_labelled(labelled) and not layout.is_labelled(unlabelled)
    dense, sparse, labels = layout.parse(labelled, "in.tsv", 1, True)
    same = layout.parse(unlabelled, "in.tsv", 1, False)
    assert np.array_equal(dense, same.dense) and np.array_equal(sparse, same.sparse) and same.labels is None
    assert labels.tolist() == [1, 1]
    assert layout.columns(layout.parse(labelled, "in.tsv", 1, True), ["label"]).tolist() == [[1], [1]]
    assert layout.count_unseen(sparse).tolist() == [0] * 26  # no vocabulary: every hash has its id
    assert dense[0].tolist() == [5, 0, -3] + list(range(10)) and sparse[0, :2].tolist() == [0xDEADBEEF, 0]
    dense_in, ids = layout.transform(dense, sparse)
    assert np.array_equal(dense_in, transform_dense(np.asarray(dense, np.int64)))
    assert np.array_equal(ids, transform_sparse(sparse.astype(np.uint32), None, None))
    assert ids[0, 0] == 0xDEADBEEF & 0x7FFF_FFFF

    bad = criteo_line(True, ints, hashes).replace(b"\tdeadbeef\t", b"\tzz\t")
    with pytest.raises(MalformedLineError) as error:
        layout.parse(labelled + bad, "in.tsv", 7, True)
    assert str(error.value) == "in.tsv line 9: categorical feature 0 is not a hexadecimal hash"
    with pytest.raises(MalformedLineError) as error:
        layout.parse(b"1\t2\n", "in.tsv", 1, True)
    assert str(error.value) == (
        "in.tsv line 1: expected 40 tab-separated fields (label, 13 integer, 26 categorical) "
        "or 39 without the label, found 2"
    )


def test_csv_rows_parse_check_ids_and_round_like_the_transcoder():
    layout = CsvRows(CSV_INPUTS)
    rows = b"1,0.1,2.5,4,7,8\n0,3,4,0,399,1\n"
    assert layout.is_labelled(rows) and not layout.is_labelled(b"0.1,2.5,4,7,8\n")
    dense, sparse, labels = layout.parse(rows, "rows.csv", 1, True)
    assert sparse.tolist() == [[4, 7, 8], [0, 399, 1]] and labels.tolist() == [1, 0]
    # Ids at or above the cardinality are unseen (counted per feature), not refused.
    unseen = layout.parse(b"1,0.1,2,5,7,8\n0,3,4,9,400,1\n", "rows.csv", 1, True)
    assert layout.count_unseen(unseen.sparse).tolist() == [2, 1]
    assert layout.columns(unseen, [CSV_INPUTS.csv_columns[-1], "label"]).tolist() == [[8, 1], [1, 0]]
    dense_in, ids = layout.transform(dense, sparse)
    assert dense_in.dtype == np.float32 and dense_in[0, 0] == np.float32(np.float16(0.1)) != np.float32(0.1)
    assert ids.dtype == np.int64 and ids.tolist() == sparse.tolist()
    for line, reason in (
        (b"1,0.1,x,4,7,8\n", "column 3 is not a number: 'x'"),
        (b"1,0.1,2,-5,7,8\n", "feature 'cat_0' has id -5; ids must be integers from 0 to 2^31 - 1"),
        (b"1,0.1,2,4,7.5,8\n", "feature 'cat_1' has id 7.5; ids must be integers from 0 to 2^31 - 1"),
        (b"1,2\n", "has 2 columns, expected 6 (label, 2 numerical, 3 categorical ids) as the first line"),
    ):
        with pytest.raises(MalformedLineError) as error:
            layout.parse(rows + line, "rows.csv", 1, True)
        assert str(error.value) == f"rows.csv line 3: {reason}"
