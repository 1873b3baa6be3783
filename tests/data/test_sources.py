"""The data-source seam (data/sources/), generated over every registered source:
its path flag reaches both entry points and the torchx components, its description
is what the model is built with and what its batches hold, a checkpoint records it
and export describes the model's inputs from it in the source's serving layout. Then
metadata.json's typed reader and writer, and the checkpoint meta's typed description."""

import dataclasses
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable

import pytest

from checkpoints.meta import CheckpointMeta
from common.config_flags import FlagError, option
from common.errors import BadInput
from common.json_fields import FileFieldError, JsonObject
from data.binary.criteo_layout import (
    METADATA_VERSION,
    NUM_SPARSE_FEATURES,
    SPARSE_FEATURE_NAMES,
    CriteoMetadata,
    metadata_file,
    read_metadata,
    write_metadata,
)
from data.binary.feature_spec import FeatureSpec
from data.config import DataConfig
from data.sources import SOURCES, FeatureDescription, source_for
from data.synthetic_criteo import SyntheticCriteoSpec, generate_multi_hot_criteo, generate_synthetic_criteo
from data.synthetic_csv import csv_feature_spec, generate_csv
from data.synthetic_parquet import SyntheticParquetSpec, generate_synthetic_parquet
from data.transcode import transcode
from harness.launch import REPO, read_log, step_losses
from serving.export import describe_inputs
from serving.layouts import LAYOUTS
from sharding_plans.feature_spec import read_feature_spec
from torchx_components.launch import DATA_DIR_FLAG, DATA_PATH_FLAGS, gives_data_path
from torchx_components.training import dcnv2, dlrm
from training.flags import ENTRY_POINT_RECIPES, entry_point_parser, parse_config

TINY = SyntheticCriteoSpec(
    num_days=2, rows_per_day=64, cardinalities=[3 + f for f in range(NUM_SPARSE_FEATURES)], seed=3
)
MULTI_HOT_SIZES = [1 + f % 3 for f in range(NUM_SPARSE_FEATURES)]
SMALL_MODEL = [
    "--embedding_dim",
    "8",
    "--dense_arch_layer_sizes",
    "16,8",
    "--over_arch_layer_sizes",
    "8,1",
    "--batch_size",
    "16",
]


def _criteo_days(directory: str) -> str:
    generate_synthetic_criteo(TINY, directory, show_progress=False)
    return directory


def _multi_hot_days(directory: str) -> str:
    generate_multi_hot_criteo(TINY, directory, MULTI_HOT_SIZES)
    return directory


def _feature_spec(directory: str) -> str:
    csv_dir, out_dir = os.path.join(directory, "csv"), os.path.join(directory, "bin")
    raw = csv_feature_spec(2, 3, cardinality="auto", hotness={1: 2})
    generate_csv(
        FeatureSpec.from_dict(raw, csv_dir, os.path.join(csv_dir, "feature_spec.yaml"), allow_auto=True),
        csv_dir,
        {"train": 64, "test": 40},
        auto_cardinality=20,
    )
    transcode(csv_dir, "feature_spec.yaml", out_dir)
    return os.path.join(out_dir, "feature_spec.yaml")


def _parquet_log(directory: str) -> str:
    generate_synthetic_parquet(
        SyntheticParquetSpec(
            days=2, rows_per_day=64, files_per_day=1, row_group_rows=32, multi_hot_columns=2, max_bag_size=3, seed=3
        ),
        directory,
    )
    return directory


@dataclasses.dataclass(frozen=True)
class TinyDataSet:
    """A tiny data set of a source: ``write`` writes one under a directory and returns
    its path flag's value (None: the source takes no path); ``flags``: the other data
    flags the source needs to read it."""

    write: Callable[[str], str | None]
    flags: tuple[str, ...] = ()


# {source name: its tiny data set}, of every registered source.
TINY_DATA_SETS: dict[str, TinyDataSet] = {
    "random": TinyDataSet(lambda directory: None),
    "criteo_binary": TinyDataSet(_criteo_days),
    "criteo_multi_hot": TinyDataSet(_multi_hot_days),
    "split_binary": TinyDataSet(_feature_spec),
    "parquet": TinyDataSet(_parquet_log, ("--dense_columns", "I*", "--sparse_columns", "C*,M*")),
}
PATH_SOURCES = [name for name, source in SOURCES.items() if source.path_field]


