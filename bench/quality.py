"""Model quality on real click-like data: DLRM and DCNv2 trained with the small-data
recipe against a logistic-regression baseline, on exactly the same train/test rows.

Data: MovieLens 100K (100,000 ratings of 1,682 films by 943 users) as RecBole 1.2.1
(MIT) ships it inside its wheel. The wheel is fetched with ``pip download`` (pinned
version and SHA-256), never installed or imported: the three tables are read from the
zip. A rating of 4 or 5 is a click (label 1, 55% of rows). Features: user, film, age,
gender, occupation, zip code, release year and first genre as categorical features,
and age, release year and rating time as numerical ones. Rows are split by a seeded
permutation into 80% train, 10% validation and 10% test, converted to the
bring-your-own layout (CSV -> `data.transcode` -> split_binary). The baseline is
logistic regression on the one-hot categorical plus the numerical features (L2
chosen on validation). Prints each model's test AUROC, NE and calibration side by
side and one JSON line.

    python bench/quality.py [--work_dir data_cache/quality] [--max_rows 100000] [--nproc 1]
        [--history_aggregates]

``--history_aggregates`` adds a baseline given what a tree can take of each user's
history: the leak-free past events, positives and positive rate of the row's user and
of its film (strictly before the rating's time, ``python -m data.histories
--aggregates``), as six more numerical columns of a logistic regression (and the
columns a LightGBM baseline would take, `history_aggregates`).
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

import dcnv2_main
import dlrm_main
from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from data.binary.feature_spec import DEFAULT_SPEC_NAME, FeatureSpec
from data.histories import HistoryFlags, aggregate_columns, build_histories
from data.transcode import transcode
from harness.launch import eval_record, launch, read_log
from recipes import RECIPES
from training.metrics import BinaryClassificationMetrics

WHEEL_REQUIREMENT = "recbole==1.2.1"
WHEEL_NAME = "recbole-1.2.1-py3-none-any.whl"
WHEEL_SHA256 = "9c9948202011f37eb0a7c6768129313f00d6403ad221ec940d5e2d5d5f33a407"
MEMBER = "recbole/dataset_example/ml-100k/ml-100k.{}"
CLICK_RATING = 4  # ratings 4 and 5 are clicks
SPLIT_SEED = 0
TRAIN_FRACTION = 0.8  # the rest is halved into validation and test

CATEGORICAL = ["user_id", "item_id", "age", "gender", "occupation", "zip_code", "release_year", "genre"]
NUMERICAL = ["age_years", "release_year_value", "rating_time"]

# The models' flags: the small-data recipe (training/recipes.py; docs/quality.md has
# the evidence), which a test shortens with "epochs".
RECIPE_FLAGS: dict[str, str] = {"recipe": "small_data"}
MODELS = {"dlrm": dlrm_main.main, "dcnv2": dcnv2_main.main}
# Baseline: L2 coefficients tried, LBFGS iterations per fit.
LR_L2_GRID = (1e-6, 1e-5, 1e-4, 1e-3)
LR_ITERATIONS = 200


@dataclass
class Table:
    """The joined MovieLens rows: categorical ids (rows, features), numerical values
    (rows, features), labels (rows,) and each categorical feature's cardinality."""

    categorical: np.ndarray
    numerical: np.ndarray
    labels: np.ndarray
    cardinalities: list[int]
    times: np.ndarray | None = None  # each rating's Unix time in seconds (int64), for histories

    def take(self, rows: np.ndarray) -> "Table":
        times = None if self.times is None else self.times[rows]
        return Table(self.categorical[rows], self.numerical[rows], self.labels[rows], self.cardinalities, times)


def fetch_wheel(cache_dir: str) -> str:
    """The RecBole wheel in ``cache_dir``, downloaded with pip when absent; checks its SHA-256."""
    path = os.path.join(cache_dir, WHEEL_NAME)
    if not os.path.exists(path):
        os.makedirs(cache_dir, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_dir) as staging:  # no partial wheel under the real name
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--only-binary",
                    ":all:",
                    "--quiet",
                    WHEEL_REQUIREMENT,
                    "-d",
                    staging,
                ],
                check=True,
            )
            os.replace(os.path.join(staging, WHEEL_NAME), path)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != WHEEL_SHA256:
        raise RuntimeError(f"{path}: SHA-256 {digest}, expected {WHEEL_SHA256}; delete it to fetch it again")
    return path


def _read_member(wheel: zipfile.ZipFile, table: str) -> list[list[str]]:
    """The rows of one tab-separated RecBole atomic file, header dropped."""
    lines = wheel.read(MEMBER.format(table)).decode("utf-8").splitlines()
    return [line.split("\t") for line in lines[1:] if line]


