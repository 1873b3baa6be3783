"""A model with history features (--sequence_columns) exported and served.

One tiny model per sequence interaction (din, transformer), saved as a checkpoint of a
Parquet model in this process, exported once with --format aoti: its fp32 program and
AOTInductor package take the histories as jagged inputs (history_values,
history_lengths) and give the eager model's probabilities (1e-6) on rows with empty
histories and histories longer than max_history (the newest kept, as training's data
does). Served, a history is a JSON list of raw ids (or a Parquet list column), hashed as
its item column; a history that is no list, or holds ids of another type, is one line
(exit 2, HTTP 400).
"""

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from common.errors import BadInput
from data.parquet.id_hashing import integer_keys
from data.parquet.id_sketch import IdSketch
from serving import delta, export, predict, quality_gate, serve
from serving.inference_model import load_checkpoint_model
from serving.model_inputs import HistoryInput, read_inputs
from serving.predict import Predictor, jagged_histories
from tests.support.exported_model import tiny_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.native]  # AOTInductor compiles C++

MAX_HISTORY = 3
SEQUENCES = [("h3", "cat_3"), ("h5", "cat_5")]
ROWS = 10
FLAGS = [
    "--sequence_columns",
    ",".join(f"{h}:{i}" for h, i in SEQUENCES),
    "--max_history",
    str(MAX_HISTORY),
    "--din_attention_layer_sizes",
    "8",
    "--transformer_ffn_size",
    "8",
]
# A Parquet model of the random data's columns: int_0..12, cat_0..25 (integer ids), h3, h5.
FACTS = {"sparse_value_types": {f"cat_{i}": "integer" for i in range(26)}}
INTERACTIONS = ("din", "transformer")
# Per row, each history's ids (oldest first): empty ones, one longer than MAX_HISTORY, a full one.
HISTORIES = [
    ([], []),
    ([1, 2], [3]),
    ([1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 6]),
    ([4, 4, 4], []),
    ([], [0, 1, 2]),
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, dict[str, str]]:
    """Per interaction: its checkpoint and its export (--format aoti, fp32 only)."""
    models = {}
    for interaction in INTERACTIONS:
        root = tmp_path_factory.mktemp(interaction)
        checkpoint = tiny_checkpoint(
            root,
            interaction,
            serving_layout="parquet_columns",
            serving_facts=FACTS,
            num_embeddings=ROWS,
            flags=[*FLAGS, "--sequence_interaction", interaction],
        )
        model = str(root / "model")
        assert (
            export.main(["--checkpoint", checkpoint, "--output", model, "--quantize", "none", "--format", "aoti"]) == 0
        )
        models[interaction] = {"checkpoint": checkpoint, "model": model, "root": str(root)}
    return models


def _rows(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    dense = torch.as_tensor(rng.normal(size=(len(HISTORIES), 13)), dtype=torch.float32)
    return dense, torch.as_tensor(rng.integers(0, ROWS, (len(HISTORIES), 26)))


def _eager(checkpoint: str, dense: torch.Tensor, sparse: torch.Tensor) -> np.ndarray:
    """The trained model's probabilities, its histories cut to their newest MAX_HISTORY
    as the training data holds them."""
    model, meta = load_checkpoint_model(checkpoint)
    names = meta.model.sparse_feature_names
    values = [sparse[:, f] for f in range(len(names))]
    lengths = [torch.ones(len(sparse), dtype=torch.int64)] * len(names)
    for s in range(len(SEQUENCES)):
        kept = [row[s][-MAX_HISTORY:] for row in HISTORIES]
        values.append(torch.tensor([i for history in kept for i in history], dtype=torch.int64))
        lengths.append(torch.tensor([len(history) for history in kept]))
    features = KeyedJaggedTensor.from_lengths_sync(
        keys=[*names, *(h for h, _ in SEQUENCES)], values=torch.cat(values), lengths=torch.cat(lengths)
    )
    with torch.no_grad():
        return torch.sigmoid(model.model(dense, features).squeeze(-1)).numpy()


def _jagged() -> tuple[torch.Tensor, torch.Tensor]:
    """The programs' history inputs of HISTORIES, every id sent (the program keeps the newest)."""
    values = torch.tensor([i for row in HISTORIES for history in row for i in history], dtype=torch.int64)
    lengths = torch.tensor([[len(history) for history in row] for row in HISTORIES], dtype=torch.int64)
    return values, lengths


def test_inputs_json_describes_the_histories(exported):
    inputs = read_inputs(exported["din"]["model"])
    assert inputs.histories == [HistoryInput(h, i, MAX_HISTORY) for h, i in SEQUENCES]
    assert inputs.input_columns() == {"dense": 13, "sparse": 26, "history_values": 1, "history_lengths": 2}
    assert set(inputs.variants) == {"fp32", "fp32_aoti"}


@pytest.mark.parametrize("interaction", INTERACTIONS)
def test_every_format_gives_the_eager_probabilities(exported, interaction):
    dense, sparse = _rows()
    expected = _eager(exported[interaction]["checkpoint"], dense, sparse)
    values, lengths = _jagged()
    for variant in ("fp32", "fp32_aoti"):
        predictor = Predictor(exported[interaction]["model"], variant, trust_native_code=True)
        with torch.no_grad():
            got = predictor.model(dense, sparse, values, lengths).numpy()
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6, err_msg=variant)
        # A batch of one row without any history id, and the predictor's own path (histories in places).
        with torch.no_grad():
            alone = predictor.model(dense[:1], sparse[:1], values[:0], lengths[:1]).numpy()
        np.testing.assert_allclose(alone, expected[:1], rtol=0, atol=1e-6)
        places = np.full((len(HISTORIES), MAX_HISTORY * len(SEQUENCES)), -1, np.int64)
        for r, row in enumerate(HISTORIES):
            for s, history in enumerate(row):
                kept = history[-MAX_HISTORY:]
                places[r, s * MAX_HISTORY : s * MAX_HISTORY + len(kept)] = kept
        ids = np.concatenate([sparse.numpy(), places], axis=1)
        np.testing.assert_allclose(predictor.predict_transformed(dense.numpy(), ids), expected, rtol=0, atol=1e-6)


