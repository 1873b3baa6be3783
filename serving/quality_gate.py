"""Quality gate of an exported model: AUROC of each variant on the test split.

    python -m serving.quality_gate --model MODEL_DIR [--data DIR] [--limit_rows N]

DIR is the data the model was trained on (default: the one recorded at export): a
binary Criteo directory, or PATH/feature_spec.yaml for a --dataset_path model. The test
split is the training run's (second half of the last day, or of the test mapping). The
gate passes when the fp16 model's AUROC is within 0.001 of fp32's and int8's within
0.003; the three values are printed. Exit 0 on a pass, 1 on a failure, 2 on bad input.
"""

import argparse
import sys
from dataclasses import dataclass
from typing import Optional
from collections.abc import Sequence

import numpy as np
import torch
from torchmetrics.functional.classification import binary_auroc

from common.cli import run_cli
from common.errors import BadInput
from serving.cli import serving_parser
from serving.input_layouts import LAYOUTS
from serving.model_files import read_manifest
from serving.model_inputs import read_inputs
from serving.predict import Predictor

# Largest allowed |AUROC(variant) - AUROC(fp32)|.
AUROC_TOLERANCE = {"fp16": 0.001, "int8": 0.003}


@dataclass
class GateResult:
    """AUROC per variant and whether every quantized variant is within its tolerance."""

    auroc: dict[str, float]
    rows: int

    @property
    def failures(self) -> dict[str, float]:
        return {v: abs(self.auroc[v] - self.auroc["fp32"]) for v, tol in AUROC_TOLERANCE.items()
                if v in self.auroc and abs(self.auroc[v] - self.auroc["fp32"]) > tol}

    @property
    def passed(self) -> bool:
        return not self.failures


def evaluate_variants(model_dir: str, data_dir: Optional[str] = None, limit_rows: Optional[int] = None) -> GateResult:
    """AUROC of every exported variant on the test split of ``data_dir`` (a binary Criteo
    directory, or the feature_spec.yaml of a model trained with --dataset_path)."""
    inputs = read_inputs(model_dir, read_manifest(model_dir))
    data_dir = data_dir or inputs.data_path
    if not data_dir:
        raise BadInput("--data is needed: the model was trained on random data")
    dataset = LAYOUTS[inputs.layout].training_data(data_dir)
    start, stop = dataset.split_ranges()["test"]
    if limit_rows is not None:
        stop = min(stop, start + limit_rows)
    dense, sparse, labels = dataset.read(start, stop)
    if isinstance(sparse, list):  # feature spec: one (N, hotness) array per feature
        sparse = np.concatenate(sparse, axis=1)
    target = torch.as_tensor(np.asarray(labels).reshape(-1).astype(np.int64))
    auroc = {}
    for variant in inputs.variants:
        predictor = Predictor(model_dir, variant)
        probabilities = predictor.predict_transformed(dense, predictor.ids_in_tables(sparse))
        auroc[variant] = float(binary_auroc(torch.as_tensor(probabilities), target))
    return GateResult(auroc, stop - start)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line."""
    parser = serving_parser("quality_gate", __doc__)
    parser.add_argument("--model", required=True, help="a directory written by python -m serving.export")
    parser.add_argument("--data", default=None,
                        help="binary Criteo directory or PATH/feature_spec.yaml (default: the training data)")
    parser.add_argument("--limit_rows", type=int, default=None, help="test rows to use at most")
    args = parser.parse_args(argv)
    return run_cli(lambda: _gate(args), parser.prog)


def _gate(args: argparse.Namespace) -> int:
    result = evaluate_variants(args.model, args.data, args.limit_rows)
    print(f"test split, {result.rows} rows:")
    for variant, value in result.auroc.items():
        tolerance = AUROC_TOLERANCE.get(variant)
        note = "" if tolerance is None else f"  (|diff| {abs(value - result.auroc['fp32']):.5f}, allowed {tolerance})"
        print(f"  AUROC {variant:>4} {value:.5f}{note}")
    if not result.passed:
        print("quality gate FAILED: " + ", ".join(f"{v} differs by {d:.5f}" for v, d in result.failures.items()))
        return 1
    print("quality gate passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