def test_every_registered_source_is_covered_here():
    assert set(TINY_DATA_SETS) == set(SOURCES), (
        "a data source without a tiny data set in tests/data/test_sources.py TINY_DATA_SETS: add one"
    )


@pytest.mark.parametrize("name", PATH_SOURCES)
def test_path_flag_reaches_both_entry_points_and_the_components(name):
    field = SOURCES[name].path_field
    flag = option(DataConfig, field)
    for script in ENTRY_POINT_RECIPES:
        assert getattr(entry_point_parser(script).parse_args([flag, "/data/x"]), field) == "/data/x"
    assert flag in DATA_PATH_FLAGS and gives_data_path([f"{flag}=/data/x"])
    for component in (dlrm, dcnv2):  # --data_dir adds the Criteo directory's flag only without a data path
        (role,) = component(flag, "/data/x", data_dir="/criteo").roles
        assert " ".join(role.args).count(DATA_DIR_FLAG) == (flag == DATA_DIR_FLAG)


def test_one_data_path_at_most():
    with pytest.raises(FlagError, match=r"^give one data path, not --\w+ and --\w+$"):
        DataConfig.from_flags(**{field: "/x" for field in (SOURCES[name].path_field for name in PATH_SOURCES[:2])})


@pytest.mark.parametrize("name", list(SOURCES))
def test_description_is_what_the_model_is_built_with_and_the_batches_hold(name, tmp_path):
    data_set = TINY_DATA_SETS[name]
    path = data_set.write(str(tmp_path))
    field = SOURCES[name].path_field
    path_flags = [option(DataConfig, field), path] if field else []
    config = parse_config([*path_flags, *data_set.flags, *SMALL_MODEL], "dlrm_main.py", "")
    source = source_for(config.data)
    features = source.describe()
    assert source.name == name and source.path == path
    assert config.model.sparse_feature_names == list(features.sparse_feature_names)
    assert config.model.dense_in_features == features.num_dense_features == len(features.dense_feature_names)
    if features.cardinalities is not None:  # the data's sizes, given no table-size flags
        assert config.model.num_embeddings_per_feature == list(features.cardinalities)
    sizes = config.model.num_embeddings_per_feature
    batch = next(iter(source.loaders(source.open(), sizes, rank=0, world_size=1)["train"]))
    assert batch.dense_features.shape == (16, features.num_dense_features)
    assert batch.sparse_features.keys() == list(features.sparse_feature_names)
    for f, ids in enumerate(batch.sparse_features.to_dict().values()):
        lengths = ids.lengths().tolist()
        if features.hotness is not None:
            assert lengths == [features.hotness[f]] * 16
        assert int(ids.values().min()) >= 0 and int(ids.values().max()) < sizes[f]
    assert SOURCES[name].serving_layout in LAYOUTS

    # A checkpoint records the description; export describes the inputs from it.
    meta = CheckpointMeta(
        step=3,
        epoch=0,
        batch_in_epoch=3,
        world_size=1,
        config=dataclasses.asdict(config),
        plan={},
        data_source=source.name,
        data_features=features,
    )
    meta = CheckpointMeta.from_json(meta.to_json(), "meta.json")
    assert (meta.source_name, meta.features, meta.data_path) == (name, features, path)
    inputs = describe_inputs(config.model, meta, "ckpt")
    assert inputs.layout == SOURCES[name].serving_layout
    assert (inputs.dense_feature_names, inputs.sparse_feature_names) == (
        list(features.dense_feature_names),
        list(features.sparse_feature_names),
    )
    assert inputs.num_embeddings_per_feature == sizes


def test_export_reads_the_recorded_description_not_the_spec_again(tmp_path):
    """A feature-spec model's hotness and cardinalities are the checkpoint's: a spec
    changed since (here its cardinalities) does not change the export's inputs."""
    spec_path = _feature_spec(str(tmp_path))
    config = parse_config(["--dataset_path", spec_path, *SMALL_MODEL], "dlrm_main.py", "")
    source = source_for(config.data)
    recorded = source.describe()
    meta = CheckpointMeta(
        step=3,
        epoch=0,
        batch_in_epoch=3,
        world_size=1,
        config=dataclasses.asdict(config),
        plan={},
        data_source=source.name,
        data_features=recorded,
    )
    spec = FeatureSpec.load(spec_path)
    for name in spec.categorical:
        spec.feature_spec[name]["cardinality"] += 5
    spec.write(spec_path)
    assert source.describe().cardinalities != recorded.cardinalities
    inputs = describe_inputs(config.model, meta, "ckpt")
    assert inputs.preprocessing.cardinalities == list(recorded.cardinalities)  # type: ignore[union-attr]
    assert inputs.sparse_hotness == list(recorded.hotness)  # type: ignore[arg-type]
    old = dataclasses.replace(meta, data_source=None, data_features=None, version=2)  # derives it again
    assert old.features == source.describe()


