"""CSV chunks of a feature spec -> split_binary files plus the output spec.

    python -m data.transcode --input DIR --feature_spec_in spec.yaml --output DIR

CSV files are headerless and comma-separated; a chunk's columns are its features in
order, a multi-hot feature of hotness k taking k columns. Files are read in blocks of
``--chunk_size`` rows, so memory stays bounded whatever the data size. Everything is
written into a temporary directory next to ``--output`` which then replaces it:
re-running replaces the output instead of appending to it, and a failed run leaves
the previous output untouched. ``cardinality: auto`` becomes the largest id + 1 over
both mappings; a declared cardinality at or below an id in the data is an error, and
so are labels other than 0 or 1, numerical values that are NaN, infinite or beyond
float16's range, and a mapping without rows. A sample-weight column (the spec's
channel_spec weight, or the column ``--weight_column`` names) is stored as float32;
weights that are negative, NaN or infinite are refused.
"""

import itertools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from common.atomic import atomic_dir
from common.cli import OneLineParser, cli_main, positive_int
from common.config_flags import flag, parse_flags
from common.errors import BadInput
from data.binary.feature_spec import AUTO, DEFAULT_SPEC_NAME, Chunk, FeatureSpec, FeatureSpecError, smallest_id_dtype
from data.text.csv_rows import CsvRowsError, find_bad_id, parse_csv_rows

DEFAULT_CHUNK_ROWS = 65536


class TranscodeError(BadInput):
    """Bad input data; the message names the file and line."""


def csv_blocks(path: str, block_rows: int, columns: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first line number, float64 array (rows, columns)) per block of a headerless CSV."""
    with open(path) as f:
        line = 1
        while True:
            lines = list(itertools.islice(f, block_rows))
            if not lines:
                return
            try:
                block = parse_csv_rows(lines, line, columns)
            except CsvRowsError as e:
                raise TranscodeError(f"{path}: line {e.line}: {e.reason}") from e
            yield line, block
            line += len(lines)


class _Columns:
    """Writes one mapping's feature columns to staging files, checking ids as they come."""

    def __init__(self, spec: FeatureSpec, staging: str, mapping: str) -> None:
        self.spec, self.mapping = spec, mapping
        self.dir = os.path.join(staging, mapping)
        os.makedirs(self.dir)
        self.max_id: dict[str, int] = {}
        # Staging files are named by position: feature names need not be valid file names.
        self._index = {
            name: i
            for i, name in enumerate(spec.numerical + spec.categorical + [spec.label] + spec.channel_spec["weight"])
        }
        for name in self._index:
            open(self.part(name), "wb").close()

    def part(self, name: str) -> str:
        return os.path.join(self.dir, f"feature_{self._index[name]}.part")

    def append(self, chunk: Chunk, block: np.ndarray, path: str, line: int) -> None:
        column = 0
        for name in chunk.features:
            channel = self.spec.channel_of(name)
            width = self.spec.hotness(name) if channel == "categorical" else 1
            values = block[:, column : column + width]
            column += width
            if channel == "numerical":
                data = self._numerical(name, values, path, line)
            elif channel == "label":
                bad = np.flatnonzero((values != 0) & (values != 1))
                if bad.size:
                    raise TranscodeError(
                        f"{path}: line {line + bad[0]}: label {name!r} must be 0 or 1, "
                        f"got {values.reshape(-1)[bad[0]]:g}"
                    )
                data = values.astype(np.bool_)
            elif channel == "weight":
                data = self._weights(name, values, path, line)
            else:
                data = self._ids(name, values, path, line)
            with open(self.part(name), "ab") as f:
                f.write(np.ascontiguousarray(data).tobytes())

    @staticmethod
    def _numerical(name: str, values: np.ndarray, path: str, line: int) -> np.ndarray:
        """float16 values; NaN, infinity and values beyond float16's range are refused."""
        with np.errstate(over="ignore"):  # an overflow is reported below, with its line
            data = values.astype(np.float16)
        bad = np.flatnonzero(~np.isfinite(data).reshape(-1))
        if bad.size:
            value = float(values.reshape(-1)[bad[0]])
            why = (
                f"is {value}; numerical values must be finite"
                if not np.isfinite(value)
                else f"is {value:g}, beyond float16's range (+-{float(np.finfo(np.float16).max):g}) "
                "that split_binary stores"
            )
            raise TranscodeError(f"{path}: line {line + bad[0]}: feature {name!r} {why}")
        return data

    @staticmethod
    def _weights(name: str, values: np.ndarray, path: str, line: int) -> np.ndarray:
        """float32 weights; negative, NaN and infinite ones (or beyond float32) are refused."""
        with np.errstate(over="ignore"):  # an overflow is reported below, with its line
            data = values.astype(np.float32)
        bad = np.flatnonzero(~np.isfinite(data).reshape(-1) | (data.reshape(-1) < 0))
        if bad.size:
            value = float(values.reshape(-1)[bad[0]])
            raise TranscodeError(
                f"{path}: line {line + bad[0]}: weight {name!r} is {value}; "
                "weights must be finite float32 values, not negative"
            )
        return data

    def _ids(self, name: str, values: np.ndarray, path: str, line: int) -> np.ndarray:
        declared = self.spec.feature_spec[name]["cardinality"]
        bad = find_bad_id(name, values, None if declared == AUTO else int(declared))
        if bad is not None:
            raise TranscodeError(f"{path}: line {line + bad[0]}: {bad[1]}")
        if values.size:
            self.max_id[name] = max(self.max_id.get(name, -1), int(values.max()))
        return values.astype(np.int32)


