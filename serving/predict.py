"""Click probabilities for raw Criteo lines or BYO CSV rows, from an exported model directory.

    python -m serving.predict --model MODEL_DIR --input day_23.tsv|rows.csv [--output preds.csv]
        [--variant fp32|fp16|int8] [--batch_size 4096]

The input layout is the model's (inputs.json "layout"; serving/input_layouts.py):

- Models trained on Criteo's binary layout read raw Criteo lines (plain or .gz),
  tab-separated: label, 13 integer features, 26 hexadecimal hashes (40 fields), or the
  same without the label (39 fields, as Criteo's unlabeled test files); any feature may
  be empty. The transforms are preprocessing's (data/criteo_transforms.py): dense
  log(max(x, 0) + 3), hashes through the vocabulary or the low 31 bits, modulo the
  table sizes.
- Models trained with --dataset_path (a feature spec) read BYO CSV rows (plain or
  .gz): headerless, comma-separated, the label (optional), the numerical features, then
  the categorical ids, each feature in its channel_spec order and a feature of hotness
  k taking k columns (``ModelInputs.csv_columns``). The transforms are the transcoder's:
  numerical values rounded to float16, ids checked against the cardinalities, then
  modulo the table sizes.

Whether lines carry the label is judged by the first line's field count. Output: one
probability per input line, in order (stdout without --output). A malformed line stops
the run with its line number (exit 2); the output is written under a temporary name
and renamed when complete, so nothing partial is left.

Python API::

    predictor = Predictor("model_dir")
    probabilities = predictor.predict(dense, sparse)  # Criteo: (N, 13) ints, (N, 26) uint32 hashes
"""

import argparse
import os
import sys
from typing import Optional, Sequence, TextIO, Tuple

import numpy as np
import torch

from common.atomic import atomic_path
from common.cli import run_cli
from common.errors import BadInput
from data.text_lines import DaySource, iter_line_chunks
from serving.cli import serving_parser
from serving.input_layouts import InputLayout, load_layout
from serving.model_files import load_model_file, read_manifest
from serving.model_inputs import read_inputs

VARIANTS = ("fp32", "fp16", "int8")


