"""--num_embeddings auto: sized from the training split before the model is built, the
prediction against the collision share the run then logs, resume and evaluation taking
the checkpoint's sizes, bad input one line exit 2."""

import json
import os

import pytest

import dlrm_main
from data.profile import profile_lake, suggest_sizes, write_profile
from data.synthetic_parquet import SyntheticParquetSpec, generate_synthetic_parquet
from harness.launch import read_log, run_script
from training.flags import parse_config

COLUMNS = "C1,C3,C5"
TINY = [
    "--embedding_dim",
    "8",
    "--dense_arch_layer_sizes",
    "16,8",
    "--over_arch_layer_sizes",
    "16,1",
    "--batch_size",
    "500",
    "--device",
    "cpu",
    "--time_column",
    "date",
    "--dense_columns",
    "I*",
    "--sparse_columns",
    COLUMNS,
    "--learning_rate",
    "0.05",
    "--optimizer",
    "adagrad",
]


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("sizing") / "lake")
    spec = SyntheticParquetSpec(days=3, rows_per_day=3000, files_per_day=1, row_group_rows=1000, multi_hot_columns=0)
    generate_synthetic_parquet(spec, root)
    return root


def run_main(capsys, argv):
    try:
        code = dlrm_main.main(argv)
    except SystemExit as e:
        code = e.code
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_auto_sizes_from_the_training_split_only(lake, capsys):
    config = parse_config(
        ["--parquet_path", lake, *TINY, "--num_embeddings", "auto", "--memory_gb", "0.001"], "dlrm_main.py", ""
    )
    # The training split is the first day (the next two: validation and test).
    train_day = profile_lake(f"{lake}/date=2026-11-01", COLUMNS, None, 0.01, None, 8, "fp32")
    expected = suggest_sizes(train_day.distinct(), 0.01, 2**30 // 1000, 8 * 4)
    assert config.model.num_embeddings_per_feature == expected.rows
    assert config.table_sizing.distinct_ids == train_day.distinct()
    assert config.table_sizing.expected_collision_shares == expected.shares
    assert "--num_embeddings auto: --num_embeddings_per_feature " in capsys.readouterr().out


def test_auto_sizes_from_a_profile_file(lake, tmp_path):
    path = str(tmp_path / "p.json")
    profile = profile_lake(lake, COLUMNS, "date", 0.3, None, 64, "fp32")
    write_profile(profile, path)
    config = parse_config(
        ["--parquet_path", lake, *TINY, "--num_embeddings", "auto", "--table_profile", path], "dlrm_main.py", ""
    )
    # The distinct ids of the file, sized for this run's target (the default 0.01).
    assert config.model.num_embeddings_per_feature == suggest_sizes(profile.distinct(), 0.01, None, 32).rows


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num_embeddings_per_feature", "5,5,5"], "give --num_embeddings auto or --num_embeddings_per_feature"),
        (["--id_hashing", "modulo", "--sparse_columns", "C2"], "it needs --id_hashing hash"),
        (["--target_collision_share", "0"], "--target_collision_share must be between 0 and 1, got 0"),
        (["--table_profile", "/nonexistent.json"], "--table_profile /nonexistent.json: cannot read it"),
    ],
)
def test_bad_auto_flags_are_one_line_exit_2(lake, capsys, argv, message):
    code, err = run_main(capsys, ["--parquet_path", lake, *TINY, "--num_embeddings", "auto", *argv])
    assert code == 2 and len(err) == 1 and message in err[0], err


def test_sizing_flags_without_auto_and_auto_without_parquet(lake, capsys):
    code, err = run_main(capsys, ["--parquet_path", lake, *TINY, "--memory_gb", "2"])
    assert code == 2 and len(err) == 1 and "--memory_gb sizes the tables of --num_embeddings auto" in err[0], err
    code, err = run_main(capsys, ["--num_embeddings", "auto", "--device", "cpu"])
    assert code == 2 and len(err) == 1 and "auto sizes the tables from Parquet training data" in err[0], err
    code, err = run_main(capsys, ["--num_embeddings", "many"])
    assert code == 2 and len(err) == 1 and "expected an integer or auto, got 'many'" in err[0], err


def test_a_profile_that_lies_about_its_columns(lake, tmp_path, capsys):
    path = str(tmp_path / "p.json")
    write_profile(profile_lake(lake, "C1,C3,C7", "date", 0.01, None, 8, "fp32"), path)
    code, err = run_main(capsys, ["--parquet_path", lake, *TINY, "--num_embeddings", "auto", "--table_profile", path])
    assert code == 2 and len(err) == 1, err
    assert f"--table_profile {path}: profiles columns C1,C3,C7, but --sparse_columns gives C1,C3,C5" in err[0]
    document = json.load(open(path))
    document["columns"] = "C1"
    json.dump(document, open(path, "w"))
    code, err = run_main(capsys, ["--parquet_path", lake, *TINY, "--num_embeddings", "auto", "--table_profile", path])
    assert code == 2 and len(err) == 1 and f"{path}: columns must be a non-empty list of columns" in err[0], err


@pytest.fixture(scope="module")
def auto_run(lake, tmp_path_factory):
    """One epoch over the training split at the sizes auto gives for a 25% collision share."""
    root = tmp_path_factory.mktemp("auto_run")
    log, checkpoints = str(root / "log.jsonl"), str(root / "checkpoints")
    argv = ["dlrm_main.py", "--parquet_path", lake, *TINY, "--num_embeddings", "auto", "--target_collision_share"]
    more = ["--log_path", log, "--checkpoint_dir", checkpoints, "--allow_divergence"]  # 6 steps: sizes, not skill
    proc = run_script([*argv, "0.25", *more], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    step = sorted(os.listdir(checkpoints))[-1]
    with open(os.path.join(checkpoints, step, "meta.json")) as f:
        meta = json.load(f)
    return read_log(log), meta, checkpoints, proc


@pytest.mark.slow
def test_predicted_collision_share_within_20_percent_of_the_logged_one(auto_run):
    records, meta, _, proc = auto_run
    sizing = meta["config"]["table_sizing"]
    assert meta["config"]["tables"]["num_embeddings"] == "auto"
    assert meta["config"]["model"]["num_embeddings_per_feature"] == [
        int(n) for n in proc.stdout.split("--num_embeddings_per_feature ")[1].split()[0].split(",")
    ]
    logged = [r for r in records if r["event"] == "data_statistics"][-1]["id_collisions"]
    for name, predicted, distinct in zip(
        COLUMNS.split(","), sizing["expected_collision_shares"], sizing["distinct_ids"]
    ):
        assert logged[name]["distinct"] == distinct  # the same ids: the whole training split was read
        assert logged[name]["colliding_fraction"] == pytest.approx(predicted, rel=0.2), (name, logged[name])


@pytest.mark.slow
def test_resume_and_evaluation_take_the_checkpoints_sizes(auto_run, lake):
    _, meta, checkpoints, _ = auto_run
    trained = meta["config"]["model"]["num_embeddings_per_feature"]
    common = ["--parquet_path", lake, *TINY, "--num_embeddings", "auto", "--checkpoint_dir", checkpoints]
    # Another target would size otherwise: a run that loads the checkpoint never sizes again.
    for extra in (["--resume", "--target_collision_share", "0.01"], ["--mode", "test"]):
        config = parse_config([*common, *extra], "dlrm_main.py", "")
        assert config.model.num_embeddings_per_feature == trained
        assert config.table_sizing.distinct_ids == meta["config"]["table_sizing"]["distinct_ids"]
