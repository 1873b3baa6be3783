"""Click probabilities for raw Criteo lines or BYO CSV rows, from an exported model directory.

    python -m training.predict --model MODEL_DIR --input day_23.tsv|rows.csv [--output preds.csv]
        [--variant fp32|fp16|int8] [--batch_size 4096]

The input layout is the model's (inputs.json "layout"):

- Models trained on Criteo's binary layout read raw Criteo lines (plain or .gz),
  tab-separated: label, 13 integer features, 26 hexadecimal hashes (40 fields), or the
  same without the label (39 fields, as Criteo's unlabeled test files); any feature may
  be empty. The transforms are preprocessing's (data/preprocess_criteo.py): dense
  log(max(x, 0) + 3), hashes through the vocabulary or the low 31 bits, modulo the
  table sizes.
- Models trained with --dataset_path (a feature spec) read BYO CSV rows (plain or
  .gz): headerless, comma-separated, the label (optional), the numerical features, then
  the categorical ids, each feature in its channel_spec order and a feature of hotness
  k taking k columns (inputs.json "csv_columns"). The transforms are the transcoder's:
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

import io
import os
import re
import sys
import zipfile
from typing import List, Optional, Sequence, TextIO, Tuple

import numpy as np
import torch

from common.atomic import atomic_path
from common.cli import OneLineParser, cli_main
from common.errors import BadInput
from data.csv_rows import CsvRowsError, find_bad_id, parse_csv_rows
from data.criteo_tsv import NUM_CAT, NUM_FIELDS, NUM_INT, parse_criteo_lines
from data.preprocess_criteo import DaySource, iter_line_chunks, transform_dense, transform_sparse
from training.inference_model import CRITEO_LAYOUT, FEATURE_SPEC_LAYOUT, read_inputs
from training.model_files import load_model_file, read_file, read_manifest

VARIANTS = ("fp32", "fp16", "int8")


class MalformedLineError(BadInput):
    """An input line not in the model's input layout; the message names the file and line."""


class Predictor:
    """Loads one variant of an exported model and predicts click probabilities.

    Args:
        model_dir: a directory written by ``python -m training.export``.
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
        inputs = read_inputs(model_dir, manifest)
        if variant not in inputs["variants"]:
            raise BadInput(f"{model_dir} has no {variant} model (it has {', '.join(inputs['variants'])})")
        if batch_size <= 0:
            raise BadInput(f"--batch_size must be positive, got {batch_size}")
        entry = inputs["variants"][variant]
        self.model = load_model_file(model_dir, entry["file"], entry["format"], manifest)
        self.batch_size = batch_size
        self.num_dense = int(inputs["num_dense_features"])
        self.table_sizes = np.asarray(inputs["num_embeddings_per_feature"], dtype=np.int64)
        self.sparse_feature_names: List[str] = list(inputs["sparse_feature_names"])
        # Exports before the BYO layout existed were all Criteo, one id per feature.
        self.layout = inputs.get("layout", CRITEO_LAYOUT)
        self.hotness: List[int] = list(inputs.get("sparse_hotness") or [1] * len(self.table_sizes))
        # The table of each column of the sparse input.
        self._column_tables = np.repeat(self.table_sizes, self.hotness)
        self.cardinalities: Optional[List[int]] = inputs.get("cardinalities")
        preprocessing = inputs.get("preprocessing") or {}
        modulo = preprocessing.get("modulo_num_embeddings_per_feature")
        self._modulo = None if modulo is None else np.asarray(modulo, dtype=np.int64)
        self._vocabulary: Optional[List[np.ndarray]] = None
        if preprocessing.get("vocabulary"):
            vocabulary = read_file(model_dir, preprocessing["vocabulary"], manifest)
            try:  # np.load refuses pickled arrays by default
                with np.load(io.BytesIO(vocabulary)) as saved:
                    self._vocabulary = [saved[str(f)] for f in range(len(self.table_sizes))]
            except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
                raise BadInput(f"{os.path.join(model_dir, preprocessing['vocabulary'])}: not the model's "
                                 f"vocabulary ({type(e).__name__}: {e})") from e

    @property
    def num_sparse_columns(self) -> int:
        return int(sum(self.hotness))

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
        if dense.ndim != 2 or dense.shape[1] != self.num_dense:
            raise BadInput(f"dense must have shape (N, {self.num_dense}), got {dense.shape}")
        if sparse.shape != (dense.shape[0], self.num_sparse_columns):
            raise BadInput(f"sparse must have shape ({dense.shape[0]}, {self.num_sparse_columns}), got {sparse.shape}")
        if self.layout == FEATURE_SPEC_LAYOUT:
            bad = self.find_bad_id(sparse)
            if bad is not None:
                raise BadInput(f"row {bad[0]}: {bad[1]}")
        return self._transform(dense, sparse)

    def _transform(self, dense: np.ndarray, sparse: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """`prepare` on inputs already checked."""
        if self.layout == FEATURE_SPEC_LAYOUT:
            # The transcoder stores numerical values as float16: round them the same way.
            dense = dense.astype(np.float16).astype(np.float32)
            ids = sparse.astype(np.int64)
        else:
            ids = transform_sparse(sparse.astype(np.uint32), self._vocabulary, self._modulo).astype(np.int64)
            dense = transform_dense(dense.astype(np.int64))
        return dense, self.ids_in_tables(ids)

    def ids_in_tables(self, ids: np.ndarray) -> np.ndarray:
        """Ids (N, sum of hotness) of the data -> int64 below the table sizes: the training
        loader takes them modulo the table sizes, and so does serving."""
        return np.remainder(np.asarray(ids, dtype=np.int64), self._column_tables)

    def find_bad_id(self, sparse: np.ndarray) -> Optional[Tuple[int, str]]:
        """(row, reason) of the first row of a feature-spec model's ids that the
        transcoder would refuse, or None."""
        start = 0
        found: Optional[Tuple[int, str]] = None
        for f, (name, size) in enumerate(zip(self.sparse_feature_names, self.hotness)):
            cardinality = None if self.cardinalities is None else int(self.cardinalities[f])
            bad = find_bad_id(name, sparse[:, start : start + size], cardinality)
            if bad is not None and (found is None or bad[0] < found[0]):
                found = bad
            start += size
        return found

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

    def is_labelled(self, data: bytes) -> bool:
        """Whether lines carry a label, judged by the first line's field count."""
        first = data.split(b"\n", 1)[0]
        if self.layout == FEATURE_SPEC_LAYOUT:
            return first.count(b",") == self.num_dense + self.num_sparse_columns
        return first.count(b"\t") != NUM_FIELDS - 2

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
            labelled = self.is_labelled(data)
        if self.layout == FEATURE_SPEC_LAYOUT:
            return self._prepare_csv_rows(data, source, first_line, labelled)
        if not labelled:  # give every line a dummy label: one parser for both layouts
            data = b"0\t" + data.replace(b"\n", b"\n0\t")
            data = data[:-2] if data.endswith(b"\n0\t") else data
        chunk = parse_criteo_lines(data)
        if chunk.bad_lines:
            index, reason = chunk.bad_lines[0]
            raise MalformedLineError(f"{source} line {first_line + index}: {_reason(reason, labelled)}")
        return self._transform(chunk.dense_raw, chunk.sparse_hash)

    def _prepare_csv_rows(self, data: bytes, source: str, first_line: int,
                          labelled: bool) -> Tuple[np.ndarray, np.ndarray]:
        width = self.num_dense + self.num_sparse_columns
        features = f"{self.num_dense} numerical, {self.num_sparse_columns} categorical ids"
        lines = data.decode("utf-8", errors="replace").splitlines()
        first_columns = lines[0].count(",") + 1 if lines and lines[0].strip() else None
        if first_line == 1 and first_columns not in (None, width, width + 1):
            raise MalformedLineError(f"{source} line 1: has {first_columns} columns, expected "
                                     f"{width + 1} (label, {features}) or {width} without the label")
        expected = (f"{width + 1} (label, {features}) as the first line" if labelled
                    else f"{width} ({features}, no label) as the first line")
        try:
            rows = parse_csv_rows(lines, first_line, width + labelled, expected)
        except CsvRowsError as e:
            raise MalformedLineError(f"{source} line {e.line}: {e.reason}") from None
        dense, sparse = rows[:, int(labelled) : int(labelled) + self.num_dense], rows[:, int(labelled) + self.num_dense :]
        bad = self.find_bad_id(sparse)
        if bad is not None:
            raise MalformedLineError(f"{source} line {first_line + bad[0]}: {bad[1]}")
        return self._transform(dense, sparse)