def _encode(values: Sequence[str]) -> tuple[np.ndarray, int]:
    """Dense ids 0..n-1 of string values (sorted), and n."""
    vocabulary, ids = np.unique(np.asarray(values), return_inverse=True)
    return ids.astype(np.int64), len(vocabulary)


def load_movielens(wheel_path: str) -> Table:
    """Joins ratings with their user's and film's attributes; labels are rating >= 4."""
    with zipfile.ZipFile(wheel_path) as wheel:
        ratings = _read_member(wheel, "inter")  # user_id, item_id, rating, timestamp
        users = {r[0]: r[1:] for r in _read_member(wheel, "user")}  # age, gender, occupation, zip_code
        items = {r[0]: r[1:] for r in _read_member(wheel, "item")}  # title, release_year, genres
    columns: dict[str, list[str]] = {name: [] for name in CATEGORICAL}
    years, times = [], []
    for user_id, item_id, _, timestamp in ratings:
        age, gender, occupation, zip_code = users[user_id]
        year, genres = items[item_id][1], items[item_id][2].split()
        for name, value in zip(
            CATEGORICAL, (user_id, item_id, age, gender, occupation, zip_code, year, genres[0] if genres else "")
        ):
            columns[name].append(value)
        years.append(float(year) if year.isdigit() else 0.0)  # two films have no year ("unkonwn", "V")
        times.append(float(timestamp))
    encoded = [_encode(columns[name]) for name in CATEGORICAL]
    ages = np.array([float(a) for a in columns["age"]])
    times_arr = np.array(times)
    numerical = np.stack(
        [
            ages / 100.0,
            np.where(np.array(years) > 0, (np.array(years) - 1900.0) / 100.0, 0.0),
            (times_arr - times_arr.min()) / (times_arr.max() - times_arr.min()),
        ],
        axis=1,
    )
    labels = np.array([float(r[2]) >= CLICK_RATING for r in ratings], dtype=np.float32)
    return Table(
        np.stack([ids for ids, _ in encoded], axis=1),
        numerical.astype(np.float32),
        labels,
        [size for _, size in encoded],
        np.array([int(r[3]) for r in ratings], dtype=np.int64),
    )


# What --history_aggregates adds, in order (data.histories names them after the columns).
HISTORY_AGGREGATES = aggregate_columns("user_id", "item_id")


def history_aggregates(table: Table, work_dir: str) -> np.ndarray:
    """(rows, 6) float64: each row's user's and film's events, positive events and
    positive rate strictly before its time (NaN without a past event), in
    `HISTORY_AGGREGATES`' order, computed by data.histories over all the table's rows
    (a test row's past is every earlier rating, as a deployed model's would be).

    Raises:
        ValueError: a table without times.
    """
    if table.times is None:
        raise ValueError("history aggregates need the ratings' times")
    folder = os.path.join(work_dir, "history")
    ratings = pa.table(
        {
            "user_id": table.categorical[:, CATEGORICAL.index("user_id")],
            "item_id": table.categorical[:, CATEGORICAL.index("item_id")],
            "time": table.times,
            "label": table.labels.astype(np.int8),
        }
    )
    os.makedirs(os.path.join(folder, "ratings"), exist_ok=True)
    pq.write_table(ratings, os.path.join(folder, "ratings", "part-0.parquet"))
    output = os.path.join(folder, "with_aggregates")
    build_histories(
        HistoryFlags(
            os.path.join(folder, "ratings"),
            output,
            "user_id",
            "item_id",
            "time",
            "label",
            max_history=1,
            aggregates=True,
            overwrite=True,
        )
    )
    written = pq.read_table(os.path.join(output, "part-0.parquet"), columns=HISTORY_AGGREGATES)
    return np.stack(
        [written.column(name).to_numpy(zero_copy_only=False).astype(np.float64) for name in HISTORY_AGGREGATES], axis=1
    )


def with_history_aggregates(table: Table, aggregates: np.ndarray, train_rows: np.ndarray) -> Table:
    """The table with the aggregates as numerical features a logistic regression can
    weigh: counts as log1p / 10, a rate without a past event as the training rows'
    positive rate."""
    prior = float(table.labels[train_rows].mean())
    columns = [
        np.log1p(aggregates[:, k]) / 10.0 if name.endswith(("_events", "_positives")) else aggregates[:, k]
        for k, name in enumerate(HISTORY_AGGREGATES)
    ]
    extra = np.nan_to_num(np.stack(columns, axis=1), nan=prior).astype(np.float32)
    return Table(
        table.categorical,
        np.concatenate([table.numerical, extra], axis=1),
        table.labels,
        table.cardinalities,
        table.times,
    )


