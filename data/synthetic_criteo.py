"""A learnable, Criteo-shaped synthetic data set, written in the in-memory binary layout.

Labels come from a hidden model of the features, so a model trained on the data
visibly learns (unlike uniform random data, where AUROC stays at 0.5):

    logit = bias + sum_j w_j * z_j                      (13 dense features, standardised)
                 + sum_f a_f[id_f]                      (a first-order effect per id)
                 + sum_(f,g) <u_f[id_f], u_g[id_g]>     (a few pairwise id interactions)
    label ~ Bernoulli(sigmoid(logit))

Ids follow a skewed (power-law) distribution like real click logs, so frequent ids
are seen often enough to be learned. Everything is drawn from ``seed``.

Usage::

    python -m data.synthetic_criteo --output_dir data_cache/synthetic_criteo --seed 0
"""

import contextlib
import dataclasses
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from common.atomic import atomic_path
from common.cli import OneLineParser, cli_main
from common.config_flags import add_flags, config_values, flag
from common.errors import BadInput
from data.binary.criteo_layout import (
    NUM_DENSE_FEATURES,
    NUM_SPARSE_FEATURES,
    CriteoMetadata,
    day_file,
    metadata_file,
    multi_hot_file,
    read_metadata,
    remove_day_files_from,
    write_metadata,
)
from data.config import MULTI_HOT_DISTRIBUTIONS

# Table sizes from 4 to 40k rows: a spread like Criteo's, small enough to train in minutes.
DEFAULT_CARDINALITIES: list[int] = [
    1000,
    500,
    20000,
    10000,
    200,
    50,
    5000,
    300,
    100,
    30000,
    2000,
    8000,
    20,
    600,
    100,
    40000,
    10,
    3000,
    1500,
    15000,
    4,
    9000,
    12000,
    100,
    700,
    25000,
]
_CHUNK_ROWS = 65536


@dataclass
class SyntheticCriteoSpec:
    """What to generate: the days, the tables and the hidden model that labels the rows."""

    num_days: int = flag(
        4, help="day files to write; the last becomes validation + test (a raw --format: 1 is enough to score)"
    )
    rows_per_day: int = flag(250_000, help="rows in each day file")
    cardinalities: list[int] = flag(
        DEFAULT_CARDINALITIES, help=f"{NUM_SPARSE_FEATURES} comma-separated table sizes (a spread from 4 to 40k)"
    )
    seed: int = flag(0, help="seed of the hidden model and every sample")
    # u is uniform in [0, 1).
    id_skew: float = flag(3.0, help="ids are floor(cardinality * u ** SKEW): larger puts more rows on a few ids")
    signal_scale: float = flag(1.0, help="multiplies the hidden logit: larger makes labels easier to predict")

    def validate(self, min_days: int = 2) -> None:
        """Raises BadInput naming the flag. ``min_days``: 2 for a data set to train on
        (train + eval); 1 for raw day files, one of which is enough to score."""
        if self.num_days < min_days:
            why = " (train + eval)" if min_days == 2 else ""
            raise BadInput(f"--num_days must be at least {min_days}{why}, got {self.num_days}")
        if self.rows_per_day < 2:
            raise BadInput(f"--rows_per_day must be at least 2, got {self.rows_per_day}")
        if len(self.cardinalities) != NUM_SPARSE_FEATURES:
            raise BadInput(f"--cardinalities needs {NUM_SPARSE_FEATURES} values, got {len(self.cardinalities)}")
        if min(self.cardinalities) <= 0 or max(self.cardinalities) > np.iinfo(np.int32).max:
            raise BadInput("--cardinalities must be positive int32 values")
        if self.id_skew <= 0:
            raise BadInput(f"--id_skew must be positive, got {self.id_skew}")


SYNTHETIC_FORMATS = ("binary", "tsv", "tsv.gz", "multi_hot")


@dataclass
class SyntheticCriteoOutput:
    """Where the generated days go and in which layout."""

    output_dir: str = flag(help="directory to write the day files to")
    format: str = flag(
        "binary",
        choices=SYNTHETIC_FORMATS,
        help="binary: the in-memory layout; tsv / tsv.gz: raw Criteo day files day_<i>[.gz]; "
        "multi_hot: the MLPerf multi-hot layout (with --multi_hot_sizes)",
    )
    multi_hot_sizes: list[int] | None = flag(None, help=f"{NUM_SPARSE_FEATURES} bag sizes (multi_hot)")
    multi_hot_distribution_type: str = flag(
        "uniform", choices=MULTI_HOT_DISTRIBUTIONS, help="offsets of the extra ids in a bag (multi_hot)"
    )