# metadata.json


def _version_1_document() -> dict:
    """metadata.json as the generator wrote it before CriteoMetadata (format_version 1)."""
    return {
        "format": "criteo_binary",
        "format_version": 1,
        "num_days": 2,
        "rows_per_day": [5, 6],
        "num_dense_features": 13,
        "num_sparse_features": 26,
        "num_embeddings_per_feature": [7] * 26,
        "positive_rate": 0.25,
        "generator": {"seed": 1},
    }


def test_metadata_round_trips_and_older_files_read(tmp_path):
    metadata = CriteoMetadata(
        num_days=2,
        rows_per_day=[5, 6],
        num_embeddings_per_feature=[7] * 26,
        positive_rate=0.25,
        generator={"seed": 1},
        multi_hot_sizes=MULTI_HOT_SIZES,
        multi_hot_distribution_type="pareto",
    )
    write_metadata(str(tmp_path), metadata)
    assert read_metadata(str(tmp_path)) == metadata
    document = json.load(open(metadata_file(str(tmp_path))))
    assert list(document)[:2] == ["version", "format"] and document["version"] == METADATA_VERSION == 2
    old = dataclasses.replace(metadata, multi_hot_sizes=None, multi_hot_distribution_type=None)
    assert CriteoMetadata.from_json(json.dumps(_version_1_document()).encode(), "m.json") == old
    # Hand-written, without a version: every field optional.
    unversioned = CriteoMetadata.from_json(json.dumps({"num_embeddings_per_feature": [9] * 26}).encode(), "m.json")
    assert unversioned == CriteoMetadata(num_embeddings_per_feature=[9] * 26)
    assert read_metadata(str(tmp_path / "none")) is None


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.update(format_version=3), "format_version is 3, newer than this code reads (2)"),
        (lambda d: d.update(format="parquet"), 'format must be criteo_binary, got "parquet"'),
        (lambda d: d.pop("num_days"), "num_days is missing"),
        (lambda d: d.update(num_days="2"), 'num_days must be a positive integer, got "2"'),
        (lambda d: d.update(num_days=3), "rows_per_day lists 2 days but num_days is 3"),
        (lambda d: d.update(rows_per_day=[5, -1]), "rows_per_day must be a list of integers, got [5, -1]"),
        (
            lambda d: d.update(num_embeddings_per_feature=[7] * 25),
            "num_embeddings_per_feature must be 26 positive integers",
        ),
        (lambda d: d.update(num_sparse_features=27), "num_sparse_features must be 26 (the Criteo layout's), got 27"),
        (lambda d: d.update(frequency_threshold=None), "frequency_threshold must be a count, got null"),
        (lambda d: d.update(bad_lines={"day_0": -1}), "bad_lines must be an object of counts or null"),
        (lambda d: d.update(multi_hot_sizes=[0] * 26), "multi_hot_sizes must be 26 positive integers or null"),
        (
            lambda d: d.clear() or d.update(num_embeddings_per_feature=[0] * 26),
            "num_embeddings_per_feature must be 26 positive integers or null",
        ),
    ],
)
def test_bad_metadata_is_one_line_naming_the_file_and_field(tmp_path, change, message):
    document = _version_1_document()
    change(document)
    with open(metadata_file(str(tmp_path)), "w") as f:
        json.dump(document, f)
    with pytest.raises(FileFieldError) as error:
        read_metadata(str(tmp_path))
    assert str(error.value).startswith(f"{metadata_file(str(tmp_path))}: {message}"), str(error.value)
    assert "\n" not in str(error.value)


