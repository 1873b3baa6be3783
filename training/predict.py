"""Click probabilities for raw Criteo lines, from an exported model directory.

    python -m training.predict --model MODEL_DIR --input day_23.tsv [--output preds.csv]
        [--variant fp32|fp16|int8] [--batch_size 4096]

Input: raw Criteo lines (plain or .gz), tab-separated: label, 13 integer features, 26
hexadecimal hashes (40 fields), or the same without the label (39 fields, as Criteo's
unlabeled test files); any feature may be empty. The transforms are preprocessing's
(data/preprocess_criteo.py): dense log(max(x, 0) + 3), hashes through the vocabulary
or the low 31 bits, modulo the table sizes. Output: one probability per input line,
in order (stdout without --output). A malformed line stops the run with its line
number (exit 2); the output is written under a temporary name and renamed when
complete, so nothing partial is left.

Python API::

    predictor = Predictor("model_dir")
    probabilities = predictor.predict(dense_raw, sparse_hashes)  # (N, 13) ints, (N, 26) uint32
"""

import argparse
import os
import re
import sys
from typing import List, Optional, Sequence, TextIO, Tuple

import numpy as np
import torch

from data.criteo_tsv import NUM_CAT, NUM_FIELDS, NUM_INT, parse_criteo_lines
from data.preprocess_criteo import DaySource, iter_line_chunks, transform_dense, transform_sparse
from training.inference_model import read_inputs

VARIANTS = ("fp32", "fp16", "int8")


class MalformedLineError(ValueError):
    """An input line that is not a Criteo line; the message names the file and line."""