@dataclass
class _HiddenModel:
    dense_mu: np.ndarray  # log-normal parameters of the raw counts
    dense_sigma: np.ndarray
    dense_weight: np.ndarray
    id_effects: list[np.ndarray]
    pairs: list[tuple[int, int]]
    pair_vectors: dict[int, np.ndarray]
    bias: float


def _hidden_model(spec: SyntheticCriteoSpec) -> _HiddenModel:
    rng = np.random.default_rng([spec.seed, 0])
    strong = set(rng.choice(NUM_SPARSE_FEATURES, size=10, replace=False).tolist())
    id_effects = [
        rng.normal(0.0, 0.9 if f in strong else 0.2, size=c).astype(np.float32)
        for f, c in enumerate(spec.cardinalities)
    ]
    order = rng.permutation(NUM_SPARSE_FEATURES)
    pairs = [(int(order[2 * i]), int(order[2 * i + 1])) for i in range(4)]
    pair_vectors = {
        f: rng.normal(0.0, 0.6, size=(spec.cardinalities[f], 4)).astype(np.float32) for pair in pairs for f in pair
    }
    return _HiddenModel(
        dense_mu=rng.uniform(0.0, 4.0, NUM_DENSE_FEATURES),
        dense_sigma=rng.uniform(0.5, 1.5, NUM_DENSE_FEATURES),
        dense_weight=rng.normal(0.0, 0.5, NUM_DENSE_FEATURES),
        id_effects=id_effects,
        pairs=pairs,
        pair_vectors=pair_vectors,
        bias=-1.2,
    )


