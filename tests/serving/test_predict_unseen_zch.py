"""A zch model (--id_hashing zch, 2 ranks) served: the export carries each table's admitted
ids and their rows (data/parquet/zch_map.py), predict scores as the trainer's sharded
evaluation did (exported = eager: an id not admitted reads its shard's default row),
counts the ids without a row as unseen (as the trainer's evaluation does), and an id map that is not the model's is refused
in one line."""

import json
import os
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from data.parquet.columns import ParquetColumns
from data.parquet.id_hashing import zch_ids
from data.parquet.zch_map import ZCH_MAP_FILE, ZchIdMap
from data.synthetic_parquet import SyntheticParquetSpec, generate_synthetic_parquet
from harness.launch import eval_record, read_log, run_script
from serving import predict
from serving.inference_model import load_checkpoint_model
from serving.model_files import write_manifest

COLUMNS = ["C1", "C3", "M1"]
ROWS = 400


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A model trained on day 1 by 2 ranks (tables smaller than the ids: evictions), tested on day 3."""
    root = tmp_path_factory.mktemp("zch_serving")
    lake, checkpoints, model_dir = str(root / "lake"), str(root / "checkpoints"), str(root / "model")
    spec = SyntheticParquetSpec(days=3, rows_per_day=2000, files_per_day=1, row_group_rows=1000, multi_hot_columns=1)
    generate_synthetic_parquet(spec, lake)
    train = [
        "dlrm_main.py",
        *("--parquet_path", lake, "--time_column", "date", "--dense_columns", "I*"),
        *("--sparse_columns", ",".join(COLUMNS), "--id_hashing", "zch", "--zch_eviction_interval", "2"),
        *("--num_embeddings", str(ROWS), "--embedding_dim", "8", "--dense_arch_layer_sizes", "16,8"),
        *("--over_arch_layer_sizes", "16,1", "--batch_size", "250", "--device", "cpu", "--learning_rate", "0.05"),
        *("--optimizer", "adagrad", "--checkpoint_dir", checkpoints, "--allow_divergence"),
        *("--log_path", str(root / "log.jsonl")),
    ]
    proc = run_script(train, torchrun_nproc=2, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_script(
        ["-m", "serving.export", "--checkpoint", checkpoints, "--output", model_dir, "--quantize", "none"], timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return lake, checkpoints, model_dir, read_log(str(root / "log.jsonl"))


def _eager_admitted(checkpoints: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{feature: (admitted ids, their rows)} of the checkpoint's modules, loaded in one process."""
    train_model, meta = load_checkpoint_model(os.path.join(checkpoints, f"step_{read_step(checkpoints):09d}"))
    modules = train_model.model.sparse_arch.embedding_bag_collection.collection._managed_collision_collection
    found = {}
    for name in COLUMNS:
        module = modules._managed_collision_modules[f"t_{name}"]
        live = module._mch_sorted_raw_ids != torch.iinfo(torch.int64).max
        found[name] = (module._mch_sorted_raw_ids[live], module._mch_remapped_ids_mapping[live])
    return found


def read_step(checkpoints: str) -> int:
    return max(int(d.removeprefix("step_")) for d in os.listdir(checkpoints) if d.startswith("step_"))


@pytest.mark.slow
@pytest.mark.zch
def test_predict_scores_as_the_sharded_evaluation_and_counts_ids_without_a_row(model, tmp_path):
    lake, checkpoints, model_dir, records = model
    inputs = json.load(open(os.path.join(model_dir, "inputs.json")))
    assert inputs["preprocessing"]["id_hashing"] == "zch"
    facts = inputs["preprocessing"]["zch_ids"]
    assert facts["segments"] == {n: [0, ROWS // 2, ROWS] for n in COLUMNS}  # 2 shards, a default row each
    metrics_file = str(tmp_path / "metrics.json")
    day = f"{lake}/date=2026-11-03"
    argv = ["--model", model_dir, "--input", day, "--output", str(tmp_path / "p.parquet")]
    assert predict.main([*argv, "--metrics_output", metrics_file]) == 0
    metrics = predict.read_predict_metrics(metrics_file)
    # Exported = eager: the trainer's test figures (2 ranks, sharded) on the same rows.
    tested = eval_record(records, "test")
    assert metrics.auroc == pytest.approx(tested["auroc"], abs=1e-5)
    assert metrics.log_loss == pytest.approx(tested["log_loss"], abs=1e-5)
    assert tested["unseen_share_by_feature"] == pytest.approx(metrics.unseen_share_by_feature, abs=1e-12)
    # Unseen: the ids the checkpoint's modules hold no row for, counted with torch here.
    eager = _eager_admitted(checkpoints)
    table = pq.read_table(day, columns=COLUMNS)
    zmap = ZchIdMap.from_bytes(open(os.path.join(model_dir, ZCH_MAP_FILE), "rb").read(), COLUMNS, facts, [ROWS] * 3)
    for f, name in enumerate(COLUMNS):
        keys = ParquetColumns._bags(table.column(name))[0]
        ids = torch.from_numpy(zch_ids(keys, 0))
        admitted, rows = eager[name]
        known = torch.isin(ids, admitted)
        assert metrics.unseen_share_by_feature[name] == pytest.approx(float((~known).double().mean()), abs=1e-12)
        assert 0 < metrics.unseen_ids_by_feature[name] < len(keys)
        # The map's rows are the modules' for admitted ids, a shard's last row for the others.
        mapped = zmap.rows(f, keys)
        place = torch.searchsorted(admitted, ids[known])
        assert np.array_equal(mapped[known.numpy()], rows[place].numpy())
        assert set(mapped[~known.numpy()].tolist()) <= {ROWS // 2 - 1, ROWS - 1}


@pytest.mark.slow
@pytest.mark.zch
def test_an_id_map_that_is_not_the_models_is_refused(model, tmp_path, capsys):
    lake, _, model_dir, _ = model
    other = str(tmp_path / "other")
    shutil.copytree(model_dir, other)
    for name in os.listdir(other):
        os.chmod(os.path.join(other, name), 0o644)
    data = open(os.path.join(other, ZCH_MAP_FILE), "rb").read()
    with open(os.path.join(other, ZCH_MAP_FILE), "wb") as f:
        f.write(data[8:] + data[:8])
    write_manifest(other)
    argv = ["--model", other, "--input", f"{lake}/date=2026-11-03", "--output", str(tmp_path / "p.parquet")]
    assert predict.main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and f"{other}/{ZCH_MAP_FILE}: sha256 " in err[0] and "not the model's" in err[0], err
