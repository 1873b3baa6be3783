"""Criteo in-memory binary days (day_{i}_*.npy) -> split_binary files + feature spec.

    python -m data.criteo_feature_spec --input DIR --output DIR

Describes a Criteo preprocessing output (``python -m data.preprocess_criteo``, or
the synthetic generator) with a generated feature_spec.yaml so it trains through
``--dataset_path`` like any other data set. The train mapping is every day but the
last and the test mapping the last day, so the split is the Criteo loader's: the
test mapping's first half is validation and its second half test. Dense values
(already log(x + 3)) are stored as float16, labels as bool, and each categorical
feature in the smallest id type for its cardinality (from metadata.json, or the
largest id + 1). Only the one-hot layout is converted.
"""

import os
from collections.abc import Sequence

import numpy as np

from common.atomic import atomic_dir
from common.cli import OneLineParser, cli_main, positive_int
from common.errors import BadInput
from data.binary.criteo import CriteoBinaryDataset
from data.binary.criteo_layout import DENSE_FEATURE_NAMES, SPARSE_FEATURE_NAMES
from data.binary.feature_spec import DEFAULT_SPEC_NAME, Chunk, FeatureSpec, smallest_id_dtype

LABEL = "label"
DEFAULT_BLOCK_ROWS = 1 << 20


def _cardinalities(dataset: CriteoBinaryDataset, block_rows: int) -> list[int]:
    known = dataset.num_embeddings_per_feature
    if known is not None:
        return known
    largest = np.full(len(SPARSE_FEATURE_NAMES), -1, dtype=np.int64)
    for start in range(0, dataset.num_rows, block_rows):
        sparse = dataset.read(start, min(start + block_rows, dataset.num_rows))[1]
        largest = np.maximum(largest, sparse.max(axis=0))
    return [max(int(v) + 1, 1) for v in largest]


def _write(dataset: CriteoBinaryDataset, cardinalities: list[int], staging: str, block_rows: int) -> FeatureSpec:
    dtypes = [np.dtype(smallest_id_dtype(c)) for c in cardinalities]
    last_day = int(dataset.day_starts[-2])
    sources: dict[str, list[Chunk]] = {}
    for mapping, (start, stop) in (("train", (0, last_day)), ("test", (last_day, dataset.num_rows))):
        os.makedirs(os.path.join(staging, mapping))
        names = [f"{mapping}/numerical.bin", f"{mapping}/label.bin"] + [
            f"{mapping}/cat_{f}.bin" for f in range(len(SPARSE_FEATURE_NAMES))
        ]
        files = [open(os.path.join(staging, n), "wb") for n in names]
        try:
            for lo in range(start, stop, block_rows):
                dense, sparse, labels = dataset.read(lo, min(lo + block_rows, stop))
                too_large = np.flatnonzero((sparse >= np.asarray(cardinalities)).any(axis=0))
                if too_large.size:
                    f = int(too_large[0])
                    raise BadInput(
                        f"{dataset.directory}: feature {SPARSE_FEATURE_NAMES[f]} has id "
                        f"{int(sparse[:, f].max())}, but metadata.json gives it cardinality "
                        f"{cardinalities[f]}"
                    )
                files[0].write(dense.astype(np.float16).tobytes())
                files[1].write(labels.reshape(-1).astype(np.bool_).tobytes())
                for f, dtype in enumerate(dtypes):
                    files[2 + f].write(np.ascontiguousarray(sparse[:, f]).astype(dtype).tobytes())
        finally:
            for handle in files:
                handle.close()
        sources[mapping] = [
            Chunk("split_binary", list(DENSE_FEATURE_NAMES), [names[0]]),
            Chunk("split_binary", [LABEL], [names[1]]),
        ] + [Chunk("split_binary", [name], [names[2 + f]]) for f, name in enumerate(SPARSE_FEATURE_NAMES)]
    features: dict[str, dict] = {name: {"dtype": "float16"} for name in DENSE_FEATURE_NAMES}
    features[LABEL] = {"dtype": "bool"}
    for name, cardinality, dtype in zip(SPARSE_FEATURE_NAMES, cardinalities, dtypes):
        features[name] = {"dtype": dtype.name, "cardinality": cardinality}
    path = os.path.join(staging, DEFAULT_SPEC_NAME)
    spec = FeatureSpec(
        features,
        {"categorical": list(SPARSE_FEATURE_NAMES), "numerical": list(DENSE_FEATURE_NAMES), "label": [LABEL]},
        sources,
        {
            "source": "criteo in-memory binary days",
            "input": os.path.abspath(dataset.directory),
            "days": len(dataset.rows_per_day),
            "split": "train: all days but the last; test: the last day",
        },
        staging,
        path,
    )
    spec.validate()
    spec.check_split_binary_files()
    spec.write(path)
    return spec


def criteo_to_split_binary(input_dir: str, output_dir: str, block_rows: int = DEFAULT_BLOCK_ROWS) -> FeatureSpec:
    """Converts a directory of day_{i}_*.npy files; returns the spec written to
    ``output_dir/feature_spec.yaml`` (output_dir is replaced).

    Example::

        spec = criteo_to_split_binary("data_cache/synthetic_criteo", "data_cache/criteo_byo")
    """
    dataset = CriteoBinaryDataset(input_dir)
    cardinalities = _cardinalities(dataset, block_rows)
    with atomic_dir(output_dir, replace=True) as staging:
        spec = _write(dataset, cardinalities, staging, block_rows)
    spec.base_dir, spec.path = os.path.abspath(output_dir), os.path.join(output_dir, DEFAULT_SPEC_NAME)
    return spec


PROG = "python -m data.criteo_feature_spec"


@cli_main(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="directory of day_{i}_{dense,sparse,labels}.npy")
    parser.add_argument("--output", required=True, help="output directory (replaced)")
    parser.add_argument("--chunk_size", type=positive_int, default=DEFAULT_BLOCK_ROWS, help="rows per block")
    args = parser.parse_args(argv)
    spec = criteo_to_split_binary(args.input, args.output, args.chunk_size)
    rows = spec.check_split_binary_files()
    print(f"wrote {spec.path}: {rows['train']} train rows, {rows['test']} test rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