def test_jagged_histories_of_places():
    places = np.array([[5, 6, -1, -1, -1, -1], [-1, -1, -1, 7, 8, 9]])
    histories = [HistoryInput("a", "c", 2), HistoryInput("b", "c", 4)]
    values, lengths = jagged_histories(places, histories)
    assert values.tolist() == [5, 6, 7, 8, 9] and lengths.tolist() == [[2, 0], [0, 3]]


def _json_row(r: int, **changed) -> dict:
    row = {**{f"int_{i}": i + r for i in range(13)}, **{f"cat_{i}": 1000 * i + r for i in range(26)}}
    row.update({h: list(HISTORIES[r][s]) for s, (h, _) in enumerate(SEQUENCES)})
    return {**row, **changed}


def test_json_histories_are_hashed_as_their_item_and_cut_to_the_newest(exported):
    predictor = Predictor(exported["din"]["model"])
    # h3 holds cat_3's own value, then 4 more: the newest 3 are kept, oldest first.
    raw = [3000, 11, 12, 13, 3000]
    row = _json_row(0, h3=raw, h5=None)
    prepared = predictor.read_lines(json.dumps(row).encode())
    candidate = prepared.ids[0, 3]
    places = prepared.ids[0, 26:]
    alone = [predictor.read_lines(json.dumps(_json_row(0, cat_3=v)).encode()).ids[0, 3] for v in raw[-3:]]
    assert places.tolist() == [*alone, -1, -1, -1] and alone[-1] == candidate  # h5 null: empty
    assert prepared.id_counts.tolist()[-2:] == [3, 0]
    # Unseen: against the item's seen-id filter (training held only cat_i's value 1000 * i).
    predictor.layout.sketches = [IdSketch.of(integer_keys(np.array([1000 * i]))) for i in range(26)]  # type: ignore[attr-defined]
    counted = predictor.read_lines(json.dumps(_json_row(0, h3=raw)).encode())
    # 12 and 13 (3000 is cat_3's value); 11 is left out, past max_history.
    assert predictor.unseen_by_feature(counted.unseen) == {"h3": 2}


