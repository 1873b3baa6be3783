"""New ids counted in a hashed model: the training split's Bloom filter travels from the
checkpoint to the model directory, and predict, --metrics_output and the HTTP endpoint
report the unseen share per feature within 1% of the true one."""

import glob
import json
import os
import urllib.request

import numpy as np
import pyarrow.parquet as pq
import pytest

from data.parquet.columns import ParquetColumns
from data.parquet.id_sketch import SKETCH_FILE
from data.synthetic_parquet import SyntheticParquetSpec, generate_synthetic_parquet
from harness.launch import eval_record, read_log, run_script
from serving import predict, serve

COLUMNS = ["C1", "C3", "C5", "M1"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A model trained on day 1 of a lake with 5% new ids a day (days 2 and 3: validation and test)."""
    root = tmp_path_factory.mktemp("unseen")
    lake, checkpoints, model_dir = str(root / "lake"), str(root / "checkpoints"), str(root / "model")
    spec = SyntheticParquetSpec(days=3, rows_per_day=3000, files_per_day=1, row_group_rows=1000, multi_hot_columns=1)
    generate_synthetic_parquet(spec, lake)
    train = [
        "dlrm_main.py",
        *("--parquet_path", lake, "--time_column", "date", "--dense_columns", "I*"),
        *("--sparse_columns", ",".join(COLUMNS), "--num_embeddings", "2000", "--embedding_dim", "8"),
        *("--dense_arch_layer_sizes", "16,8", "--over_arch_layer_sizes", "16,1", "--batch_size", "1000"),
        *("--device", "cpu", "--learning_rate", "0.05", "--optimizer", "adagrad", "--checkpoint_dir", checkpoints),
        "--allow_divergence",  # 3 steps: the model hardly learns; its ids are what counts here
        *("--log_path", str(root / "log.jsonl")),
    ]
    proc = run_script(train, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_script(["-m", "serving.export", "--checkpoint", checkpoints, "--output", model_dir], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return lake, model_dir, read_log(str(root / "log.jsonl")), train


def true_unseen_shares(lake: str, day: str) -> dict[str, float]:
    """Per column, the share of ``day``'s ids that the first (training) day never held."""
    seen, test = (pq.read_table(glob.glob(f"{lake}/date={d}")[0], columns=COLUMNS) for d in ("2026-11-01", day))
    shares = {}
    for name in COLUMNS:
        trained = ParquetColumns._bags(seen.column(name))[0]
        keys = ParquetColumns._bags(test.column(name))[0]
        shares[name] = float(np.mean(~np.isin(keys, trained)))
    return shares


@pytest.mark.slow
def test_predict_reports_the_unseen_share_within_1_percent(model, tmp_path, capsys):
    lake, model_dir, _, _ = model
    inputs = json.load(open(os.path.join(model_dir, "inputs.json")))
    facts = inputs["preprocessing"]["id_sketch"]
    assert os.path.getsize(os.path.join(model_dir, SKETCH_FILE)) == sum(facts["bits"].values()) // 8
    assert all(rate < 0.01 for rate in facts["false_positive_rate"].values())
    metrics_file = str(tmp_path / "metrics.json")
    day = f"{lake}/date=2026-11-03"
    argv = ["--model", model_dir, "--input", day, "--output", str(tmp_path / "p.parquet")]
    assert predict.main([*argv, "--metrics_output", metrics_file]) == 0
    metrics = predict.read_predict_metrics(metrics_file)
    truth = true_unseen_shares(lake, "2026-11-03")
    assert set(metrics.unseen_share_by_feature) == set(COLUMNS)
    for name in COLUMNS:
        assert metrics.unseen_share_by_feature[name] == pytest.approx(truth[name], abs=0.01), name
    assert 0.03 < truth["C1"] < 0.2  # new ids of the lake, not noise
    assert "unseen share C1 " in capsys.readouterr().err


@pytest.mark.slow
def test_http_endpoint_reports_the_unseen_share_per_request(model):
    lake, model_dir, _, _ = model
    rows = pq.read_table(f"{lake}/date=2026-11-02").slice(0, 300).to_pylist()
    body = "".join(json.dumps({k: v for k, v in row.items() if k != "ts"}, default=str) + "\n" for row in rows)
    predictor = predict.Predictor(model_dir)
    prepared = predictor.read_lines(body.encode(), "request")
    expected = predictor.unseen_shares(prepared.unseen, prepared.id_counts)
    assert expected and int(prepared.unseen.sum()) > 0
    with serve.serving_in_background(predictor) as (url, _):
        request = urllib.request.Request(
            f"{url}/predict", data=body.encode(), headers={"accept": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request) as response:
            answer = json.loads(response.read())
            header = response.headers["x-unseen-share"]
    assert answer["unseen_share_by_feature"] == pytest.approx(expected)
    assert answer["unseen_ids"] == int(prepared.unseen.sum())
    assert dict(item.split("=") for item in header.split(",")).keys() == expected.keys()


@pytest.mark.slow
def test_the_trainers_evaluation_reports_the_unseen_share(model):
    lake, _, records, train = model
    reported = eval_record(records, "test")["unseen_share_by_feature"]
    truth = true_unseen_shares(lake, "2026-11-03")
    assert reported.keys() == truth.keys()
    for name in COLUMNS:
        assert reported[name] == pytest.approx(truth[name], abs=0.01), name
    # --mode test of the checkpoint counts against the filters it saved: the same shares.
    proc = run_script([*train, "--mode", "test"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("test: ids the training has not read"))
    assert line.endswith(", ".join(f"{name} {reported[name]:.2%}" for name in COLUMNS)), line