def generate_rows(
    spec: SyntheticCriteoSpec, model: _HiddenModel, rng: np.random.Generator, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draws n rows: (dense float32 (n,13) after log(x+3), sparse int32 (n,26), labels int32 (n,1))."""
    raw, _, sparse, labels = _draw_raw_rows(spec, model, rng, n)
    return np.log(raw + 3.0).astype(np.float32), sparse, labels


def _draw_raw_rows(
    spec: SyntheticCriteoSpec, model: _HiddenModel, rng: np.random.Generator, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(raw counts float (n,13) with missing as 0, missing mask, ids int32 (n,26), labels int32 (n,1))."""
    raw = np.floor(rng.lognormal(model.dense_mu, model.dense_sigma, size=(n, NUM_DENSE_FEATURES)))
    missing = rng.random((n, NUM_DENSE_FEATURES)) < 0.15
    raw[missing] = 0.0  # missing values read as 0
    dense = np.log(raw + 3.0).astype(np.float32)
    cards = np.asarray(spec.cardinalities, dtype=np.float64)
    u = rng.random((n, NUM_SPARSE_FEATURES))
    sparse = np.minimum(np.floor(cards * u**spec.id_skew), cards - 1).astype(np.int32)

    # centre each dense feature near its median so its weight acts in both directions
    centred = (dense - np.log(np.exp(model.dense_mu) + 3.0)) / model.dense_sigma
    logit = model.bias + centred @ model.dense_weight
    for f in range(NUM_SPARSE_FEATURES):
        logit += model.id_effects[f][sparse[:, f]]
    for f, g in model.pairs:
        logit += np.einsum("nk,nk->n", model.pair_vectors[f][sparse[:, f]], model.pair_vectors[g][sparse[:, g]])
    prob = 1.0 / (1.0 + np.exp(-spec.signal_scale * logit))
    labels = (rng.random(n) < prob).astype(np.int32).reshape(n, 1)
    return raw, missing, sparse, labels


def id_hashes(ids: np.ndarray, seed: int) -> np.ndarray:
    """The 32-bit hash a raw log would show for each (row, feature) id: a bijection of
    the id per feature (an odd multiplier modulo 2**32), so distinct ids stay distinct."""
    features = np.arange(ids.shape[1], dtype=np.uint64)
    mixed = ids.astype(np.uint64) * np.uint64(2654435761) + features * np.uint64(40503) + np.uint64(seed)
    return (mixed & np.uint64(0xFFFF_FFFF)).astype(np.uint32)


def write_raw_day(spec: SyntheticCriteoSpec, path: str, day: int) -> int:
    """Writes day ``day`` as raw Criteo TSV (``.gz`` when path ends so); returns rows.

    Same rows as the binary day file of the same spec and day: integer counts (empty
    when missing) and 8-digit hex hashes of the ids.
    """
    import gzip

    model = _hidden_model(spec)
    rng = np.random.default_rng([spec.seed, 1, day])
    with (
        atomic_path(path) as tmp,
        gzip.open(tmp, "wb", compresslevel=1) if path.endswith(".gz") else open(tmp, "wb") as f,
    ):
        for start in range(0, spec.rows_per_day, _CHUNK_ROWS):
            n = min(_CHUNK_ROWS, spec.rows_per_day - start)
            raw, missing, ids, labels = _draw_raw_rows(spec, model, rng, n)
            dense_text = np.where(missing, "", raw.astype(np.int64).astype(str)).tolist()
            hex_text = np.frombuffer(id_hashes(ids, spec.seed).astype(">u4").tobytes().hex().encode(), dtype="S8")
            hex_rows = hex_text.astype(str).reshape(n, NUM_SPARSE_FEATURES).tolist()
            lines = [
                "\t".join([str(label), *d, *h]) for label, d, h in zip(labels[:, 0].tolist(), dense_text, hex_rows)
            ]
            f.write(("\n".join(lines) + "\n").encode())
    return spec.rows_per_day


def write_raw_days(spec: SyntheticCriteoSpec, output_dir: str, suffix: str = "") -> None:
    """Writes raw day files ``day_0{suffix}`` ... into output_dir, removing the raw day
    files it holds from an earlier run (more days, or the other compression), which
    preprocessing would otherwise read as input."""
    from data.preprocess_criteo import RAW_DAY_FILE

    os.makedirs(output_dir, exist_ok=True)
    names = {f"day_{day}{suffix}" for day in range(spec.num_days)}
    for name in os.listdir(output_dir):
        if RAW_DAY_FILE.fullmatch(name) and name not in names:
            os.remove(os.path.join(output_dir, name))
    for day in range(spec.num_days):
        write_raw_day(spec, os.path.join(output_dir, f"day_{day}{suffix}"), day)


def _write_day(spec: SyntheticCriteoSpec, model: _HiddenModel, output_dir: str, day: int) -> int:
    """Writes one day's three files under temporary names, then renames them; returns positives."""
    rng = np.random.default_rng([spec.seed, 1, day])
    shapes = {
        "dense": (np.float32, NUM_DENSE_FEATURES),
        "sparse": (np.int32, NUM_SPARSE_FEATURES),
        "labels": (np.int32, 1),
    }
    with contextlib.ExitStack() as renamed_when_complete:
        tmp_paths = {
            k: renamed_when_complete.enter_context(atomic_path(day_file(output_dir, day, k), ".tmp.npy"))
            for k in shapes
        }
        return _fill_day(spec, model, rng, tmp_paths, shapes)


def _fill_day(
    spec: SyntheticCriteoSpec,
    model: _HiddenModel,
    rng: np.random.Generator,
    tmp_paths: dict[str, str],
    shapes: dict[str, tuple[type, int]],
) -> int:
    """Fills the day's arrays (memory-mapped .npy files at tmp_paths); returns the positives."""
    n = spec.rows_per_day
    arrays = {
        k: np.lib.format.open_memmap(tmp_paths[k], mode="w+", dtype=dtype, shape=(n, width))
        for k, (dtype, width) in shapes.items()
    }
    positives = 0
    for start in range(0, n, _CHUNK_ROWS):
        stop = min(n, start + _CHUNK_ROWS)
        dense, sparse, labels = generate_rows(spec, model, rng, stop - start)
        arrays["dense"][start:stop] = dense
        arrays["sparse"][start:stop] = sparse
        arrays["labels"][start:stop] = labels
        positives += int(labels.sum())
    for array in arrays.values():
        array.flush()
    return positives


def _start_replacing(output_dir: str) -> None:
    """Removes the directory's metadata.json (the data set there is not complete until
    it is rewritten)."""
    os.makedirs(output_dir, exist_ok=True)
    if os.path.exists(metadata_file(output_dir)):
        os.remove(metadata_file(output_dir))


def _spec_record(spec: SyntheticCriteoSpec) -> dict[str, object]:
    return dataclasses.asdict(spec)


def generate_synthetic_criteo(spec: SyntheticCriteoSpec, output_dir: str, show_progress: bool = True) -> CriteoMetadata:
    """Writes the data set to ``output_dir`` unless an identical one is already there.

    The metadata file is written last, so a directory with a metadata.json whose
    generator record matches ``spec`` is complete.

    Returns:
        the metadata (also in ``output_dir/metadata.json``).

    Example::

        generate_synthetic_criteo(SyntheticCriteoSpec(num_days=3, rows_per_day=10_000), "/tmp/d")
    """
    spec.validate()
    existing = read_metadata(output_dir) if os.path.isdir(output_dir) else None
    if existing is not None and existing.generator == _spec_record(spec):
        return existing
    _start_replacing(output_dir)
    remove_day_files_from(output_dir, spec.num_days)  # an earlier, longer data set's days
    model = _hidden_model(spec)
    days = range(spec.num_days)
    if show_progress:
        from tqdm import tqdm

        days = tqdm(days, desc="generating synthetic Criteo days", unit="day")
    positives = sum(_write_day(spec, model, output_dir, day) for day in days)
    total = spec.num_days * spec.rows_per_day
    metadata = CriteoMetadata(
        num_days=spec.num_days,
        rows_per_day=[spec.rows_per_day] * spec.num_days,
        num_embeddings_per_feature=list(spec.cardinalities),
        positive_rate=positives / total,
        generator=_spec_record(spec),
    )
    write_metadata(output_dir, metadata)
    return metadata


def generate_multi_hot_criteo(
    spec: SyntheticCriteoSpec, output_dir: str, hotness: Sequence[int], distribution: str = "uniform"
) -> CriteoMetadata:
    """Writes the MLPerf DLRM-DCNv2 multi-hot layout: per day dense and labels .npy and
    ``day_{i}_sparse_multi_hot.npz`` (26 int32 arrays (N, k_f), keys "0".."25"). Each
    bag holds the one-hot data's id first, then ids from `MultiHotExpander`."""
    import shutil

    from data.batching.multi_hot import MultiHotExpander, write_multi_hot_npz

    spec.validate()
    _start_replacing(output_dir)
    remove_day_files_from(output_dir, spec.num_days)
    one_hot_dir = os.path.join(output_dir, ".one_hot")
    metadata = generate_synthetic_criteo(spec, one_hot_dir, show_progress=False)
    expand = MultiHotExpander(hotness, spec.cardinalities, distribution, spec.seed)
    for day in range(spec.num_days):
        sparse = np.load(day_file(one_hot_dir, day, "sparse"))
        write_multi_hot_npz(multi_hot_file(output_dir, day), expand(sparse))
        for kind in ("dense", "labels"):
            shutil.copyfile(day_file(one_hot_dir, day, kind), day_file(output_dir, day, kind))
    shutil.rmtree(one_hot_dir)
    metadata = dataclasses.replace(metadata, multi_hot_sizes=list(hotness), multi_hot_distribution_type=distribution)
    write_metadata(output_dir, metadata)
    return metadata


PROG = "python -m data.synthetic_criteo"


@cli_main(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_flags(parser, SyntheticCriteoOutput)
    add_flags(parser, SyntheticCriteoSpec)
    args = parser.parse_args(argv)
    spec = SyntheticCriteoSpec(**config_values(SyntheticCriteoSpec, args))
    output = SyntheticCriteoOutput(**config_values(SyntheticCriteoOutput, args))
    try:
        if output.format == "multi_hot":
            if output.multi_hot_sizes is None or len(output.multi_hot_sizes) != NUM_SPARSE_FEATURES:
                raise BadInput(f"--format multi_hot needs --multi_hot_sizes with {NUM_SPARSE_FEATURES} values")
            generate_multi_hot_criteo(
                spec, output.output_dir, output.multi_hot_sizes, output.multi_hot_distribution_type
            )
            print(f"multi-hot synthetic Criteo data at {output.output_dir}")
            return 0
        if output.format != "binary":
            spec.validate(min_days=1)  # one raw day is what serving.predict needs
            suffix = ".gz" if output.format == "tsv.gz" else ""
            write_raw_days(spec, output.output_dir, suffix)
            days = (
                f"{spec.num_days} days"
                if spec.num_days > 1
                else "1 day (enough to score with serving.predict; training needs 2)"
            )
            print(f"raw Criteo TSV: {days} of {spec.rows_per_day} lines at {output.output_dir}")
            return 0
        metadata = generate_synthetic_criteo(spec, output.output_dir)
    except OSError as e:  # a full disk, say: the message names the file
        raise BadInput(str(e)) from e
    print(
        f"synthetic Criteo data: {sum(metadata.rows_per_day or [])} rows in {metadata.num_days} days at "
        f"{output.output_dir} (positive rate {metadata.positive_rate:.3f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