class Predictor:
    """Loads one variant of an exported model and predicts click probabilities.

    Args:
        model_dir: a directory written by ``python -m serving.export``.
        variant: fp32 (the torch.export program), fp16 or int8 (quantized tables).
        batch_size: rows per forward.

    Example::

        predictor = Predictor("model_dir", variant="int8")
        p = predictor.predict(np.zeros((2, 13), np.int64), np.zeros((2, 26), np.uint32))
        p = predictor.predict_lines(b"1\t5\t...\n")  # or CSV rows, for a feature-spec model
    """

    def __init__(self, model_dir: str, variant: str = "fp32", batch_size: int = 4096) -> None:
        if not os.path.isdir(model_dir):
            raise BadInput(f"--model {model_dir}: no such directory")
        manifest = read_manifest(model_dir)
        self.inputs = read_inputs(model_dir, manifest)
        if variant not in self.inputs.variants:
            raise BadInput(f"{model_dir} has no {variant} model (it has {', '.join(self.inputs.variants)})")
        if batch_size <= 0:
            raise BadInput(f"--batch_size must be positive, got {batch_size}")
        entry = self.inputs.variants[variant]
        self.model = load_model_file(model_dir, entry.file, entry.format, manifest,
                                     {"dense": self.inputs.num_dense_features, "sparse": sum(self.inputs.sparse_hotness)})
        self.batch_size = batch_size
        self.layout: InputLayout = load_layout(self.inputs, model_dir, manifest)
        self.table_sizes = np.asarray(self.inputs.num_embeddings_per_feature, dtype=np.int64)
        # The table of each column of the sparse input.
        self._column_tables = np.repeat(self.table_sizes, self.inputs.sparse_hotness)

    def prepare(self, dense: np.ndarray, sparse: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Features as the data gives them -> the model's inputs, with the training data's transforms.

        Args:
            dense: (N, num_dense). Criteo: integer features as in the raw lines, missing
                ones as 0. Feature spec: the numerical values as in the CSV rows.
            sparse: (N, sum of hotness). Criteo: hashes as unsigned 32-bit integers,
                missing as 0. Feature spec: ids, feature f in hotness[f] columns.

        Returns:
            dense (N, num_dense) float32 and ids (N, sum of hotness) int64 below the table sizes.

        Raises BadInput on wrong shapes, and for a feature-spec model on an id that is not
        an integer below its feature's cardinality (naming the row).
        """
        dense = np.asarray(dense)
        sparse = np.asarray(sparse)
        num_dense, num_sparse = self.layout.num_dense, self.layout.num_sparse_columns
        if dense.ndim != 2 or dense.shape[1] != num_dense:
            raise BadInput(f"dense must have shape (N, {num_dense}), got {dense.shape}")
        if sparse.shape != (dense.shape[0], num_sparse):
            raise BadInput(f"sparse must have shape ({dense.shape[0]}, {num_sparse}), got {sparse.shape}")
        bad = self.layout.find_bad_row(sparse)
        if bad is not None:
            raise BadInput(f"row {bad[0]}: {bad[1]}")
        return self._transform(dense, sparse)

    def _transform(self, dense: np.ndarray, sparse: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """`prepare` on inputs already checked."""
        dense, ids = self.layout.transform(dense, sparse)
        return dense, self.ids_in_tables(ids)

    def ids_in_tables(self, ids: np.ndarray) -> np.ndarray:
        """Ids (N, sum of hotness) of the data -> int64 below the table sizes: the training
        loader takes them modulo the table sizes, and so does serving."""
        return np.remainder(np.asarray(ids, dtype=np.int64), self._column_tables)

    def predict(self, dense: np.ndarray, sparse: np.ndarray) -> np.ndarray:
        """Probabilities (N,) float32 from the data's features (see `prepare`)."""
        return self.predict_transformed(*self.prepare(dense, sparse))

    def predict_transformed(self, dense: np.ndarray, sparse_ids: np.ndarray) -> np.ndarray:
        """Probabilities (N,) from inputs already in the training layout: dense
        (N, num_dense) float32 transformed, sparse_ids (N, sum of hotness) ids below the
        table sizes."""
        dense_t = torch.as_tensor(np.ascontiguousarray(dense, dtype=np.float32))
        sparse_t = torch.as_tensor(np.ascontiguousarray(sparse_ids, dtype=np.int64))
        out = []
        with torch.no_grad():
            for start in range(0, len(dense_t), self.batch_size):
                stop = start + self.batch_size
                out.append(self.model(dense_t[start:stop], sparse_t[start:stop]).float().numpy())
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def predict_lines(self, data: bytes, source: str = "<input>", first_line: int = 1,
                      labelled: Optional[bool] = None) -> np.ndarray:
        """Probabilities of whole input lines (see `prepare_lines`)."""
        return self.predict_transformed(*self.prepare_lines(data, source, first_line, labelled))

    def prepare_lines(self, data: bytes, source: str = "<input>", first_line: int = 1,
                      labelled: Optional[bool] = None) -> Tuple[np.ndarray, np.ndarray]:
        """The model's inputs for whole lines in the model's input layout (raw Criteo
        lines or BYO CSV rows, labelled or not; see the module docstring).

        Args:
            data: whole lines.
            source, first_line: the file and 1-based number of the first line, for errors.
            labelled: whether lines start with a label (None: judged by the first line).

        Raises MalformedLineError naming ``source`` and the line number of the first bad line.
        """
        if labelled is None:
            labelled = self.layout.is_labelled(data)
        return self._transform(*self.layout.parse(data, source, first_line, labelled))


def predict_file(predictor: Predictor, path: str, out: TextIO, chunk_bytes: int = 1 << 22) -> int:
    """Writes one probability per line of ``path`` to ``out``; returns the line count."""
    if not os.path.exists(path):
        raise BadInput(f"--input {path}: no such file")
    lines = 0
    labelled = None  # decided once, by the file's first line
    for first_line, _, data in iter_line_chunks(DaySource(0, path), chunk_bytes):
        labelled = predictor.layout.is_labelled(data) if labelled is None else labelled
        probabilities = predictor.predict_lines(data, path, first_line + 1, labelled)
        out.write("".join(f"{p:.7g}\n" for p in probabilities))
        lines += len(probabilities)
    return lines


def main(argv: Optional[Sequence[str]] = None, alias: bool = False) -> int:
    """The command line; ``alias``: run as ``python -m training.predict`` (its old name)."""
    parser = serving_parser("predict", __doc__, alias)
    parser.add_argument("--model", required=True, help="a directory written by python -m serving.export")
    parser.add_argument("--input", required=True,
                        help="raw Criteo lines (.tsv/.txt), or BYO CSV rows for a --dataset_path model; or .gz")
    parser.add_argument("--output", default=None, help="one probability per line (default stdout)")
    parser.add_argument("--variant", choices=VARIANTS, default="fp32", help="which exported model to use")
    parser.add_argument("--batch_size", type=int, default=4096, help="rows per forward")
    args = parser.parse_args(argv)
    return run_cli(lambda: _predict(args), parser.prog)


def check_output(output: str, input_path: str) -> None:
    """Refuses, before any work, an --output that cannot be written or that is the
    --input itself (the same file under any name: a symlink, a hard link)."""
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise BadInput(f"--output {output}: no such directory {parent}")
    if os.path.isdir(output):
        raise BadInput(f"--output {output} is a directory: give the file to write")
    if os.path.exists(output) and os.path.exists(input_path) and os.path.samefile(output, input_path):
        raise BadInput(f"--output {output} is the --input {input_path}: writing it would replace the input")


def _predict(args: argparse.Namespace) -> int:
    if args.output is not None:
        check_output(args.output, args.input)
    predictor = Predictor(args.model, args.variant, args.batch_size)
    if args.output is None:
        predict_file(predictor, args.input, sys.stdout)
    else:
        with atomic_path(args.output) as tmp, open(tmp, "w") as out:
            lines = predict_file(predictor, args.input, out)
        print(f"wrote {args.output}: {lines} probabilities ({args.variant} model {args.model})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