def test_training_and_the_planner_refuse_a_lying_metadata(tmp_path, capsys):
    directory = _criteo_days(str(tmp_path / "d"))
    path = metadata_file(directory)
    document = json.load(open(path))
    document["rows_per_day"] = [64]
    json.dump(document, open(path, "w"))
    with pytest.raises(SystemExit) as exit_code:
        parse_config(["--in_memory_binary_criteo_path", directory, *SMALL_MODEL], "dlrm_main.py", "")
    assert exit_code.value.code == 2
    assert capsys.readouterr().err == (
        f"dlrm_main.py: error: --in_memory_binary_criteo_path: {path}: rows_per_day lists 1 days but num_days is 2\n"
    )
    with pytest.raises(FileFieldError, match=r"rows_per_day lists 1 days but num_days is 2$"):
        read_feature_spec(path)


def test_multi_hot_files_must_hold_the_bags_metadata_records(tmp_path):
    """describe() takes the hotness from metadata.json: opening the files checks it."""
    directory = _multi_hot_days(str(tmp_path))
    metadata = read_metadata(directory)
    lying = [2] * NUM_SPARSE_FEATURES
    write_metadata(directory, dataclasses.replace(metadata, multi_hot_sizes=lying))
    source = source_for(DataConfig.from_flags(synthetic_multi_hot_criteo_path=directory))
    assert source.describe().hotness == tuple(lying)
    with pytest.raises(BadInput) as error:
        source.open()
    assert str(error.value) == (
        f"{directory}/day_0_sparse_multi_hot.npz: bags of {MULTI_HOT_SIZES} ids, but "
        f"metadata.json says multi_hot_sizes {lying}"
    )


def test_the_planner_reads_a_generated_metadata_through_its_reader(tmp_path):
    directory = _criteo_days(str(tmp_path))
    assert read_feature_spec(metadata_file(directory)) == (SPARSE_FEATURE_NAMES, TINY.cardinalities)


# The checkpoint meta's description


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.update(data_source="csv"), "data_source must be random or criteo_binary or"),
        (lambda d: d.pop("data_features"), "data_features is missing"),
        (
            lambda d: d["data_features"].update(hotness=[1, 2]),
            "data_features.hotness must be 26 positive integers or null",
        ),
        (
            lambda d: d["data_features"].update(sparse_feature_names=["a"] * 26),
            "data_features.sparse_feature_names has a name twice",
        ),
        (
            lambda d: d["config"]["data"]["source_options"].update(dataset_path=7),
            "config.data.source_options.dataset_path must be a string or null, got 7",
        ),
        (
            lambda d: d["config"]["data"]["source_options"].update(
                dataset_path="/s.yaml", in_memory_binary_criteo_path="/d"
            ),
            "config.data: give one data path, not --in_memory_binary_criteo_path and --dataset_path",
        ),
    ],
)
def test_bad_data_description_in_checkpoint_meta_is_one_line(change, message):
    config = parse_config(SMALL_MODEL, "dlrm_main.py", "")
    source = source_for(config.data)
    meta = CheckpointMeta(
        step=1,
        epoch=0,
        batch_in_epoch=1,
        world_size=1,
        config=dataclasses.asdict(config),
        plan={},
        data_source=source.name,
        data_features=source.describe(),
    )
    document = json.loads(meta.to_json())
    change(document)
    with pytest.raises(FileFieldError) as error:
        CheckpointMeta.from_json(json.dumps(document).encode(), "ckpt/meta.json")
    assert str(error.value).startswith(f"ckpt/meta.json: {message}"), str(error.value)


def test_feature_description_json_round_trip():
    for description in (FeatureDescription(("a", "b"), ("u", "i"), (10, 20), (1, 3)), FeatureDescription((), ("u",))):
        document = json.loads(json.dumps({"features": dataclasses.asdict(description)}))
        assert FeatureDescription.read(JsonObject(document, "f.json").object("features")) == description