def split_rows(num_rows: int, max_rows: int | None = None) -> dict[str, np.ndarray]:
    """Seeded permutation of the rows (the first ``max_rows`` of it), cut into 80% train
    and equal validation and test parts."""
    order = np.random.default_rng(SPLIT_SEED).permutation(num_rows)[:max_rows]
    train = int(len(order) * TRAIN_FRACTION)
    half = (len(order) - train) // 2
    return {
        "train": order[:train],
        "validation": order[train : train + half],
        "test": order[train + half : train + 2 * half],
    }


def _csv_spec(cardinalities: list[int]) -> dict:
    features = {name: {"dtype": "float16"} for name in NUMERICAL}
    features.update({name: {"cardinality": size} for name, size in zip(CATEGORICAL, cardinalities)})
    features["label"] = {"dtype": "bool"}

    def chunks(mapping: str) -> list[dict]:
        return [
            {"type": "csv", "features": NUMERICAL, "files": [f"{mapping}/numerical.csv"]},
            {"type": "csv", "features": CATEGORICAL, "files": [f"{mapping}/categorical.csv"]},
            {"type": "csv", "features": ["label"], "files": [f"{mapping}/label.csv"]},
        ]

    return {
        "feature_spec": features,
        "channel_spec": {"categorical": CATEGORICAL, "numerical": NUMERICAL, "label": ["label"]},
        "source_spec": {"train": chunks("train"), "test": chunks("test")},
        "metadata": {
            "source": f"MovieLens 100K from the {WHEEL_NAME} wheel",
            "label": "rating >= 4",
            "split_seed": SPLIT_SEED,
        },
    }


def write_dataset(table: Table, splits: dict[str, np.ndarray], output_dir: str) -> str:
    """Writes the bring-your-own layout (train mapping: train rows; test mapping:
    validation then test rows, which the loader halves) and returns the spec's path."""
    mappings = {"train": splits["train"], "test": np.concatenate([splits["validation"], splits["test"]])}
    with tempfile.TemporaryDirectory() as csv_dir:
        for mapping, rows in mappings.items():
            part = table.take(rows)
            os.makedirs(os.path.join(csv_dir, mapping))
            np.savetxt(os.path.join(csv_dir, mapping, "numerical.csv"), part.numerical, fmt="%.6g", delimiter=",")
            np.savetxt(os.path.join(csv_dir, mapping, "categorical.csv"), part.categorical, fmt="%d", delimiter=",")
            np.savetxt(os.path.join(csv_dir, mapping, "label.csv"), part.labels, fmt="%d")
        FeatureSpec.from_dict(_csv_spec(table.cardinalities), csv_dir, "quality spec").write(
            os.path.join(csv_dir, DEFAULT_SPEC_NAME)
        )
        return transcode(csv_dir, DEFAULT_SPEC_NAME, output_dir).path


class LogisticRegression(torch.nn.Module):
    """Logistic regression on one-hot categorical features plus numerical ones: one
    weight per categorical id (an embedding of width 1), one per numerical feature, a bias.

    Args:
        cardinalities: ids per categorical feature.
        num_numerical: numerical features.
    """

    def __init__(self, cardinalities: list[int], num_numerical: int) -> None:
        super().__init__()
        self.register_buffer("offsets", torch.tensor(np.cumsum([0] + cardinalities[:-1])))
        self.id_weights = torch.nn.Parameter(torch.zeros(sum(cardinalities)))
        self.linear = torch.nn.Linear(num_numerical, 1)

    def forward(self, categorical: torch.Tensor, numerical: torch.Tensor) -> torch.Tensor:
        return self.id_weights[categorical + self.offsets].sum(dim=1) + self.linear(numerical).squeeze(1)


def _tensors(table: Table) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.from_numpy(table.categorical), torch.from_numpy(table.numerical), torch.from_numpy(table.labels)


def _metrics(model: LogisticRegression, table: Table) -> dict[str, float]:
    categorical, numerical, labels = _tensors(table)
    metrics = BinaryClassificationMetrics(torch.device("cpu"))
    with torch.no_grad():
        metrics.update(model(categorical, numerical), labels)
    return metrics.compute()


def fit_logistic_regression(train: Table, l2: float) -> LogisticRegression:
    """Full-batch L-BFGS on mean log loss + l2 * |w|^2."""
    torch.manual_seed(0)
    model = LogisticRegression(train.cardinalities, train.numerical.shape[1])
    categorical, numerical, labels = _tensors(train)
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=LR_ITERATIONS, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(categorical, numerical), labels)
        loss = loss + l2 * (model.id_weights.square().sum() + model.linear.weight.square().sum())
        loss.backward()
        return loss

    optimizer.step(closure)
    return model


