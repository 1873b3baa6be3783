"""A vocabulary model (--id_hashing vocabulary) served: the vocabulary travels from the
checkpoint to the model directory, predict scores as the trainer's evaluation did
(exported = eager, new ids on row 0) and counts never-seen ids exactly, --mode test of the
checkpoint maps as training did, and a vocabulary that is not the model's is refused in
one line."""

import glob
import json
import os
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from data.parquet.columns import ParquetColumns
from data.parquet.id_vocabulary import VOCABULARY_FILE, IdVocabulary
from data.synthetic_parquet import SyntheticParquetSpec, generate_synthetic_parquet
from harness.launch import eval_record, read_log, run_script
from serving import predict
from serving.model_files import write_manifest
from tests.serving.test_predict_unseen import COLUMNS, true_unseen_shares


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A model trained on day 1 of a lake with 5% new ids a day (days 2 and 3: validation and test)."""
    root = tmp_path_factory.mktemp("vocabulary")
    lake, checkpoints, model_dir = str(root / "lake"), str(root / "checkpoints"), str(root / "model")
    spec = SyntheticParquetSpec(days=3, rows_per_day=3000, files_per_day=1, row_group_rows=1000, multi_hot_columns=1)
    generate_synthetic_parquet(spec, lake)
    train = [
        "dlrm_main.py",
        *("--parquet_path", lake, "--time_column", "date", "--dense_columns", "I*"),
        *("--sparse_columns", ",".join(COLUMNS), "--id_hashing", "vocabulary", "--min_id_count", "2"),
        *("--embedding_dim", "8", "--dense_arch_layer_sizes", "16,8", "--over_arch_layer_sizes", "16,1"),
        *("--batch_size", "1000", "--device", "cpu", "--learning_rate", "0.05", "--optimizer", "adagrad"),
        *("--checkpoint_dir", checkpoints, "--allow_divergence", "--log_path", str(root / "log.jsonl")),
    ]
    proc = run_script(train, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_script(["-m", "serving.export", "--checkpoint", checkpoints, "--output", model_dir], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return lake, model_dir, read_log(str(root / "log.jsonl")), train


@pytest.mark.slow
def test_predict_scores_as_the_trainer_and_counts_new_ids_exactly(model, tmp_path):
    lake, model_dir, records, _ = model
    inputs = json.load(open(os.path.join(model_dir, "inputs.json")))
    facts = inputs["preprocessing"]["id_vocabulary"]
    assert inputs["num_embeddings_per_feature"] == [facts["kept"][n] + 1 for n in COLUMNS]
    assert not os.path.exists(os.path.join(model_dir, "id_sketch.bin"))  # no filter: the vocabulary is exact
    metrics_file = str(tmp_path / "metrics.json")
    day = f"{lake}/date=2026-11-03"
    argv = ["--model", model_dir, "--input", day, "--output", str(tmp_path / "p.parquet")]
    assert predict.main([*argv, "--metrics_output", metrics_file]) == 0
    metrics = predict.read_predict_metrics(metrics_file)
    truth = true_unseen_shares(lake, "2026-11-03")
    for name in COLUMNS:
        assert metrics.unseen_share_by_feature[name] == pytest.approx(truth[name], abs=1e-12), name
    assert 0.03 < truth["C1"] < 0.3  # new ids of the lake, not noise
    # Exported = eager: the trainer's test figures on the same rows.
    tested = eval_record(records, "test")
    assert metrics.auroc == pytest.approx(tested["auroc"], abs=1e-5)
    assert tested["unseen_share_by_feature"] == pytest.approx(truth, abs=1e-12)
    # New ids read row 0: the rows of day 3 with a never-seen C1 score as with any other OOV id.
    vocabulary = IdVocabulary.from_bytes(open(os.path.join(model_dir, VOCABULARY_FILE), "rb").read(), COLUMNS, facts)
    keys = ParquetColumns._bags(pq.read_table(day, columns=["C1"]).column("C1"))[0]
    assert (
        vocabulary.rows(0, keys)[~np.isin(keys, np.concatenate([vocabulary.kept[0], vocabulary.rare[0]]))] == 0
    ).all()


@pytest.mark.slow
def test_evaluating_the_checkpoint_maps_as_training_did(model):
    _, _, records, train = model
    tested = eval_record(records, "test")
    proc = run_script([*train, "--mode", "test"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--id_hashing vocabulary --min_id_count" not in proc.stdout  # loaded, not counted again
    line = next(line for line in proc.stdout.splitlines() if line.startswith("test: ids the training has not read"))
    shares = tested["unseen_share_by_feature"]
    assert line.endswith(", ".join(f"{name} {shares[name]:.2%}" for name in COLUMNS)), line
    assert f"AUROC {tested['auroc']:.4f}" in proc.stdout


def _copy(model_dir: str, target: str) -> str:
    shutil.copytree(model_dir, target)
    for path in glob.glob(f"{target}/*"):
        os.chmod(path, 0o644)
    return target


@pytest.mark.slow
def test_a_vocabulary_that_is_not_the_models_is_refused(model, tmp_path, capsys):
    lake, model_dir, _, _ = model
    argv = ["--input", f"{lake}/date=2026-11-03", "--output", str(tmp_path / "p.parquet")]
    # Another model's vocabulary (the manifest rewritten to match it): its digest is not the model's.
    other = _copy(model_dir, str(tmp_path / "other"))
    data = open(os.path.join(other, VOCABULARY_FILE), "rb").read()
    with open(os.path.join(other, VOCABULARY_FILE), "wb") as f:
        f.write(data[8:] + data[:8])
    write_manifest(other)
    assert predict.main(["--model", other, *argv]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and f"{other}/{VOCABULARY_FILE}: sha256 " in err[0] and "not the model's" in err[0], err
    # inputs.json that lies about the sizes: the tables are not the vocabulary's.
    lying = _copy(model_dir, str(tmp_path / "lying"))
    inputs = json.load(open(os.path.join(lying, "inputs.json")))
    inputs["preprocessing"]["id_vocabulary"]["kept"]["C3"] += 1
    json.dump(inputs, open(os.path.join(lying, "inputs.json"), "w"))
    write_manifest(lying)
    assert predict.main(["--model", lying, *argv]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "id_vocabulary.kept.C3 is" in err[0] and "table has" in err[0], err


@pytest.mark.slow
def test_resume_takes_the_checkpoints_vocabulary_a_warm_start_grows_it(model, tmp_path):
    from training.flags import build_parser, config_and_source_from_args

    _, model_dir, _, train = model
    facts = json.load(open(os.path.join(model_dir, "inputs.json")))["preprocessing"]["id_vocabulary"]
    exported = IdVocabulary.from_bytes(open(os.path.join(model_dir, VOCABULARY_FILE), "rb").read(), COLUMNS, facts)
    checkpoints = train[train.index("--checkpoint_dir") + 1]
    argv = [a for a in train[1:] if a != checkpoints]
    argv.remove("--checkpoint_dir")
    # Another --min_id_count would count otherwise: a run that loads the checkpoint never counts again.
    argv[argv.index("--min_id_count") + 1] = "1"
    resume = ["--checkpoint_dir", checkpoints, "--resume"]
    config, source = config_and_source_from_args(build_parser("dlrm_main.py", "").parse_args([*argv, *resume]))
    loaded = source.vocabulary()
    assert [k.tolist() for k in loaded.kept] == [k.tolist() for k in exported.kept]
    assert [r.tolist() for r in loaded.rare] == [r.tolist() for r in exported.rare]
    assert config.model.num_embeddings_per_feature == exported.table_sizes
    # A warm start (new data) grows it: on the same split with --min_id_count 1, every
    # rare id is read often enough, and is appended after the kept ones, which keep their rows.
    warm = ["--checkpoint_dir", str(tmp_path / "warm"), "--warm_start", checkpoints]
    config, source = config_and_source_from_args(build_parser("dlrm_main.py", "").parse_args([*argv, *warm]))
    grown = source.vocabulary()
    assert [k.tolist() for k in grown.kept] == [k.tolist() + r.tolist() for k, r in zip(exported.kept, exported.rare)]
    assert all(len(r) == 0 for r in grown.rare)
    assert config.model.num_embeddings_per_feature == grown.table_sizes