def _reason(reason: str, labelled: bool) -> str:
    """The parser's reason, in the terms of the input's own layout."""
    match = re.match(r"expected \d+ tab-separated fields, found (\d+)", reason)
    if match:
        found = int(match.group(1)) - (not labelled)
        return (f"expected {NUM_FIELDS} tab-separated fields (label, {NUM_INT} integer, {NUM_CAT} categorical) "
                f"or {NUM_FIELDS - 1} without the label, found {found}")
    return reason


def predict_file(predictor: Predictor, path: str, out: TextIO, chunk_bytes: int = 1 << 22) -> int:
    """Writes one probability per line of ``path`` to ``out``; returns the line count."""
    if not os.path.exists(path):
        raise BadInput(f"--input {path}: no such file")
    lines = 0
    labelled = None  # decided once, by the file's first line
    for first_line, _, data in iter_line_chunks(DaySource(0, path), chunk_bytes):
        labelled = predictor.is_labelled(data) if labelled is None else labelled
        probabilities = predictor.predict_lines(data, path, first_line + 1, labelled)
        out.write("".join(f"{p:.7g}\n" for p in probabilities))
        lines += len(probabilities)
    return lines


PROG = "python -m training.predict"


@cli_main(PROG)
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a directory written by python -m training.export")
    parser.add_argument("--input", required=True,
                        help="raw Criteo lines (.tsv/.txt), or BYO CSV rows for a --dataset_path model; or .gz")
    parser.add_argument("--output", default=None, help="one probability per line (default stdout)")
    parser.add_argument("--variant", choices=VARIANTS, default="fp32", help="which exported model to use")
    parser.add_argument("--batch_size", type=int, default=4096, help="rows per forward")
    args = parser.parse_args(argv)
    predictor = Predictor(args.model, args.variant, args.batch_size)
    if args.output is None:
        predict_file(predictor, args.input, sys.stdout)
    else:
        with atomic_path(args.output) as tmp, open(tmp, "w") as out:
            predict_file(predictor, args.input, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
