"""Synthetic CSV data for a feature spec, with labels that depend on the features.

    python -m data.synthetic_csv --output DIR --num_numerical 13 --num_categorical 10
    python -m data.synthetic_csv --output DIR --feature_spec my_spec.yaml

Writes the CSV files the spec's csv chunks name (relative to DIR) and the spec as
DIR/feature_spec.yaml, ready for ``python -m data.transcode --input DIR``.

Labels follow a logistic model: numerical values are standard normal with one
weight each, every categorical id has its own effect (a bag's effect is the mean
over its ids), and label ~ Bernoulli(sigmoid(2 * (weights . x + sum of effects))).
Ids are skewed towards small values (id = floor(cardinality * u^3)) so that
frequent ids are seen often enough to learn. ``cardinality: auto`` features draw
ids below ``--auto_cardinality``.
"""

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.cli import OneLineParser, cli_main
from common.config_flags import flag, parse_flags
from common.errors import BadInput
from data.binary.criteo_layout import NUM_DENSE_FEATURES
from data.binary.feature_spec import AUTO, DEFAULT_SPEC_NAME, FeatureSpec

BLOCK_ROWS = 65536


def csv_feature_spec(
    num_numerical: int, num_categorical: int, cardinality: Any = AUTO, hotness: dict[int, int] | None = None
) -> dict[str, Any]:
    """A spec dict of CSV files: per mapping numerical.csv (none without numerical
    features), categorical.csv (all categorical features in one file) and label.csv.

    Args:
        num_numerical, num_categorical: feature counts.
        cardinality: of every categorical feature (an int or "auto").
        hotness: {categorical index: bag size} for multi-hot features.

    Example::

        spec = csv_feature_spec(2, 1, cardinality=100)
    """
    numerical = [f"num_{i}" for i in range(num_numerical)]
    categorical = [f"cat_{i}" for i in range(num_categorical)]
    features: dict[str, dict[str, Any]] = {n: {"dtype": "float16"} for n in numerical}
    for i, name in enumerate(categorical):
        features[name] = {"cardinality": cardinality}
        if hotness and hotness.get(i, 1) > 1:
            features[name]["hotness"] = hotness[i]
    features["label"] = {"dtype": "bool"}

    def chunks(mapping: str) -> list[dict[str, Any]]:
        out = []
        if numerical:
            out.append({"type": "csv", "features": numerical, "files": [f"{mapping}/numerical.csv"]})
        if categorical:
            out.append({"type": "csv", "features": categorical, "files": [f"{mapping}/categorical.csv"]})
        out.append({"type": "csv", "features": ["label"], "files": [f"{mapping}/label.csv"]})
        return out

    return {
        "feature_spec": features,
        "channel_spec": {"categorical": categorical, "numerical": numerical, "label": ["label"]},
        "source_spec": {"train": chunks("train"), "test": chunks("test")},
        "metadata": {"generator": "data.synthetic_csv"},
    }