class Predictor:
    """Loads one variant of an exported model and predicts click probabilities.

    Args:
        model_dir: a directory written by ``python -m training.export``.
        variant: fp32 (the torch.export program), fp16 or int8 (quantized tables).
        batch_size: rows per forward.

    Example::

        predictor = Predictor("model_dir", variant="int8")
        p = predictor.predict(np.zeros((2, 13), np.int64), np.zeros((2, 26), np.uint32))
    """

    def __init__(self, model_dir: str, variant: str = "fp32", batch_size: int = 4096) -> None:
        inputs = read_inputs(model_dir)
        if variant not in inputs["variants"]:
            raise ValueError(f"{model_dir} has no {variant} model (it has {', '.join(inputs['variants'])})")
        if batch_size <= 0:
            raise ValueError(f"--batch_size must be positive, got {batch_size}")
        entry = inputs["variants"][variant]
        path = os.path.join(model_dir, entry["file"])
        self.model = (torch.export.load(path).module() if entry["format"] == "torch.export"
                      else torch.jit.load(path))
        self.batch_size = batch_size
        self.num_dense = int(inputs["num_dense_features"])
        self.table_sizes = np.asarray(inputs["num_embeddings_per_feature"], dtype=np.int64)
        preprocessing = inputs["preprocessing"]
        modulo = preprocessing.get("modulo_num_embeddings_per_feature")
        self._modulo = None if modulo is None else np.asarray(modulo, dtype=np.int64)
        self._vocabulary: Optional[List[np.ndarray]] = None
        if preprocessing.get("vocabulary"):
            with np.load(os.path.join(model_dir, preprocessing["vocabulary"])) as saved:
                self._vocabulary = [saved[str(f)] for f in range(len(self.table_sizes))]

    def prepare(self, dense: np.ndarray, sparse: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Raw features -> the model's inputs, with preprocessing's transforms.

        Args:
            dense: (N, 13) integer features as in the raw lines, missing ones as 0.
            sparse: (N, 26) categorical hashes as unsigned 32-bit integers, missing as 0.

        Returns:
            dense (N, 13) float32 and ids (N, 26) int64 below the table sizes.
        """
        dense = np.asarray(dense)
        sparse = np.asarray(sparse)
        if dense.ndim != 2 or dense.shape[1] != self.num_dense:
            raise ValueError(f"dense must have shape (N, {self.num_dense}), got {dense.shape}")
        if sparse.shape != (dense.shape[0], len(self.table_sizes)):
            raise ValueError(f"sparse must have shape ({dense.shape[0]}, {len(self.table_sizes)}), got {sparse.shape}")
        ids = transform_sparse(sparse.astype(np.uint32), self._vocabulary, self._modulo)
        # The training loader takes ids modulo the table sizes: so does serving.
        ids = np.remainder(ids.astype(np.int64), self.table_sizes)
        return transform_dense(dense.astype(np.int64)), ids

    def predict(self, dense: np.ndarray, sparse: np.ndarray) -> np.ndarray:
        """Probabilities (N,) float32 from raw features (see `prepare`)."""
        return self.predict_transformed(*self.prepare(dense, sparse))

    def predict_transformed(self, dense: np.ndarray, sparse_ids: np.ndarray) -> np.ndarray:
        """Probabilities (N,) from inputs already in the training layout: dense
        (N, 13) float32 transformed, sparse_ids (N, 26) ids below the table sizes."""
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
        """Probabilities of whole raw lines (see `prepare_lines`)."""
        return self.predict_transformed(*self.prepare_lines(data, source, first_line, labelled))

    def prepare_lines(self, data: bytes, source: str = "<input>", first_line: int = 1,
                      labelled: Optional[bool] = None) -> Tuple[np.ndarray, np.ndarray]:
        """The model's inputs for whole raw lines (labelled or not; see the module docstring).

        Args:
            data: whole lines.
            source, first_line: the file and 1-based number of the first line, for errors.
            labelled: whether lines start with a label (None: judged by the first line).

        Raises MalformedLineError naming ``source`` and the line number of the first bad line.
        """
        if labelled is None:
            labelled = is_labelled(data)
        if not labelled:  # give every line a dummy label: one parser for both layouts
            data = b"0\t" + data.replace(b"\n", b"\n0\t")
            data = data[:-2] if data.endswith(b"\n0\t") else data
        chunk = parse_criteo_lines(data)
        if chunk.bad_lines:
            index, reason = chunk.bad_lines[0]
            raise MalformedLineError(f"{source} line {first_line + index}: {_reason(reason, labelled)}")
        return self.prepare(chunk.dense_raw, chunk.sparse_hash)


def is_labelled(data: bytes) -> bool:
    """Whether lines carry a label, judged by the first line's field count."""
    first = data.split(b"\n", 1)[0]
    return first.count(b"\t") != NUM_FIELDS - 2


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
        raise ValueError(f"--input {path}: no such file")
    lines = 0
    labelled = None  # decided once, by the file's first line
    for first_line, _, data in iter_line_chunks(DaySource(0, path), chunk_bytes):
        labelled = is_labelled(data) if labelled is None else labelled
        probabilities = predictor.predict_lines(data, path, first_line + 1, labelled)
        out.write("".join(f"{p:.7g}\n" for p in probabilities))
        lines += len(probabilities)
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.predict", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a directory written by python -m training.export")
    parser.add_argument("--input", required=True, help="raw Criteo lines (.tsv/.txt, or .gz)")
    parser.add_argument("--output", default=None, help="one probability per line (default stdout)")
    parser.add_argument("--variant", choices=VARIANTS, default="fp32", help="which exported model to use")
    parser.add_argument("--batch_size", type=int, default=4096, help="rows per forward")
    args = parser.parse_args(argv)
    tmp = None if args.output is None else f"{args.output}.tmp-{os.getpid()}"
    try:
        predictor = Predictor(args.model, args.variant, args.batch_size)
        if tmp is None:
            predict_file(predictor, args.input, sys.stdout)
        else:
            with open(tmp, "w") as out:
                predict_file(predictor, args.input, out)
            os.replace(tmp, args.output)
    except ValueError as e:  # MalformedLineError included
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