def test_predict_reads_json_rows_and_parquet_list_columns(exported, tmp_path, capsys):
    model = exported["transformer"]["model"]
    rows = [_json_row(r) for r in range(len(HISTORIES))]
    expected = Predictor(model).predict_lines("".join(json.dumps(row) + "\n" for row in rows).encode())
    lines = tmp_path / "rows.jsonl"
    lines.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "p.csv"
    assert predict.main(["--model", model, "--input", str(lines), "--output", str(out)]) == 0
    np.testing.assert_allclose(np.loadtxt(out), expected, rtol=1e-6)
    table = pa.Table.from_pylist([{**row, "label": r % 2} for r, row in enumerate(rows)])
    pq.write_table(table, tmp_path / "rows.parquet")
    out_pq = tmp_path / "p.parquet"
    assert predict.main(["--model", model, "--input", str(tmp_path / "rows.parquet"), "--output", str(out_pq)]) == 0
    np.testing.assert_allclose(pq.read_table(out_pq).column("probability").to_numpy(), expected, rtol=1e-6)
    # The quality gate scores every variant on the same labelled rows.
    capsys.readouterr()
    gate = ["--model", model, "--data", str(tmp_path / "rows.parquet"), "--trust_native_code"]
    assert quality_gate.main(gate) == 0
    assert "AUROC fp32_aoti" in capsys.readouterr().out
    # A history that is no list, or of ids of another type than its item's: one line, exit 2.
    for bad, shown in (({"h5": 7}, "7"), ({"h3": [1, "x"]}, '[1, "x"]')):
        lines.write_text(json.dumps(rows[0]) + "\n" + json.dumps({**rows[1], **bad}) + "\n")
        assert predict.main(["--model", model, "--input", str(lines), "--output", str(out)]) == 2
        column = next(iter(bad))
        assert capsys.readouterr().err == (
            f"python -m serving.predict: error: {lines} line 2 column {column}: expected a history: a list of "
            f"integer ids (those of its item column), oldest first, or null, got {shown}\n"
        )


def _post(url: str, body: bytes) -> tuple:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url + "/predict", data=body, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_http_scores_histories_and_refuses_a_bad_one_in_one_line(exported):
    predictor = Predictor(exported["din"]["model"])
    rows = [_json_row(r) for r in range(len(HISTORIES))]
    expected = predictor.predict_lines("".join(json.dumps(row) + "\n" for row in rows).encode())
    with serve.serving_in_background(Predictor(exported["din"]["model"])) as (url, _):
        status, answer = _post(url, "".join(json.dumps(row) + "\n" for row in rows).encode())
        assert status == 200
        np.testing.assert_allclose(answer["probabilities"], expected, rtol=1e-6)
        assert _post(url, json.dumps(_json_row(0, h3="1,2")).encode()) == (
            400,
            {
                "error": "request line 1 column h3: expected a history: a list of integer ids (those of its item "
                'column), oldest first, or null, got "1,2"'
            },
        )


def test_a_delta_export_carries_the_item_tables(exported, tmp_path):
    """A delta of a model whose item table (in the EmbeddingCollection) changed gives
    the full export's probabilities."""
    din = exported["din"]

    def changed(model: torch.nn.Module) -> None:
        tables = model.model.sparse_arch.embedding_collection.embeddings
        tables["t_cat_3"].weight[2] += 0.5
        model.model.sparse_arch.embedding_bag_collection.embedding_bags["t_cat_0"].weight[1] -= 0.5

    later = tiny_checkpoint(
        tmp_path,
        "din",
        serving_layout="parquet_columns",
        serving_facts=FACTS,
        num_embeddings=ROWS,
        flags=[*FLAGS, "--sequence_interaction", "din"],
        step=2,
        change=changed,
    )
    full, part = str(tmp_path / "full"), str(tmp_path / "delta")
    assert export.main(["--checkpoint", later, "--output", full]) == 0
    assert (
        export.main(["--checkpoint", later, "--output", part, "--quantize", "none", "--delta_from", din["model"]]) == 0
    )
    assert delta.is_delta(part)
    rows = "".join(json.dumps(_json_row(r, h3=[2, 2, 1], cat_0=1)) + "\n" for r in range(len(HISTORIES))).encode()
    expected = Predictor(full).predict_lines(rows)
    assert not np.allclose(expected, Predictor(din["model"]).predict_lines(rows))
    np.testing.assert_allclose(Predictor(part).predict_lines(rows), expected, rtol=0, atol=1e-7)


def test_quantized_variants_and_layouts_without_histories_are_refused_in_one_line(exported, tmp_path):
    checkpoint = exported["din"]["checkpoint"]
    with pytest.raises(
        BadInput,
        match=r"^--quantize int8: .* has history features \(--sequence_columns h3:cat_3,h5:cat_5\), exported in fp32 only: pass --quantize none$",
    ):
        export.export_model(checkpoint, str(tmp_path / "q"), ["int8"])
    # The random data's own layout (raw Criteo lines) has no place for a history.
    criteo = tiny_checkpoint(tmp_path, "c", num_embeddings=ROWS, flags=FLAGS)
    export.export_model(criteo, str(tmp_path / "criteo"), [])
    with pytest.raises(
        BadInput, match=r"a model with history features \(h3, h5\), whose input layout \(criteo_raw\) has no place"
    ):
        Predictor(str(tmp_path / "criteo"))
    assert os.path.exists(tmp_path / "criteo" / "fp32.pt2")