def generate_csv(
    spec: FeatureSpec, output_dir: str, rows: dict[str, int], seed: int = 0, auto_cardinality: int = 1000
) -> None:
    """Writes the CSV files of ``spec``'s csv chunks under output_dir, block by block.

    Args:
        spec: the spec (csv chunks; cardinality auto allowed).
        output_dir: root of the chunks' relative file paths; the spec is written there too.
        rows: {"train": N, "test": M}.
        seed: seeds the model of the labels and the rows.
        auto_cardinality: id range of ``cardinality: auto`` features.

    Example::

        generate_csv(FeatureSpec.from_dict(csv_feature_spec(13, 10), ".", "spec"), "csv_data",
                     {"train": 10000, "test": 2000})
    """
    rng = np.random.default_rng(seed)
    sizes = {
        n: auto_cardinality if spec.feature_spec[n]["cardinality"] == AUTO else int(spec.feature_spec[n]["cardinality"])
        for n in spec.categorical
    }
    weights = rng.normal(0, 1 / np.sqrt(max(len(spec.numerical), 1)), len(spec.numerical))
    effects = {n: rng.normal(0, 1 / np.sqrt(max(len(spec.categorical), 1)), sizes[n]) for n in spec.categorical}
    os.makedirs(output_dir, exist_ok=True)
    for mapping, chunks in spec.source_spec.items():
        handles = {}
        for chunk in chunks:
            if chunk.type != "csv" or len(chunk.files) != 1:
                raise BadInput(f"{spec.path}: the generator writes csv chunks of one file each")
            path = os.path.join(output_dir, chunk.files[0])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            handles[id(chunk)] = open(path, "w")
        try:
            for start in range(0, rows[mapping], BLOCK_ROWS):
                n = min(BLOCK_ROWS, rows[mapping] - start)
                values: dict[str, np.ndarray] = {name: rng.standard_normal((n, 1)) for name in spec.numerical}
                score = sum((values[name][:, 0] * w for name, w in zip(spec.numerical, weights)), np.zeros(n))
                for name in spec.categorical:
                    ids = np.floor(sizes[name] * rng.random((n, spec.hotness(name))) ** 3)
                    values[name] = ids
                    score += effects[name][ids.astype(np.int64)].mean(axis=1)
                values[spec.label] = (rng.random((n, 1)) < 1 / (1 + np.exp(-2 * score[:, None]))).astype(float)
                for chunk in chunks:
                    block = np.concatenate([values[name] for name in chunk.features], axis=1)
                    formats = [
                        "%.6g" if spec.channel_of(name) == "numerical" else "%d"
                        for name in chunk.features
                        for _ in range(values[name].shape[1])
                    ]
                    np.savetxt(handles[id(chunk)], block, fmt=formats, delimiter=",")
        finally:
            for f in handles.values():
                f.close()
    spec.write(os.path.join(output_dir, DEFAULT_SPEC_NAME))


def _cardinality(text: str) -> int:
    """--cardinality's value: an integer, or auto (handled by the caller)."""
    try:
        return int(text)
    except ValueError:
        raise BadInput(f"--cardinality: expected an integer or {AUTO}, got {text!r}") from None


PROG = "python -m data.synthetic_csv"


@dataclass
class SyntheticCsvFlags:
    """The command line's flags: the spec (given, or made from the feature counts) and the rows."""

    output: str = flag(help="directory of the CSV files and feature_spec.yaml")
    feature_spec: str | None = flag(None, help="spec whose csv chunks to write (else one is made)")
    num_numerical: int = flag(NUM_DENSE_FEATURES, help="numerical features of the made spec")
    num_categorical: int = flag(26, help="categorical features of the made spec")
    cardinality: str = flag(AUTO, help="cardinality of the made spec's features (int or auto)")
    auto_cardinality: int = flag(1000, help="id range of cardinality: auto features")
    train_rows: int = flag(100_000, help="rows of the train split")
    test_rows: int = flag(20_000, help="rows of the test split")
    seed: int = flag(0, help="seed of the generated values")


@cli_main(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(prog=PROG, description=__doc__.splitlines()[0]), SyntheticCsvFlags, argv)
    if args.feature_spec:
        spec = FeatureSpec.load(args.feature_spec, allow_auto=True)
    else:
        cardinality = args.cardinality if args.cardinality == AUTO else _cardinality(args.cardinality)
        spec = FeatureSpec.from_dict(
            csv_feature_spec(args.num_numerical, args.num_categorical, cardinality),
            args.output,
            os.path.join(args.output, DEFAULT_SPEC_NAME),
            allow_auto=True,
        )
    generate_csv(
        spec, args.output, {"train": args.train_rows, "test": args.test_rows}, args.seed, args.auto_cardinality
    )
    print(f"wrote {args.train_rows} train and {args.test_rows} test rows to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
