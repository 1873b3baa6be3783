"""serving/layouts/: the registry of serving input layouts. A layout added as one
module (here a throwaway one, registered as serving/layouts/__init__.py registers its
modules) is picked up by export (its record and its description from meta.json) and by
serving (its reader, in the predictor and the HTTP endpoint)."""

import json
import urllib.request
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

from common.json_fields import TEXT, JsonObject
from serving import predict, serve
from serving.export import export_model
from serving.layouts import LAYOUTS
from serving.layouts.base import Checkpoint, Description, ParsedLines
from serving.layouts.criteo_lines import CriteoLines, CriteoPreprocessing
from serving.model_inputs import read_inputs
from tests.support.exported_model import tiny_checkpoint


@dataclass
class PipePreprocessing(CriteoPreprocessing):
    """Criteo lines with another field separator, which training recorded."""

    LAYOUT: ClassVar[str] = "pipe_lines"
    separator: str = "|"

    @classmethod
    def read(cls, document: JsonObject, legacy: bool, count: int) -> "PipePreprocessing":
        criteo = CriteoPreprocessing.read(document, legacy, count)
        return cls(**vars(criteo), separator=document.object("preprocessing").get("separator", TEXT))


class PipeLines(CriteoLines):
    """The throwaway layout's reader: Criteo lines whose fields the recorded separator divides."""

    record = PipePreprocessing

    @staticmethod
    def describe(checkpoint: Checkpoint) -> Description:
        described = CriteoLines.describe(checkpoint)
        facts = checkpoint.facts()
        assert facts is not None
        described.preprocessing = PipePreprocessing(
            **vars(described.preprocessing), separator=facts.get("separator", TEXT)
        )
        return described

    def _tabs(self, data: bytes) -> bytes:
        return data.replace(self.separator, b"\t")

    def __init__(self, inputs, vocabulary=None) -> None:
        super().__init__(inputs, vocabulary)
        self.separator = inputs.preprocessing.separator.encode()

    def is_labelled(self, data: bytes) -> bool:
        return super().is_labelled(self._tabs(data))

    def parse(self, data: bytes, source: str, first_line: int, labelled: bool) -> ParsedLines:
        return super().parse(self._tabs(data), source, first_line, labelled)


def criteo_lines(count: int) -> bytes:
    """Raw Criteo lines without labels: 13 counts, 26 hashes."""
    rng = np.random.default_rng(1)
    return b"".join(
        "\t".join(
            [*(str(v) for v in rng.integers(0, 50, 13)), *(f"{v:08x}" for v in rng.integers(0, 1 << 32, 26))]
        ).encode()
        + b"\n"
        for _ in range(count)
    )


def test_every_layout_is_registered_under_its_records_name():
    assert {name: reader.record.LAYOUT for name, reader in LAYOUTS.items()} == {
        "criteo_raw": "criteo_raw",
        "feature_spec_csv": "feature_spec_csv",
        "parquet_columns": "parquet_columns",
    }
    from serving import model_inputs

    assert model_inputs.PARQUET_LAYOUT == "parquet_columns"


@pytest.mark.slow  # the endpoint's threads; export writes programs
def test_a_layout_added_in_one_module_is_picked_up_by_export_predict_and_serve(tmp_path, monkeypatch):
    monkeypatch.setitem(LAYOUTS, PipePreprocessing.LAYOUT, PipeLines)
    piped = tiny_checkpoint(
        tmp_path / "piped", "layouts", serving_layout=PipePreprocessing.LAYOUT, serving_facts={"separator": "|"}
    )
    plain = tiny_checkpoint(tmp_path / "plain", "layouts")  # the same weights, in the Criteo layout
    inputs = export_model(piped, str(tmp_path / "piped_model"), [])
    export_model(plain, str(tmp_path / "plain_model"), [])
    assert read_inputs(str(tmp_path / "piped_model")) == inputs
    assert inputs.layout == "pipe_lines" and inputs.preprocessing == PipePreprocessing(separator="|")
    assert json.loads(open(tmp_path / "piped_model" / "inputs.json").read())["preprocessing"]["separator"] == "|"

    lines = criteo_lines(20)
    (tmp_path / "tabs.tsv").write_bytes(lines)
    (tmp_path / "pipes.txt").write_bytes(lines.replace(b"\t", b"|"))
    for model, data in (("plain_model", "tabs.tsv"), ("piped_model", "pipes.txt")):
        assert (
            predict.main(
                [
                    "--model",
                    str(tmp_path / model),
                    "--input",
                    str(tmp_path / data),
                    "--output",
                    str(tmp_path / f"{model}.txt"),
                ]
            )
            == 0
        )
    expected = [float(p) for p in (tmp_path / "plain_model.txt").read_text().split()]
    assert (
        len(expected) == 20 and (tmp_path / "piped_model.txt").read_text() == (tmp_path / "plain_model.txt").read_text()
    )
    with serve.serving_in_background(predict.Predictor(str(tmp_path / "piped_model"))) as (url, _):
        request = urllib.request.Request(
            f"{url}/predict", data=lines.replace(b"\t", b"|"), method="POST", headers={"Accept": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            scored = json.loads(answer.read())["probabilities"]
    np.testing.assert_allclose(scored, expected, rtol=1e-6)