# A new source is one file in data/sources/: this one, written into a directory
# data/sources/ of its own on the path (the registry adds such directories' modules).
PLUGIN_SOURCE = """
import json
from dataclasses import dataclass
from typing import Any, Optional

from common.config_flags import FlagError, flag, option
from data.sources.types import BatchLoader, DataSource, FeatureDescription


@dataclass
class ToyOptions:
    toy_path: Optional[str] = flag(None, help="toy: a JSON file naming the dense and sparse features")
    toy_batches: int = flag(2, help="toy: training batches per epoch")


class ToySource(DataSource):
    name = "toy"
    options = ToyOptions
    path_field = "toy_path"
    serving_layout = "criteo_raw"

    def check_flags(self) -> None:
        if self.config.toy_batches < 1:
            raise FlagError(f"{option(self.config, 'toy_batches')} must be at least 1")
        super().check_flags()

    def describe(self) -> FeatureDescription:
        with open(str(self.path)) as f:
            names = json.load(f)
        return FeatureDescription(tuple(names["dense"]), tuple(names["sparse"]))

    def open(self, check_values: bool = True) -> Any:
        return self.describe()

    def loaders(self, dataset: Any, num_embeddings_per_feature: list[int], rank: int,
                world_size: int) -> dict[str, BatchLoader]:
        from data.synthetic.random_data import RandomCriteoLoader
        batches = {"train": self.config.toy_batches, "validation": 1, "test": 1}
        return {split: RandomCriteoLoader(n, self.config.batch_size, rank, world_size, num_embeddings_per_feature,
                                          list(dataset.sparse_feature_names), dataset.num_dense_features,
                                          self.config.seed, stream)
                for stream, (split, n) in enumerate(batches.items())}
"""


def _with_plugin(tmp_path) -> tuple[dict[str, str], str]:
    """(the environment whose path holds a data/sources/toy.py, the toy's JSON file)."""
    plugin = tmp_path / "plugins" / "data" / "sources"
    plugin.mkdir(parents=True)
    (plugin / "toy.py").write_text(PLUGIN_SOURCE)
    names = tmp_path / "toy.json"
    names.write_text(json.dumps({"dense": ["age", "price"], "sparse": ["user", "item", "shop"]}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, str(tmp_path / "plugins")])}
    return env, str(names)


@pytest.mark.slow
def test_a_source_in_one_file_is_picked_up_by_the_flags_and_trains(tmp_path):
    env, names = _with_plugin(tmp_path)
    log_path = str(tmp_path / "run.jsonl")

    def run(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "dlrm_main.py", *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
        )

    assert "--toy_batches" in run("--help").stdout
    trained = run(
        "--toy_path",
        names,
        "--toy_batches",
        "3",
        *SMALL_MODEL,
        "--num_embeddings",
        "50",
        "--log_path",
        log_path,
        "--log_every_n_steps",
        "1",
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    records = read_log(log_path)
    config = next(r for r in records if r["event"] == "config")
    assert config["model"]["sparse_feature_names"] == ["user", "item", "shop"]
    assert config["model"]["dense_in_features"] == 2
    assert config["data"]["source_options"] == {"toy_path": names, "toy_batches": 3}
    assert len(step_losses(records)) == 3
    # Its flags are its own: given with other data, refused by the structure.
    refused = run("--toy_batches", "3", *SMALL_MODEL)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].endswith("--toy_batches is for toy data: it needs --toy_path")
    refused = run("--toy_path", names, "--parquet_path", str(tmp_path), *SMALL_MODEL)
    assert (refused.returncode, refused.stderr.strip().splitlines()[-1][-50:]) == (
        2,
        "give one data path, not --parquet_path and --toy_path"[-50:],
    )


def test_validate_gives_one_source_until_a_flag_changes(tmp_path):
    config = DataConfig.from_flags(dataset_path=_feature_spec(str(tmp_path)), batch_size=16)
    source = config.validate()
    assert config.validate() is source and source.config is config and source.name == "split_binary"
    config.batch_size = 8  # another config now: checked again, another source
    assert config.validate() is not source
    copied = pickle.loads(pickle.dumps(config))  # the checked source is not pickled with it
    assert copied == config and "_checked" not in vars(copied)


def test_a_source_flag_set_in_code_reads_through_its_options(tmp_path):
    config = DataConfig.from_flags(parquet_path=str(tmp_path), sparse_columns="C*", hash_seed=7)
    assert (config.hash_seed, config.source_options.hash_seed, config.in_memory_binary_criteo_path) == (7, 7, None)
    assert DataConfig().rolling_windows is None  # another source's flag: its default
    with pytest.raises(AttributeError, match="no attribute 'hash_sed'"):
        config.hash_sed
    with pytest.raises(TypeError, match="no flag field 'hash_sed'"):
        DataConfig.from_flags(hash_sed=7)
