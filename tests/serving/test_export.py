"""serving.export of a checkpoint that stands alone: one trained from Parquet exports,
predicts and serves the same scores after its training table has moved (meta.json
records what serving needs); a checkpoint older than that record exports only where its
data is readable, else says in one line what to pass."""

import dataclasses
import json
import os
import shutil
import urllib.request

import pyarrow.parquet as pq
import pytest

from checkpoints.meta import META_VERSION, CheckpointMeta
from common.config_flags import option
from common.errors import BadInput
from common.manifest import entry_of_bytes
from data.config import DataConfig
from data.sources import SOURCES, source_for
from harness.launch import run_script
from serving import export, predict, serve
from serving.export import describe_inputs
from tests.data.test_parquet_source_training import TINY, write_click_log
from tests.data.test_sources import SMALL_MODEL, TINY_DATA_SETS
from training.flags import parse_config


@pytest.mark.parametrize("name", [name for name, source in SOURCES.items() if source.path_field])
def test_every_source_records_what_export_describes_its_inputs_from(tmp_path, name):
    """What the trainer records (its source's serving layout and facts) describes the
    model's inputs once the data has gone, as the data itself did; without the record,
    the data is read again, and where it has gone (a table, a spec) one line says what
    to pass."""
    data_set, field = TINY_DATA_SETS[name], SOURCES[name].path_field
    path = data_set.write(str(tmp_path / "data"))
    config = parse_config([option(DataConfig, field), path, *data_set.flags, *SMALL_MODEL], "dlrm_main.py", "")
    source = source_for(config.data)
    meta = CheckpointMeta(
        step=3,
        epoch=0,
        batch_in_epoch=3,
        world_size=1,
        config=dataclasses.asdict(config),
        plan={},
        data_source=source.name,
        data_features=source.describe(),
        serving_layout=source.serving_layout,
        serving_facts=source.serving_facts(source.open()),
    )
    meta = CheckpointMeta.from_json(meta.to_json(), "ckpt/meta.json")
    old = dataclasses.replace(meta, serving_layout=None, serving_facts=None, version=5)
    expected = describe_inputs(config.model, old, "ckpt")  # from the data, there
    shutil.move(str(tmp_path / "data"), str(tmp_path / "moved"))
    assert describe_inputs(config.model, meta, "ckpt") == expected
    if name in ("parquet", "split_binary"):
        with pytest.raises(
            BadInput,
            match=r"ckpt/meta.json \(version 5\) predates the record of what serving "
            r"needs, so export reads the training data: pass --training_data with "
            r"where that data is now$",
        ):
            describe_inputs(config.model, old, "ckpt")
    moved = path.replace(str(tmp_path / "data"), str(tmp_path / "moved"))
    again = describe_inputs(config.model, old, "ckpt", training_data=moved)
    assert dataclasses.replace(again, data_path=expected.data_path) == expected


def _checkpoint(ckpt_dir: str) -> str:
    steps = sorted(name for name in os.listdir(ckpt_dir) if name.startswith("step_"))
    return os.path.join(ckpt_dir, steps[-1])


def _scores(model: str, rows: str, output: str) -> list[float]:
    assert predict.main(["--model", model, "--input", rows, "--output", output]) == 0
    return pq.read_table(output).column("probability").to_pylist()