def _read_mapping(spec: FeatureSpec, input_dir: str, mapping: str, columns: _Columns, block_rows: int) -> int:
    """Streams every CSV chunk of a mapping into staging files; returns its row count."""
    rows: int | None = None
    for i, chunk in enumerate(spec.source_spec[mapping]):
        if chunk.type != "csv":
            raise FeatureSpecError(
                f"{spec.path}: source_spec {mapping} chunk {i} is {chunk.type}; the transcoder reads csv chunks"
            )
        width = sum(spec.hotness(n) if spec.channel_of(n) == "categorical" else 1 for n in chunk.features)
        count = 0
        for relative in chunk.files:
            path = os.path.join(input_dir, relative)
            if not os.path.isfile(path):
                raise FeatureSpecError(f"{spec.path}: file {relative} of source_spec {mapping} is missing ({path})")
            for line, block in csv_blocks(path, block_rows, width):
                columns.append(chunk, block, path, line)
                count += block.shape[0]
        if count == 0:
            raise TranscodeError(f"{spec.path}: source_spec {mapping} chunk {i}: its files hold no rows")
        if rows is not None and count != rows:
            raise FeatureSpecError(
                f"{spec.path}: source_spec {mapping} chunk {i} files hold {count} rows but chunk 0 files hold {rows}"
            )
        rows = count
    return rows or 0