def logistic_regression_baseline(table: Table, splits: dict[str, np.ndarray]) -> dict[str, float]:
    """Test metrics of the logistic regression whose L2 had the best validation AUROC,
    with that AUROC as ``validation_auroc``."""
    train, validation, test = (table.take(splits[s]) for s in ("train", "validation", "test"))
    fits = [(fit_logistic_regression(train, l2), l2) for l2 in LR_L2_GRID]
    scored = [(_metrics(model, validation)["auroc"], l2, model) for model, l2 in fits]
    validation_auroc, l2, model = max(scored, key=lambda fit: fit[0])
    return {**_metrics(model, test), "l2": l2, "validation_auroc": validation_auroc}


def train_model(
    name: str, spec_path: str, log_path: str, nproc: int, recipe: dict[str, str] = RECIPE_FLAGS
) -> dict[str, float]:
    """Trains one entry point with the recipe on the data set; its test metrics, with
    the best validation AUROC as ``validation_auroc``."""
    argv = ["--dataset_path", spec_path, "--log_path", log_path, "--seed", "0", "--log_every_n_steps", "100"]
    for option, value in recipe.items():
        argv += [f"--{option}", value]
    results = launch(MODELS[name], argv, nproc=nproc)
    if any(code != 0 for code in results.values()):
        raise RuntimeError(f"{name} training failed: exit codes {results}")
    records = read_log(log_path)
    best = [r for r in records if r["event"] == "summary"][-1]["best_validation"]
    return {**eval_record(records, "test"), "validation_auroc": best["auroc"]}


def run(
    work_dir: str,
    max_rows: int | None = None,
    nproc: int = 1,
    recipe: dict[str, str] = RECIPE_FLAGS,
    history: bool = False,
) -> dict[str, dict[str, float]]:
    """Fetches and converts the data, trains the models and the baseline; {model: test metrics}.

    Args:
        work_dir: holds the wheel, the converted data set and the runs' logs.
        max_rows: use only this many rows (of the seeded permutation).
        nproc: ranks per training run.
        recipe: the models' flags.
        history: also fit ``logistic_regression_history``, the baseline with the
            user's and film's leak-free past aggregates (`history_aggregates`).

    Example::

        run("data_cache/quality")["dlrm"]["auroc"]
    """
    table = load_movielens(fetch_wheel(os.path.join(work_dir, "wheel")))
    splits = split_rows(len(table.labels), max_rows)
    spec_path = write_dataset(table, splits, os.path.join(work_dir, "movielens_100k"))
    results = {"logistic_regression": logistic_regression_baseline(table, splits)}
    if history:
        aggregated = with_history_aggregates(table, history_aggregates(table, work_dir), splits["train"])
        results["logistic_regression_history"] = logistic_regression_baseline(aggregated, splits)
    for name in MODELS:
        results[name] = train_model(name, spec_path, os.path.join(work_dir, f"{name}.jsonl"), nproc, recipe)
    expected = len(splits["test"])
    for name, figures in results.items():
        if figures["num_samples"] != expected:
            raise RuntimeError(f"{name} was tested on {figures['num_samples']} rows, not the {expected} test rows")
    return results


@dataclass
class QualityFlags:
    """The flags of ``python bench/quality.py``: what it measures and how."""

    work_dir: str = flag("data_cache/quality", help="wheel, converted data and run logs")
    max_rows: int | None = flag(None, help="use this many rows of the permutation")
    nproc: int = flag(1, help="ranks of each training run")
    history_aggregates: bool = flag(
        False, help="add a logistic regression given the user's and film's leak-free past counts and rates"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), QualityFlags, argv)
    results = run(args.work_dir, args.max_rows, args.nproc, history=args.history_aggregates)
    baseline = results["logistic_regression"]["auroc"]
    print(
        f"{'model':<20} {'test AUROC':>10} {'vs LR':>7} {'NE':>7} {'calibration':>11} {'rows':>7} "
        f"{'validation AUROC':>16}"
    )
    for name, r in results.items():
        print(
            f"{name:<20} {r['auroc']:>10.4f} {r['auroc'] - baseline:>+7.4f} {r['ne']:>7.4f} "
            f"{r['calibration']:>11.4f} {r['num_samples']:>7} {r['validation_auroc']:>16.4f}"
        )
    goal = all(results[name]["auroc"] >= baseline + 0.01 for name in MODELS)
    print(
        json.dumps(
            {
                "event": "quality",
                "data": "movielens_100k",
                "flags": RECIPE_FLAGS,
                "recipe_settings": RECIPES[RECIPE_FLAGS["recipe"]].options(),
                "goal_auroc_margin": 0.01,
                "goal_met": goal,
                **{
                    name: {
                        k: r[k] for k in ("auroc", "ne", "calibration", "log_loss", "num_samples", "validation_auroc")
                    }
                    for name, r in results.items()
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