@pytest.fixture(scope="module")
def trained_on_parquet(tmp_path_factory) -> dict:
    """A Parquet table, a checkpoint trained on it (one rank) and its export and scores
    of one day, all made while the table is where training read it."""
    root = tmp_path_factory.mktemp("standalone")
    table, ckpt_dir = str(root / "clicks"), str(root / "ckpt")
    write_click_log(table)
    rows = str(root / "rows")  # the rows scored, outside the table
    shutil.copytree(os.path.join(table, "date=2026-11-04"), rows)
    proc = run_script(
        [
            "dlrm_main.py",
            "--parquet_path",
            table,
            *TINY,
            "--log_path",
            str(root / "log.jsonl"),
            "--checkpoint_dir",
            ckpt_dir,
            "--checkpoint_at_epoch_end",
        ],
        torchrun_nproc=1,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    checkpoint = _checkpoint(ckpt_dir)
    assert export.main(["--checkpoint", checkpoint, "--output", str(root / "before"), "--quantize", "none"]) == 0
    return {
        "root": root,
        "table": table,
        "checkpoint": checkpoint,
        "rows": rows,
        "scores": _scores(str(root / "before"), rows, str(root / "before.parquet")),
    }


@pytest.mark.slow
def test_a_checkpoint_exports_predicts_and_serves_after_its_table_moved(trained_on_parquet, tmp_path):
    root, checkpoint = trained_on_parquet["root"], trained_on_parquet["checkpoint"]
    meta = json.loads(open(os.path.join(checkpoint, "meta.json")).read())
    assert meta["version"] == META_VERSION and meta["serving_layout"] == "parquet_columns"
    facts = dict(meta["serving_facts"])
    assert set(facts.pop("id_sketch")["ids"]) == {"C1", "C2", "M1"}  # the training split's seen ids
    assert facts == {
        "label_name": "label",
        "sparse_value_types": {"C1": "string", "C2": "integer", "M1": "integer_list"},
    }
    shutil.move(trained_on_parquet["table"], str(root / "moved"))  # where a later test finds it
    model = str(tmp_path / "after")
    assert export.main(["--checkpoint", checkpoint, "--output", model, "--quantize", "none"]) == 0
    before = json.loads(open(os.path.join(root, "before", "inputs.json")).read())
    assert json.loads(open(os.path.join(model, "inputs.json")).read()) == before
    expected = trained_on_parquet["scores"]
    assert len(expected) == 120 and _scores(model, trained_on_parquet["rows"], str(tmp_path / "p.parquet")) == expected
    rows = pq.read_table(trained_on_parquet["rows"]).to_pylist()
    body = "".join(
        json.dumps({k: v for k, v in row.items() if k in ("I1", "I2", "C1", "C2", "M1")}) + "\n" for row in rows
    ).encode()
    with serve.serving_in_background(predict.Predictor(model)) as (url, _):
        request = urllib.request.Request(
            f"{url}/predict", data=body, method="POST", headers={"Accept": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert json.loads(answer.read())["probabilities"] == pytest.approx(expected, rel=1e-6, abs=1e-7)


def _rewritten(checkpoint: str, target: str, change) -> str:
    """A copy of ``checkpoint`` whose meta.json ``change`` rewrote (a dict -> a dict), its
    manifest entry rewritten to match."""
    shutil.copytree(checkpoint, target)
    meta = json.loads(open(os.path.join(target, "meta.json")).read())
    data = json.dumps(change(meta)).encode()
    open(os.path.join(target, "meta.json"), "wb").write(data)
    manifest = json.loads(open(os.path.join(target, "COMPLETE")).read())
    manifest["files"]["meta.json"] = entry_of_bytes(data)
    open(os.path.join(target, "COMPLETE"), "w").write(json.dumps(manifest))
    return target


def _as_version_5(checkpoint: str, target: str) -> str:
    """A copy of ``checkpoint`` whose meta.json is of version 5 (no record of what serving needs)."""
    return _rewritten(
        checkpoint,
        target,
        lambda meta: {**{k: v for k, v in meta.items() if not k.startswith("serving_")}, "version": 5},
    )


@pytest.mark.slow
def test_an_older_checkpoint_without_its_table_says_what_to_pass(trained_on_parquet, tmp_path, capsys):
    root = trained_on_parquet["root"]
    if os.path.exists(trained_on_parquet["table"]):  # run alone: the test above moves it
        shutil.move(trained_on_parquet["table"], str(root / "moved"))
    old = _as_version_5(trained_on_parquet["checkpoint"], str(tmp_path / "step_old"))
    capsys.readouterr()
    assert export.main(["--checkpoint", old, "--output", str(tmp_path / "refused"), "--quantize", "none"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and not os.path.exists(tmp_path / "refused")
    assert f"--parquet_path {trained_on_parquet['table']}" in error
    assert (
        f"{old}/meta.json (version 5) predates the record of what serving needs, so export reads the "
        "training data: pass --training_data with where that data is now" in error
    )
    model = str(tmp_path / "model")
    assert (
        export.main(
            ["--checkpoint", old, "--output", model, "--quantize", "none", "--training_data", str(root / "moved")]
        )
        == 0
    )
    before = json.loads(open(os.path.join(root, "before", "inputs.json")).read())
    after = json.loads(open(os.path.join(model, "inputs.json")).read())
    # No seen-id filters: version 5 did not save them (its model counts no unseen id).
    assert before["preprocessing"].pop("id_sketch") is not None and after["preprocessing"].pop("id_sketch") is None
    assert {k: v for k, v in after.items() if k not in ("checkpoint", "data_path")} == {
        k: v for k, v in before.items() if k not in ("checkpoint", "data_path")
    }
    assert after["data_path"] == str(root / "moved")
    assert _scores(model, trained_on_parquet["rows"], str(tmp_path / "p.parquet")) == trained_on_parquet["scores"]


@pytest.mark.slow
def test_a_criteo_model_made_with_a_threshold_needs_its_vocabulary(trained, tmp_path, capsys):
    """The one file of the training data an export copies: without it, one line."""
    ckpt = _checkpoint(trained["ckpt"])

    def moved(meta: dict) -> dict:
        meta["config"]["data"]["source_options"]["in_memory_binary_criteo_path"] = str(tmp_path / "gone")
        return meta

    copy = _rewritten(ckpt, str(tmp_path / "step_moved"), moved)
    assert json.loads(open(os.path.join(copy, "meta.json")).read())["serving_facts"]["frequency_threshold"] > 0
    capsys.readouterr()
    assert export.main(["--checkpoint", copy, "--output", str(tmp_path / "refused"), "--quantize", "none"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and not os.path.exists(tmp_path / "refused")
    assert f"{tmp_path / 'gone' / 'vocabulary.npz'}: no such file; the data was made with frequency threshold" in error
    assert "pass --training_data with where the Criteo directory is now" in error
    model = str(tmp_path / "model")
    assert (
        export.main(["--checkpoint", copy, "--output", model, "--quantize", "none", "--training_data", trained["data"]])
        == 0
    )
    assert (
        open(os.path.join(model, "vocabulary.npz"), "rb").read()
        == open(os.path.join(trained["data"], "vocabulary.npz"), "rb").read()
    )