def _copy_converted(src: str, dst: str, dtype: np.dtype, row_width: int, out_dtype: np.dtype, block_rows: int) -> None:
    """Rewrites a staging file in another dtype, block by block."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while True:
            raw = fin.read(block_rows * row_width * dtype.itemsize)
            if not raw:
                break
            fout.write(np.frombuffer(raw, dtype=dtype).astype(out_dtype).tobytes())


def _interleave(parts: list[str], dst: str, rows: int, block_rows: int) -> None:
    """Writes float16 columns (one staging file each) as one (rows, len(parts)) file."""
    arrays = [np.memmap(p, dtype=np.float16, mode="r") if rows else np.zeros(0, np.float16) for p in parts]
    with open(dst, "wb") as fout:
        for start in range(0, rows, block_rows):
            fout.write(np.stack([a[start : start + block_rows] for a in arrays], axis=1).tobytes())


def transcode(
    input_dir: str,
    spec_in: str,
    output_dir: str,
    spec_out: str = DEFAULT_SPEC_NAME,
    block_rows: int = DEFAULT_CHUNK_ROWS,
    weight_column: str | None = None,
) -> FeatureSpec:
    """Transcodes the CSV data set a spec describes into split_binary files.

    Args:
        input_dir: the CSV files' paths in the spec are relative to it.
        spec_in: the input spec (a path, or a name inside input_dir).
        output_dir: replaced by train/, test/ and the output spec.
        spec_out: file name of the output spec inside output_dir.
        block_rows: rows read and written at a time.
        weight_column: a column of the CSV chunks to store as the sample weight (the
            output spec's channel_spec weight); the input spec may name it instead.

    Returns:
        The output spec.

    Raises:
        FeatureSpecError, TranscodeError: one line naming the file and the problem.

    Example::

        transcode("csv_data", "feature_spec.yaml", "binary_data")
    """
    spec = FeatureSpec.load(os.path.join(input_dir, spec_in), allow_auto=True, weight=weight_column)
    if os.path.abspath(output_dir) == os.path.abspath(input_dir):
        raise TranscodeError(f"--output {output_dir} is the input directory; give another directory")
    with atomic_dir(output_dir, replace=True) as staging:
        out = _transcode_into(spec, input_dir, staging, spec_out, block_rows)
    out.base_dir, out.path = os.path.abspath(output_dir), os.path.join(output_dir, spec_out)
    return out


def _transcode_into(spec: FeatureSpec, input_dir: str, staging: str, spec_out: str, block_rows: int) -> FeatureSpec:
    columns = {m: _Columns(spec, staging, m) for m in spec.source_spec}
    rows = {m: _read_mapping(spec, input_dir, m, columns[m], block_rows) for m in spec.source_spec}
    features: dict[str, dict] = {name: {"dtype": "float16"} for name in spec.numerical}
    features[spec.label] = {"dtype": "bool"}
    if spec.weight:
        features[spec.weight] = {"dtype": "float32"}
    for name in spec.categorical:
        declared = spec.feature_spec[name]["cardinality"]
        seen = max(c.max_id.get(name, -1) for c in columns.values()) + 1
        cardinality = max(seen, 1) if declared == AUTO else int(declared)
        features[name] = {"dtype": smallest_id_dtype(cardinality), "cardinality": cardinality}
        if spec.hotness(name) > 1:
            features[name]["hotness"] = spec.hotness(name)
    sources: dict[str, list[Chunk]] = {}
    for mapping, cols in columns.items():
        chunks = []
        if spec.numerical:  # data of categorical features only has no numerical file
            numerical = f"{mapping}/numerical.bin"
            _interleave(
                [cols.part(n) for n in spec.numerical], os.path.join(staging, numerical), rows[mapping], block_rows
            )
            chunks.append(Chunk("split_binary", list(spec.numerical), [numerical]))
        label = f"{mapping}/label.bin"
        os.replace(cols.part(spec.label), os.path.join(staging, label))
        chunks.append(Chunk("split_binary", [spec.label], [label]))
        if spec.weight:
            weight = f"{mapping}/weight.bin"
            os.replace(cols.part(spec.weight), os.path.join(staging, weight))
            chunks.append(Chunk("split_binary", [spec.weight], [weight]))
        for i, name in enumerate(spec.categorical):
            relative = f"{mapping}/cat_{i}.bin"
            _copy_converted(
                cols.part(name),
                os.path.join(staging, relative),
                np.dtype(np.int32),
                spec.hotness(name),
                np.dtype(features[name]["dtype"]),
                block_rows,
            )
            chunks.append(Chunk("split_binary", [name], [relative]))
        for name in spec.numerical + spec.categorical:
            part = cols.part(name)
            if os.path.exists(part):
                os.remove(part)
        sources[mapping] = chunks
    out = FeatureSpec(
        features,
        {c: list(v) for c, v in spec.channel_spec.items()},
        sources,
        dict(spec.metadata),
        staging,
        os.path.join(staging, spec_out),
    )
    out.validate()
    out.check_split_binary_files()
    out.write(os.path.join(staging, spec_out))
    return out


PROG = "python -m data.transcode"


@dataclass
class TranscodeFlags:
    """The command line's flags: `transcode`'s arguments."""

    input: str = flag(help="directory of the CSV files")
    output: str = flag(help="output directory (replaced)")
    feature_spec_in: str = flag(DEFAULT_SPEC_NAME, help="input spec (a path, or a name inside --input)")
    feature_spec_out: str = flag(DEFAULT_SPEC_NAME, help="output spec name inside --output")
    chunk_size: int = flag(DEFAULT_CHUNK_ROWS, parse=positive_int, help="rows per block read")
    weight_column: str | None = flag(
        None,
        help="a CSV column (a feature name of the input spec's chunks) holding each row's sample weight; "
        "stored as the output spec's weight (default: the input spec's channel_spec weight, if any)",
    )


@cli_main(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(prog=PROG, description=__doc__.splitlines()[0]), TranscodeFlags, argv)
    spec = transcode(
        args.input, args.feature_spec_in, args.output, args.feature_spec_out, args.chunk_size, args.weight_column
    )
    rows = spec.check_split_binary_files()
    print(
        f"wrote {spec.path}: {rows['train']} train rows, {rows['test']} test rows, "
        f"{len(spec.numerical)} numerical and {len(spec.categorical)} categorical features"
        + (f", weight {spec.weight!r}" if spec.weight else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
