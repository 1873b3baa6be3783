"""Click probabilities for raw Criteo lines, BYO CSV rows or Parquet, from an exported model directory.

    python -m serving.predict --model MODEL_DIR --input day_23.tsv|rows.csv|x.parquet|DIR
        [--output preds.csv|preds.parquet] [--variant fp32|fp16|int8|fp32_aoti|...] [--trust_native_code]
        [--base BASE_DIR]
        [--batch_size 4096]
        [--metrics_output metrics.json] [--keep_columns label,user_id]

The input layout is the model's (inputs.json "layout"; serving/layouts/):

- Models trained on Criteo's binary layout read raw Criteo lines (plain or .gz),
  tab-separated: label, 13 integer features, 26 hexadecimal hashes (40 fields), or the
  same without the label (39 fields, as Criteo's unlabeled test files); any feature may
  be empty. The transforms are preprocessing's (data/preprocess/criteo_transforms.py): dense
  log(max(x, 0) + 3), hashes through the vocabulary or the low 31 bits, modulo the
  table sizes.
- Models trained with --dataset_path (a feature spec) read BYO CSV rows (plain or
  .gz): headerless, comma-separated, the label (optional), the numerical features, then
  the categorical ids, each feature in its channel_spec order and a feature of hotness
  k taking k columns (``ModelInputs.csv_columns``). The transforms are the transcoder's:
  numerical values rounded to float16, ids modulo the table sizes. An id at or above
  its feature's cardinality (never in the training data) is counted as unseen and
  taken modulo its table size like any id beyond its table in training.
- Models trained with --parquet_path read Parquet (a file, a directory with Hive
  partitions, a glob or a URL, as --parquet_path), one row group at a time, and write
  --output as Parquet: the --keep_columns (any input columns), then ``probability``
  (`predict_parquet`). The columns are converted by the training's own
  `data.parquet.columns.ParquetColumns` (transform, id hashing); a bad value stops
  the run naming the file, row group, row and column. An --input named ``.json`` or
  ``.jsonl`` (plain or .gz) holds JSON objects keyed by column name, one a line, as
  the HTTP endpoint takes them, and gets one probability a line. A model with history
  features (--sequence_columns) reads each history from its list column (a JSON list
  of raw ids, oldest first), hashed as its item column, its newest max_history kept.

MODEL_DIR may be a delta export (``serving.export --delta_from``): its rows are applied
onto its base, found where the delta records it or at ``--base`` (serving/delta.py).

Whether lines carry the label is judged by the first line's field count. Output: one
probability per input line, in order (stdout without --output); with --keep_columns, a
CSV with a header line: the named input columns (the label for Criteo lines; any of
``csv_columns`` for CSV rows), then ``probability``. On labelled lines the run scores
them with the trainer's figures (AUROC, log loss, accuracy, NE, calibration:
common/click_metrics.py), printed on stderr in one summary line with the unseen ids,
and written as JSON by --metrics_output (`PredictMetrics`). A malformed line stops
the run with its line number (exit 2); outputs are written under a temporary name
and renamed when complete, so nothing partial is left. An output that would replace
what the run reads (the input, a file of the model directory) or whose suffix names
another format than the one written is refused before anything is written
(`check_outputs`).

Python API::

    predictor = Predictor("model_dir")
    probabilities = predictor.predict(dense, sparse)  # Criteo: (N, 13) ints, (N, 26) uint32 hashes
"""

import argparse
import functools
import math
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TextIO

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from torchmetrics.classification import BinaryAUROC

from common.atomic import atomic_path
from common.cli import run_cli
from common.click_metrics import summary_figures
from common.config_flags import flag
from common.errors import BadInput
from common.json_fields import BOOLEAN, COUNTS, INTEGER, NUMBER, SHARES, TEXT, JsonObject, optional, versioned_json
from data.parquet.files import check_same_types, file_schema, list_files, read_footers, read_row_group
from data.text.text_lines import DaySource, iter_line_chunks
from serving.cli import MODEL_DIR_HELP, parse_config, serving_parser
from serving.delta import apply_sketch_delta, find_base, is_delta, load_delta_program, read_delta
from serving.layouts import load_layout
from serving.layouts.base import CountedLines, InputLayout, ParsedLines
from serving.layouts.parquet_rows import ParquetRows
from serving.model_files import MANIFEST_FILE, TRUST_FLAG, load_model_file, read_manifest
from serving.model_inputs import PADDING_ID, VARIANTS, HistoryInput, read_inputs

