"""Quality gate of an exported model: AUROC of each variant on the test split.

    python -m serving.quality_gate --model MODEL_DIR [--data DIR] [--limit_rows N] [--trust_native_code]

DIR is the data the model was trained on (default: the one recorded at export): a
binary Criteo directory, or PATH/feature_spec.yaml for a --dataset_path model. The test
split is the training run's (second half of the last day, or of the test mapping). A
model trained with --parquet_path is gated on the labelled Parquet rows --data names (a
file, a directory with Hive partitions, a glob or a URL, as --parquet_path: data it was
not trained on, such as the newest day held back), every row of it, read as
serving.predict reads Parquet; serving never opens the training run's data. The
gate passes when the fp16 model's AUROC is within 0.001 of fp32's and int8's within
0.003; the three values are printed. A directory exported with --format aoti also
holds AOTInductor packages (compiled native code): with --trust_native_code they are
gated too, each within its precision's tolerance of fp32's (fp32_aoti: 1e-4); without,
they are left out and the output says so. Exit 0 on a pass, 1 on a failure, 2 on bad input.
"""

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torchmetrics.functional.classification import binary_auroc

from common.cli import run_cli
from common.config_flags import flag
from common.errors import BadInput
from serving.cli import MODEL_DIR_HELP, parse_config, serving_parser
from serving.layouts import LAYOUTS
from serving.layouts.parquet_rows import ParquetRows
from serving.model_files import AOTI_FORMAT, TRUST_FLAG, read_manifest
from serving.model_inputs import ModelInputs, aoti_variant, read_inputs
from serving.predict import TRUST_HELP, ParquetInput, Predictor

# Largest allowed |AUROC(variant) - AUROC(fp32)|; an AOTInductor package's, its precision's
# (fp32's: its compiled kernels may round differently from the program's).
_QUANTIZED_TOLERANCE = {"fp16": 0.001, "int8": 0.003}
AUROC_TOLERANCE = {
    **_QUANTIZED_TOLERANCE,
    aoti_variant("fp32"): 1e-4,
    **{aoti_variant(p): tolerance for p, tolerance in _QUANTIZED_TOLERANCE.items()},
}


@dataclass
class GateResult:
    """AUROC per variant and whether every other variant is within its tolerance of
    fp32's; ``untrusted``: the AOTInductor variants left out (no --trust_native_code)."""

    auroc: dict[str, float]
    rows: int
    untrusted: tuple[str, ...] = ()
    parquet: bool = False  # scored on the Parquet rows --data names, not a test split

    @property
    def failures(self) -> dict[str, float]:
        return {
            v: abs(self.auroc[v] - self.auroc["fp32"])
            for v, tol in AUROC_TOLERANCE.items()
            if v in self.auroc and abs(self.auroc[v] - self.auroc["fp32"]) > tol
        }

    @property
    def passed(self) -> bool:
        return not self.failures


def evaluate_variants(
    model_dir: str, data_dir: str | None = None, limit_rows: int | None = None, trust_native_code: bool = False
) -> GateResult:
    """AUROC of every exported variant on the test split of ``data_dir`` (a binary Criteo
    directory, or the feature_spec.yaml of a model trained with --dataset_path), or for
    a model trained on Parquet on the labelled Parquet rows ``data_dir`` names
    (`parquet_rows`); the AOTInductor variants only with ``trust_native_code``."""
    inputs = read_inputs(model_dir, read_manifest(model_dir))
    untrusted = tuple(
        v for v, entry in inputs.variants.items() if entry.format == AOTI_FORMAT and not trust_native_code
    )
    predictors = {
        variant: Predictor(model_dir, variant, trust_native_code=trust_native_code)
        for variant in inputs.variants
        if variant not in untrusted
    }
    first = next(iter(predictors.values()))
    layout = first.layout
    if isinstance(layout, ParquetRows):
        if not data_dir:
            raise BadInput(
                "--data is needed: a model trained on Parquet is gated on labelled Parquet rows you name "
                "(rows it was not trained on, such as the newest day held back)"
            )
        batches = parquet_rows(layout, data_dir, limit_rows)
    else:
        batches = [_test_split(inputs, first, data_dir, limit_rows)]
    target = torch.as_tensor(np.concatenate([labels for _, _, labels in batches]).reshape(-1).astype(np.int64))
    auroc = {}
    for variant, predictor in predictors.items():
        probabilities = np.concatenate([predictor.predict_transformed(dense, ids) for dense, ids, _ in batches])
        auroc[variant] = float(binary_auroc(torch.as_tensor(probabilities), target))
    return GateResult(auroc, len(target), untrusted, parquet=isinstance(layout, ParquetRows))


def _test_split(
    inputs: ModelInputs, predictor: Predictor, data_dir: str | None, limit_rows: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dense, ids in the tables, labels) of the test split of the binary data the
    model was trained on (``data_dir``, default the one recorded at export); the ids'
    rows are the same for every variant of the model."""
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
    return dense, predictor.ids_in_tables(sparse), np.asarray(labels)


def parquet_rows(
    layout: ParquetRows, path: str, limit_rows: int | None = None
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(dense, ids in the tables, labels) of each row group of the Parquet table
    ``path`` (`ParquetInput`, as serving.predict reads it), the first ``limit_rows``
    rows at most; BadInput (one line) unless it holds labelled rows."""
    source = ParquetInput(layout, path, "--data")
    if not source.labelled:
        raise BadInput(
            f"--data {path}: has no {source.label} column: the gate scores labelled rows "
            f"(it has {', '.join(source.schema.names)})"
        )
    batches, rows = [], 0
    for _, prepared in source.row_groups():
        take = len(prepared.dense) if limit_rows is None else min(len(prepared.dense), limit_rows - rows)
        batches.append((prepared.dense[:take], prepared.sparse[:take], np.asarray(prepared.labels)[:take]))
        rows += take
        if limit_rows is not None and rows >= limit_rows:
            break
    if rows == 0:
        raise BadInput(f"--data {path}: holds no rows to gate on")
    return batches


@dataclass(kw_only=True)
class GateConfig:
    """What ``python -m serving.quality_gate`` evaluates, on which data."""

    model: str = flag(help=MODEL_DIR_HELP)
    data: str | None = flag(
        None,
        help="binary Criteo directory or PATH/feature_spec.yaml (default: the training data); "
        "for a Parquet model, labelled Parquet rows it was not trained on (required)",
    )
    limit_rows: int | None = flag(None, help="test rows to use at most")
    trust_native_code: bool = flag(False, name=TRUST_FLAG.removeprefix("--"), help=TRUST_HELP)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    parser = serving_parser("quality_gate", __doc__)
    (config,) = parse_config(parser, [GateConfig], argv)
    return run_cli(lambda: _gate(config), parser.prog)


def _gate(args: GateConfig) -> int:
    result = evaluate_variants(args.model, args.data, args.limit_rows, args.trust_native_code)
    print(f"{f'--data {args.data}' if result.parquet else 'test split'}, {result.rows} rows:")
    for variant, value in result.auroc.items():
        tolerance = AUROC_TOLERANCE.get(variant)
        note = "" if tolerance is None else f"  (|diff| {abs(value - result.auroc['fp32']):.5f}, allowed {tolerance})"
        print(f"  AUROC {variant:>4} {value:.5f}{note}")
    if result.untrusted:
        print(f"  not gated: {', '.join(result.untrusted)} (AOTInductor packages, loaded only with {TRUST_FLAG})")
    if not result.passed:
        print("quality gate FAILED: " + ", ".join(f"{v} differs by {d:.5f}" for v, d in result.failures.items()))
        return 1
    print("quality gate passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