# What --base says in each serving command's --help.
BASE_HELP = (
    "a --model that is a delta export: the full export it applies to, when not where the delta records it "
    "(refused unless it is that export)"
)
# What --trust_native_code says in each serving command's --help.
TRUST_HELP = (
    "load AOTInductor packages (the *_aoti variants): compiled native code that runs when loaded, so only "
    "from a model directory you trust; without it only the code-free variants load"
)


class Predictor:
    """Loads one variant of an exported model and predicts click probabilities.

    Args:
        model_dir: a directory written by ``python -m serving.export``.
        variant: fp32 (the torch.export program), fp16 or int8 (quantized tables), or
            one of them compiled by AOTInductor (fp32_aoti, fp16_aoti, int8_aoti).
        batch_size: rows per forward.
        trust_native_code: load an AOTInductor variant (its compiled code runs);
            without it such a variant is refused (`NativeCodeRefused`).
        base: where the full export a delta export (``model_dir``) applies to is, when
            not where the delta records it (serving/delta.py); refused unless it is
            that export (its manifest's digest).

    Example::

        predictor = Predictor("model_dir", variant="int8")
        p = predictor.predict(np.zeros((2, 13), np.int64), np.zeros((2, 26), np.uint32))
        p = predictor.predict_lines(b"1\t5\t...\n")  # or CSV rows, for a feature-spec model
    """

    def __init__(
        self,
        model_dir: str,
        variant: str = "fp32",
        batch_size: int = 4096,
        trust_native_code: bool = False,
        base: str | None = None,
    ) -> None:
        if not os.path.isdir(model_dir):
            raise BadInput(f"--model {model_dir}: no such directory")
        manifest = read_manifest(model_dir)
        delta = read_delta(model_dir, manifest) if is_delta(model_dir) else None
        if delta is not None and manifest is None:
            raise BadInput(f"--model {model_dir}: a delta export without its {MANIFEST_FILE} (damaged?)")
        if delta is None and base is not None:
            raise BadInput(f"--base {base}: --model {model_dir} is a full export, not a delta to apply to a base")
        self.inputs = read_inputs(model_dir, manifest)
        if variant not in self.inputs.variants:
            raise BadInput(f"{model_dir} has no {variant} model (it has {', '.join(self.inputs.variants)})")
        if batch_size <= 0:
            raise BadInput(f"--batch_size must be positive, got {batch_size}")
        entry = self.inputs.variants[variant]
        # The directory whose files the layout reads (a vocabulary): a delta's base's.
        layout_dir, layout_manifest = model_dir, manifest
        self.base: str | None = None  # a delta's base, as found
        if delta is not None:
            found = find_base(model_dir, delta, self.inputs, base)
            self.model = load_delta_program(model_dir, manifest, delta, self.inputs, variant, found).module()
            layout_dir, layout_manifest, self.base = found.path, found.manifest, found.path
        else:
            self.model = load_model_file(
                model_dir, entry.file, entry.format, manifest, self.inputs.input_columns(), trust_native_code
            )
        self.batch_size = batch_size
        self.layout: InputLayout = load_layout(self.inputs, layout_dir, layout_manifest)
        histories = self.inputs.histories
        if histories and not self.layout.HISTORIES:
            raise BadInput(
                f"--model {model_dir}: a model with history features ({', '.join(h.name for h in histories)}), "
                f"whose input layout ({self.inputs.layout}) has no place for them: serving reads histories from "
                "a Parquet model's rows (JSON lists, Parquet list columns); call its programs with history_values "
                "and history_lengths (docs/serving.md)"
            )
        if delta is not None:  # the model's own files (its seen-id filters) are the delta's, not its base's
            changes = None
            if delta.sketch_changes:  # only the filters' changes: set in the base's
                changes = functools.partial(apply_sketch_delta, model_dir, manifest)
            self.layout.read_own_files(model_dir, manifest, changes)
        self.table_sizes = np.asarray(self.inputs.num_embeddings_per_feature, dtype=np.int64)
        items = [self.inputs.sparse_feature_names.index(h.item) for h in histories]
        places = [*self.inputs.sparse_hotness, *(h.max_history for h in histories)]
        # The table of each column of the sparse input (a history's: its item's), and the
        # feature whose ids it counts (the categorical features, then the histories).
        self._column_tables = np.repeat(np.concatenate([self.table_sizes, self.table_sizes[items]]), places)
        self._column_feature = np.repeat(np.arange(len(places)), places)
        self._candidate_columns = int(sum(self.inputs.sparse_hotness))
        self._num_counted = len(places)
        # Ids read so far per counted feature: the denominators of the unseen shares.
        self.ids_read = np.zeros(self._num_counted, np.int64)

    def count_ids(self, sparse: np.ndarray) -> np.ndarray:
        """Per categorical feature, the ids of ``sparse`` (padding left out); added to `ids_read`."""
        present = np.asarray(sparse) != PADDING_ID
        counts = np.bincount(
            np.broadcast_to(self._column_feature, present.shape)[present], minlength=self._num_counted
        ).astype(np.int64)
        self.ids_read += counts
        return counts

    def unseen_shares(self, unseen: np.ndarray, ids: np.ndarray) -> dict[str, float]:
        """{feature: share of its ids that are unseen} of the features with unseen ids."""
        return {
            name: float(n) / float(total)
            for name, n, total in zip(self.inputs.counted_feature_names, unseen, ids)
            if n and total
        }

    def prepare(self, dense: np.ndarray, sparse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Features as the data gives them -> the model's inputs, with the training data's transforms.

        Args:
            dense: (N, num_dense). Criteo: integer features as in the raw lines, missing
                ones as 0. Feature spec: the numerical values as in the CSV rows.
            sparse: (N, sum of hotness). Criteo: hashes as unsigned 32-bit integers,
                missing as 0. Feature spec: ids, feature f in hotness[f] columns. A
                model with history features: then each history's max_history places,
                its newest ids oldest first, `PADDING_ID` after them (`InputLayout.HISTORIES`).

        Returns:
            dense (N, num_dense) float32 and ids (N, sum of hotness) int64 below the table sizes.

        Raises BadInput on wrong shapes, and for a feature-spec model on an id that is not
        an integer from 0 to 2^31 - 1 (naming the row).
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

    def _transform(self, dense: np.ndarray, sparse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`prepare` on inputs already checked."""
        dense, ids = self.layout.transform(dense, sparse)
        return dense, self.ids_in_tables(ids)

    def ids_in_tables(self, ids: np.ndarray) -> np.ndarray:
        """Ids (N, sum of hotness) of the data -> int64 below the table sizes: the training
        loader takes them modulo the table sizes, and so does serving (a padded model's
        `PADDING_ID` stays as it is)."""
        ids = np.asarray(ids, dtype=np.int64)
        in_tables = np.remainder(ids, self._column_tables)
        padded = self.inputs.padded or self.inputs.histories  # a history's empty places
        return np.where(ids == PADDING_ID, PADDING_ID, in_tables) if padded else in_tables

    def predict(self, dense: np.ndarray, sparse: np.ndarray) -> np.ndarray:
        """Probabilities (N,) float32 from the data's features (see `prepare`)."""
        return self.predict_transformed(*self.prepare(dense, sparse))

    def predict_transformed(self, dense: np.ndarray, sparse_ids: np.ndarray) -> np.ndarray:
        """Probabilities (N,) from inputs already in the training layout: dense
        (N, num_dense) float32 transformed, sparse_ids (N, sum of hotness) ids below the
        table sizes."""
        dense_t = torch.as_tensor(np.ascontiguousarray(dense, dtype=np.float32))
        sparse_ids = np.asarray(sparse_ids, dtype=np.int64)
        sparse_t = torch.as_tensor(np.ascontiguousarray(sparse_ids[:, : self._candidate_columns]))
        out = []
        with torch.no_grad():
            for start in range(0, len(dense_t), self.batch_size):
                stop = start + self.batch_size
                inputs = [dense_t[start:stop], sparse_t[start:stop]]
                if self.inputs.histories:
                    inputs += jagged_histories(sparse_ids[start:stop, self._candidate_columns :], self.inputs.histories)
                out.append(self.model(*inputs).float().numpy())
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def predict_lines(
        self, data: bytes, source: str = "<input>", first_line: int = 1, labelled: bool | None = None
    ) -> np.ndarray:
        """Probabilities of whole input lines (see `prepare_lines`)."""
        return self.predict_transformed(*self.prepare_lines(data, source, first_line, labelled))

    def prepare_lines(
        self, data: bytes, source: str = "<input>", first_line: int = 1, labelled: bool | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The model's inputs for whole lines in the model's input layout (raw Criteo
        lines or BYO CSV rows, labelled or not; see the module docstring).

        Args:
            data: whole lines.
            source, first_line: the file and 1-based number of the first line, for errors.
            labelled: whether lines start with a label (None: judged by the first line).

        Raises MalformedLineError naming ``source`` and the line number of the first bad line.
        """
        prepared = self.read_lines(data, source, first_line, labelled)
        return prepared.dense, prepared.ids

    def read_lines(
        self,
        data: bytes,
        source: str = "<input>",
        first_line: int = 1,
        labelled: bool | None = None,
        missing_as_null: bool = False,
    ) -> "PreparedLines":
        """`prepare_lines`, with the labels and the count of unseen ids of each feature.
        ``missing_as_null``: a Parquet model's JSON rows may leave columns out, read as
        null (`ParquetRows.parse`; only when the caller asks for it explicitly)."""
        if labelled is None:
            labelled = self.layout.is_labelled(data)
        if missing_as_null:
            if not isinstance(self.layout, ParquetRows):
                raise BadInput("missing columns read as null only in a Parquet model's JSON rows")
            lines = self.layout.parse(data, source, first_line, labelled, missing_as_null=True)
        else:
            lines = self.layout.parse(data, source, first_line, labelled)
        dense, ids = self._transform(lines.dense, lines.sparse)
        unseen = lines.unseen if isinstance(lines, CountedLines) else self.layout.count_unseen(lines.sparse)
        return PreparedLines(dense, ids, lines, unseen, self.count_ids(lines.sparse))

    def unseen_by_feature(self, counts: np.ndarray) -> dict[str, int]:
        """Per-feature counts of unseen ids -> {feature name: count} of those above 0."""
        return {name: int(n) for name, n in zip(self.inputs.counted_feature_names, counts) if n}


def jagged_histories(places: np.ndarray, histories: list[HistoryInput]) -> list[torch.Tensor]:
    """The programs' history inputs (`HISTORY_INPUTS`) of rows whose histories take
    ``max_history`` places each, `PADDING_ID` after their ids ((N, sum of max_history)):
    every id, row by row and within a row history by history, and the lengths (N, S)."""
    ends = np.cumsum([h.max_history for h in histories])
    present = places != PADDING_ID
    lengths = np.stack([block.sum(axis=1) for block in np.split(present, ends[:-1], axis=1)], axis=1)
    return [torch.as_tensor(places[present]), torch.as_tensor(lengths.astype(np.int64))]


@dataclass
class PreparedLines:
    """Whole input lines, ready for the model.

    Args:
        dense, ids: the model's inputs (see `Predictor.prepare`).
        lines: the features and labels as the lines give them.
        unseen: per categorical feature, the ids no training row held.
        id_counts: per categorical feature, the ids of the lines.
    """

    dense: np.ndarray
    ids: np.ndarray
    lines: ParsedLines
    unseen: np.ndarray
    id_counts: np.ndarray


class LabelledScores:
    """The trainer's evaluation figures for probabilities of labelled rows: AUROC
    (torchmetrics' exact BinaryAUROC, as training/metrics.py) and the figures of
    common/click_metrics.py from sums over the rows.

    Example::

        scores = LabelledScores()
        scores.update(probabilities, labels)
        scores.compute()  # {"auroc": ..., "log_loss": ..., "ne": ..., "calibration": ..., "num_samples": ...}
    """

    def __init__(self) -> None:
        self._auroc = BinaryAUROC()
        self._sums = np.zeros(5, np.float64)  # as summary_figures takes them

    def update(self, probabilities: np.ndarray, labels: np.ndarray) -> None:
        p = torch.as_tensor(np.asarray(probabilities, np.float32))
        y = torch.as_tensor(np.asarray(labels)).reshape(-1)
        self._auroc.update(p, y.int())
        target = y.double()
        self._sums += [
            F.binary_cross_entropy(p.double(), target, reduction="sum").item(),
            ((p >= 0.5).double() == target).sum().item(),
            len(p),
            p.double().sum().item(),
            target.sum().item(),
        ]

    def compute(self) -> dict[str, float]:
        samples = int(self._sums[2])
        auroc = float(self._auroc.compute().item()) if samples else float("nan")
        return {"auroc": auroc, **summary_figures(*self._sums.tolist()), "num_samples": samples}


@dataclass
class PredictMetrics:
    """What ``python -m serving.predict --metrics_output`` writes: the input's size, its
    unseen ids and, for labelled input, the figures of `LabelledScores` (null when not
    labelled, or when undefined: NE of a single class, calibration without clicks).

    Version 1. Read back with `read_predict_metrics`.
    """

    model: str
    variant: str
    input: str
    rows: int
    labelled: bool
    auroc: float | None
    log_loss: float | None
    accuracy: float | None
    ne: float | None
    calibration: float | None
    positive_rate: float | None
    unseen_ids: int
    unseen_ids_by_feature: dict[str, int] = field(default_factory=dict)
    # Of each feature with unseen ids, their share of its ids (a hashed model counts
    # them with its training split's Bloom filter: docs/serving.md).
    unseen_share_by_feature: dict[str, float] = field(default_factory=dict)
    version: int = 1

    FIGURES = ("auroc", "log_loss", "accuracy", "ne", "calibration", "positive_rate")

    def summary(self) -> str:
        """The one line predict prints on stderr."""
        words = [f"{self.rows} rows"]
        if self.labelled:
            words.append(
                ", ".join(
                    f"{name} {getattr(self, name):.6g}" if getattr(self, name) is not None else f"{name} n/a"
                    for name in self.FIGURES
                )
            )
        if self.unseen_share_by_feature:
            words.append(
                "unseen share " + ", ".join(f"{name} {s:.2%}" for name, s in self.unseen_share_by_feature.items())
            )
        by_feature = ", ".join(f"{name} {n}" for name, n in self.unseen_ids_by_feature.items())
        words.append(f"unseen ids {self.unseen_ids}" + (f" ({by_feature})" if by_feature else ""))
        return "; ".join(words)


def _number(value: float) -> str:
    """An input column's value as the input would write it (an id without ``.0``)."""
    return np.format_float_positional(value, trim="-")


def predict_file(
    predictor: Predictor, path: str, out: TextIO, chunk_bytes: int = 1 << 22, keep_columns: Sequence[str] = ()
) -> tuple[int, LabelledScores | None, np.ndarray]:
    """Writes one probability per line of ``path`` to ``out`` (after the ``keep_columns``
    of the line, as CSV with a header, when some are named).

    Returns the line count, the scores of labelled lines (None for unlabelled input)
    and the unseen ids per feature.
    """
    if not os.path.exists(path):
        raise BadInput(f"--input {path}: no such file")
    rows = 0
    labelled = None  # decided once, by the file's first line
    scores = LabelledScores()
    unseen = np.zeros(len(predictor.inputs.counted_feature_names), np.int64)
    if keep_columns:
        out.write(",".join([*keep_columns, "probability"]) + "\n")
    for first_line, _, data in iter_line_chunks(DaySource(0, path), chunk_bytes):
        labelled = predictor.layout.is_labelled(data) if labelled is None else labelled
        prepared = predictor.read_lines(data, path, first_line + 1, labelled)
        probabilities = predictor.predict_transformed(prepared.dense, prepared.ids)
        if keep_columns:
            kept = predictor.layout.columns(prepared.lines, list(keep_columns))
            out.write("".join(",".join([*map(_number, row), f"{p:.7g}"]) + "\n" for row, p in zip(kept, probabilities)))
        else:
            out.write("".join(f"{p:.7g}\n" for p in probabilities))
        if labelled:
            scores.update(probabilities, prepared.lines.labels)
        unseen += prepared.unseen
        rows += len(probabilities)
    return rows, scores if labelled else None, unseen


PROBABILITY_COLUMN = "probability"


class ParquetInput:
    """A Parquet table (a file, a directory whose Hive partitions become columns, a glob
    or a URL, as --parquet_path) opened for a model's `ParquetRows` layout: every file's
    schema checked against the model's columns, then read one row group at a time.
    Labelled when it has the label column. Predict and the quality gate read Parquet
    through it.

    Args:
        layout: the model's layout.
        path: the table; ``flag`` names it in errors.
        keep_columns: input columns read besides the model's (predict's --keep_columns).
    """

    def __init__(self, layout: ParquetRows, path: str, flag: str, keep_columns: Sequence[str] = ()) -> None:
        self.layout = layout
        self.filesystem, root, self.files = list_files(path, flag)
        self.footers, metadata, self.schema = read_footers(self.filesystem, root, self.files)
        self.label: str = layout.columns.label
        self.labelled = self.label in self.schema.names
        missing = [name for name in keep_columns if name not in self.schema.names]
        if missing:
            raise BadInput(
                f"--keep_columns {','.join(missing)}: not a column of {flag} {path} "
                f"(it has {', '.join(self.schema.names)})"
            )
        columns = layout.columns
        self.read = list(
            dict.fromkeys(
                [
                    *((columns.label,) if self.labelled else ()),
                    *columns.dense,
                    *columns.sparse,
                    *layout.history_names,
                    *keep_columns,
                ]
            )
        )
        for footer, meta in zip(self.footers, metadata):
            layout.check_schema(file_schema(footer, meta, self.schema), footer.path, self.labelled)
        check_same_types(self.footers, metadata, self.schema, self.read)

    def row_groups(self) -> Iterator[tuple[pa.Table, ParsedLines]]:
        """(the row group's columns, the model's inputs of its rows), one row group at a
        time; a bad value stops at its file, row group, row and column."""
        for footer in self.footers:
            for group in range(len(footer.row_group_rows)):
                table = read_row_group(self.filesystem, footer, self.schema, group, self.read)
                yield (
                    table,
                    self.layout.prepare_table(
                        table,
                        lambda row, file=footer.path, group=group: f"{file} row group {group} row {row}",
                        self.labelled,
                    ),
                )


def predict_parquet(
    predictor: Predictor, path: str, output: str, keep_columns: Sequence[str] = (), final_output: str | None = None
) -> tuple[int, LabelledScores | None, np.ndarray]:
    """Writes ``output`` (Parquet): the ``keep_columns`` of each row of the Parquet
    table ``path`` (`ParquetInput`), then its probability; reads one row group at a time.
    ``final_output`` (the name ``output`` will take) is refused when it is one of the
    table's local files.

    Returns the row count, the scores of labelled rows (None for unlabelled input)
    and the unseen ids per feature (those the model's seen-id filters lack; none in a
    model exported without them).
    """
    layout = predictor.layout
    assert isinstance(layout, ParquetRows)
    if PROBABILITY_COLUMN in keep_columns:
        raise BadInput(f"--keep_columns {PROBABILITY_COLUMN}: the output's own column")
    source = ParquetInput(layout, path, "--input", keep_columns)
    if (
        final_output is not None
        and isinstance(source.filesystem, pafs.LocalFileSystem)
        and os.path.exists(final_output)
    ):
        same = [file for file in source.files if os.path.exists(file) and os.path.samefile(file, final_output)]
        if same:
            raise BadInput(
                f"--output {final_output} is {same[0]}, a file of --input {path}: writing it would replace the input"
            )
    out_schema = pa.schema(
        [source.schema.field(name) for name in keep_columns] + [pa.field(PROBABILITY_COLUMN, pa.float32())]
    )
    rows, scores = 0, LabelledScores()
    unseen = np.zeros(len(predictor.inputs.counted_feature_names), np.int64)
    with pq.ParquetWriter(output, out_schema) as writer:
        for table, prepared in source.row_groups():
            probabilities = predictor.predict_transformed(prepared.dense, prepared.sparse)
            writer.write_table(
                pa.Table.from_arrays(
                    [*(table.column(name) for name in keep_columns), pa.array(probabilities, pa.float32())],
                    schema=out_schema,
                )
            )
            if source.labelled:
                scores.update(probabilities, prepared.labels)
            if isinstance(prepared, CountedLines):
                unseen += prepared.unseen
            predictor.count_ids(prepared.sparse)
            rows += len(probabilities)
    return rows, scores if source.labelled else None, unseen


def read_predict_metrics(path: str) -> PredictMetrics:
    """A --metrics_output file, every field checked (FileFieldError naming the field)."""
    with open(path, "rb") as f:
        document, _ = JsonObject.versioned(f.read(), path, "serving.predict's metrics", current=1)
    return PredictMetrics(
        model=document.get("model", TEXT),
        variant=document.get("variant", TEXT),
        input=document.get("input", TEXT),
        rows=document.get("rows", INTEGER),
        labelled=document.get("labelled", BOOLEAN),
        **{name: document.get(name, optional(NUMBER)) for name in PredictMetrics.FIGURES},
        unseen_ids=document.get("unseen_ids", INTEGER),
        unseen_ids_by_feature=document.get("unseen_ids_by_feature", COUNTS),
        unseen_share_by_feature=document.get("unseen_share_by_feature", SHARES, {}),
    )


def column_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated column names, got {text!r}")
    return names


@dataclass(kw_only=True)
class PredictConfig:
    """What ``python -m serving.predict`` reads, runs and writes."""

    model: str = flag(help=MODEL_DIR_HELP)
    base: str | None = flag(None, help=BASE_HELP)
    input: str = flag(
        help="raw Criteo lines (.tsv/.txt), or BYO CSV rows for a --dataset_path model; or .gz; "
        "Parquet (file, directory, glob, URL) for a --parquet_path model"
    )
    output: str | None = flag(
        None, help="one probability per line (default stdout); Parquet for a --parquet_path model (required)"
    )
    variant: str = flag("fp32", choices=VARIANTS, help="which exported model to use")
    trust_native_code: bool = flag(False, name=TRUST_FLAG.removeprefix("--"), help=TRUST_HELP)
    batch_size: int = flag(4096, help="rows per forward")
    metrics_output: str | None = flag(
        None, help="JSON file for the rows, unseen ids and (labelled input) AUROC, log loss, NE, calibration"
    )
    keep_columns: Sequence[str] = flag(
        (),
        parse=column_list,
        help="input columns written before each probability, comma-separated: label "
        "for Criteo lines; names of the model's CSV columns for CSV rows (output "
        "becomes CSV); any input columns for Parquet",
    )


def file_metrics(
    predictor: Predictor, args: PredictConfig, rows: int, scores: LabelledScores | None, unseen: np.ndarray
) -> PredictMetrics:
    """The metrics of one predict run (figures that are NaN become null: JSON has no NaN)."""
    figures = scores.compute() if scores is not None else {}
    defined = {
        name: (None if name not in figures or math.isnan(figures[name]) else figures[name])
        for name in PredictMetrics.FIGURES
    }
    return PredictMetrics(
        model=args.model,
        variant=args.variant,
        input=args.input,
        rows=rows,
        labelled=scores is not None,
        **defined,
        unseen_ids=int(unseen.sum()),
        unseen_ids_by_feature=predictor.unseen_by_feature(unseen),
        unseen_share_by_feature=predictor.unseen_shares(unseen, predictor.ids_read),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    parser = serving_parser("predict", __doc__)
    (config,) = parse_config(parser, [PredictConfig], argv)
    return run_cli(lambda: _predict(config, parser.prog), parser.prog)


# The format a file name's suffix promises, for the suffixes a reader would go by.
_SUFFIX_FORMATS = {
    ".parquet": "Parquet",
    ".pq": "Parquet",
    ".csv": "text",
    ".tsv": "text",
    ".txt": "text",
    ".json": "JSON",
    ".jsonl": "JSON",
    ".gz": "gzip",
    ".bz2": "bzip2",
    ".xz": "xz",
    ".zst": "zstd",
    ".zip": "zip",
    ".npy": "NumPy",
    ".npz": "NumPy",
    ".pt2": "a model",
    ".pt": "a model",
}
_FORMAT_WORDS = {
    "Parquet": ("Parquet", ".parquet"),
    "text": ("text (one probability per line, or CSV)", ".csv"),
    "JSON": ("JSON", ".json"),
}


def check_output_suffix(output: str, fmt: str, flag: str = "--output") -> None:
    """Refuses a file name whose suffix promises another format than ``fmt`` (Parquet,
    text or JSON), which is what will be written: a reader goes by the name. A name
    without a known suffix is taken as it is."""
    suffix = os.path.splitext(output)[1].lower()
    promised = _SUFFIX_FORMATS.get(suffix)
    if promised is not None and promised != fmt:
        words, good = _FORMAT_WORDS[fmt]
        stem = os.path.splitext(output)[0]
        raise BadInput(
            f"{flag} {output}: a {suffix} name, but {flag} is written as {words}: name it "
            f"{stem if stem.endswith(good) else stem + good}"
        )


def _inside(path: str, directory: str) -> bool:
    """Whether the resolved ``path`` is ``directory`` or below it (both resolved)."""
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def check_output(output: str, input_path: str, flag: str = "--output", model_dir: str | None = None) -> None:
    """Refuses, before any work, an output (given as ``flag``) that cannot be written or
    that would replace what the run reads: the --input (the same file under any name: a
    symlink, a hard link), a file of a local --input directory, or anything in the
    --model directory (its model files and vocabulary; paths compared resolved, through
    symlinks and ``..``)."""
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise BadInput(f"{flag} {output}: no such directory {parent}")
    if os.path.isdir(output):
        raise BadInput(f"{flag} {output} is a directory: give the file to write")
    resolved = os.path.realpath(output)
    if model_dir is not None and os.path.isdir(model_dir):
        if _inside(resolved, os.path.realpath(model_dir)):
            raise BadInput(
                f"{flag} {output} is in the --model directory {model_dir}: writing it would change the "
                "model being read; write elsewhere"
            )
        if os.path.exists(output):
            for parent_dir, _, names in os.walk(model_dir):
                for name in names:
                    if os.path.samefile(output, os.path.join(parent_dir, name)):
                        raise BadInput(
                            f"{flag} {output} is {os.path.join(parent_dir, name)} of the --model "
                            "directory (a link to it): writing it would change the model being read"
                        )
    if os.path.isdir(input_path) and _inside(resolved, os.path.realpath(input_path)):
        raise BadInput(
            f"{flag} {output} is in the --input directory {input_path}: it would become part of the "
            "input; write elsewhere"
        )
    if os.path.exists(output) and os.path.exists(input_path) and os.path.samefile(output, input_path):
        raise BadInput(f"{flag} {output} is the --input {input_path}: writing it would replace the input")


def check_outputs(args: "PredictConfig", parquet: bool | None) -> None:
    """`check_output` for --output and --metrics_output, and that they differ; with
    ``parquet`` known (the model's layout), their names' suffixes against the formats
    written (`check_output_suffix`)."""
    for option, output in (("--output", args.output), ("--metrics_output", args.metrics_output)):
        if output is not None:
            check_output(output, args.input, option, args.model)
    if (
        args.output is not None
        and args.metrics_output is not None
        and os.path.realpath(args.output) == os.path.realpath(args.metrics_output)
    ):
        raise BadInput(f"--metrics_output {args.metrics_output} is the --output {args.output}: give two files")
    if parquet is not None:
        if args.output is not None:
            check_output_suffix(args.output, "Parquet" if parquet else "text")
        if args.metrics_output is not None:
            check_output_suffix(args.metrics_output, "JSON", "--metrics_output")


def _predict(args: PredictConfig, prog: str) -> int:
    check_outputs(args, None)  # before the model is read
    predictor = Predictor(args.model, args.variant, args.batch_size, args.trust_native_code, args.base)
    # A Parquet model also scores JSON objects, one a line (as the endpoint's requests), to text.
    parquet = isinstance(predictor.layout, ParquetRows) and not _is_json_lines(args.input)
    check_outputs(args, parquet)  # again: the model was read meanwhile, and it says the format
    if parquet:
        if args.output is None:
            raise BadInput("--output is needed: a model trained on Parquet writes its predictions as Parquet")
        with atomic_path(args.output, suffix=".tmp.parquet") as tmp:
            result = predict_parquet(predictor, args.input, tmp, args.keep_columns, final_output=args.output)
        print(f"wrote {args.output}: {result[0]} probabilities ({args.variant} model {args.model})")
        return _report_metrics(predictor, args, prog, result)
    unknown = [name for name in args.keep_columns if name not in predictor.layout.column_names()]
    if unknown:
        raise BadInput(
            f"--keep_columns {','.join(unknown)}: not a column of this model's input "
            f"(it has {', '.join(predictor.layout.column_names())})"
        )
    if args.output is None:
        result = predict_file(predictor, args.input, sys.stdout, keep_columns=args.keep_columns)
    else:
        with atomic_path(args.output) as tmp, open(tmp, "w") as out:
            result = predict_file(predictor, args.input, out, keep_columns=args.keep_columns)
        print(f"wrote {args.output}: {result[0]} probabilities ({args.variant} model {args.model})")
    return _report_metrics(predictor, args, prog, result)


def _is_json_lines(path: str) -> bool:
    """Whether --input names JSON rows (``.json``, ``.jsonl``, plain or .gz)."""
    return path.lower().removesuffix(".gz").endswith((".json", ".jsonl"))


def _report_metrics(
    predictor: Predictor, args: PredictConfig, prog: str, result: tuple[int, LabelledScores | None, np.ndarray]
) -> int:
    """Writes --metrics_output (when given) and prints the summary line."""
    metrics = file_metrics(predictor, args, *result)
    if args.metrics_output is not None:
        with atomic_path(args.metrics_output) as tmp, open(tmp, "wb") as out:
            out.write(versioned_json(metrics))
    print(f"{prog}: {metrics.summary()}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
