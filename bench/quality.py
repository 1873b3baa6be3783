"""Model quality on real click-like data: DLRM and DCNv2 trained with the small-data
recipe against logistic regression and LightGBM, on exactly the same train/test rows,
each over several seeds.

Data: MovieLens 100K (100,000 ratings of 1,682 films by 943 users) as RecBole 1.2.1
(MIT) ships it inside its wheel. The wheel is fetched with ``pip download`` (pinned
version and SHA-256), never installed or imported: the three tables are read from the
zip. A rating of 4 or 5 is a click (label 1, 55% of rows). Features: user, film, age,
gender, occupation, zip code, release year and first genre as categorical features,
and age, release year and rating time as numerical ones.

Splits (``--split``): ``random``, a seeded permutation cut into 80% train, 10%
validation and 10% test, converted to the bring-your-own layout (CSV ->
`data.transcode` -> split_binary); ``time``, the ratings in time order as a Parquet log
(with each rating's leak-free history and past aggregates from ``data.histories``),
the latest 10% of the time range test and the 10% before it validation, as the
Parquet source splits it (``--time_column time --validation_window 0.1 --test_window
0.1``): the models train from that log, the baselines take the same rows.

Baselines: logistic regression on the one-hot categorical plus the numerical features
(L2 chosen on validation); LightGBM on the categorical ids (as LightGBM categorical
features) and the numerical features (leaves and minimum leaf size chosen on
validation, early stopping on validation). Every model runs once per seed (the
logistic regression, deterministic, once); prints the mean and standard deviation of
each model's test AUROC, NE and calibration side by side and one JSON line.

    python bench/quality.py [--work_dir data_cache/quality] [--split random|time] [--seeds 5]
        [--models dlrm,dcnv2,logistic_regression,lightgbm] [--max_rows N] [--nproc 1]
        [--history_aggregates] [--sequences] [--model_flags "--embedding_dim 8"] [--reuse_logs]

``--history_aggregates`` adds the baselines given what a tree can take of each user's
history: the leak-free past events, positives and positive rate of the row's user and
of its film (strictly before the rating's time, ``python -m data.histories
--aggregates``), six more columns (``logistic_regression_history``,
``lightgbm_history``). ``--sequences`` (time split) adds ``dlrm_history``: DLRM with
target attention over the histories of liked and of disliked films (``--sequence_columns
item_id_history:item_id,disliked_item_id_history:item_id --max_history 50
--din_softmax``) that knows a user by their past (the
aggregates as dense features) rather than by their id, and ``dlrm_aggregates``, the
same model without the attention. ``--reuse_logs`` reads the finished runs already in
``--work_dir`` instead of training them again.
"""

import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

import dcnv2_main
import dlrm_main
from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from data.binary.feature_spec import DEFAULT_SPEC_NAME, FeatureSpec
from data.histories import HistoryFlags, aggregate_columns, build_histories, history_column
from data.transcode import transcode
from harness.launch import eval_record, launch, read_log
from recipes import RECIPES
from training.flags import parse_config_and_source
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
ALL_MODELS = ("logistic_regression", "lightgbm", *MODELS)
SPLITS = ("random", "time")
# The time split's validation and test windows: fractions of the time range.
TIME_WINDOW = "0.1"
ROW_GROUP_ROWS = 10_000
# What each model's summary averages over the seeds.
FIGURES = ("auroc", "ne", "calibration", "log_loss", "validation_auroc")
# The goals: on the random split a network beats logistic regression by this much; with
# the history DLRM beats itself without it by this much (issue 41).
RANDOM_SPLIT_MARGIN = 0.01
HISTORY_MARGIN = 0.02
# Baseline: L2 coefficients tried, LBFGS iterations per fit.
LR_L2_GRID = (1e-6, 1e-5, 1e-4, 1e-3)
LR_ITERATIONS = 200
# LightGBM: the grid chosen from on validation, the settings every fit shares, the most
# rounds and the early-stopping patience (rounds without a better validation AUROC).
LGBM_GRID = tuple({"num_leaves": leaves, "min_data_in_leaf": least} for leaves in (15, 63) for least in (20, 200))
LGBM_FIXED = {
    "objective": "binary",
    "metric": "auc",
    "learning_rate": 0.05,
    "feature_fraction": 0.8,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "deterministic": True,
    "force_col_wise": True,
    "verbose": -1,
}
LGBM_ROUNDS = 2000
LGBM_PATIENCE = 50


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
# The film history --sequences gives DLRM (data.histories' column and its length).
HISTORY_COLUMN = history_column("item_id")
MAX_HISTORY = 50
# The films the user rated below a click, the same way: a copy of the film column
# (data.histories names a history after its item column) entering histories where the
# rating was not a click. With both, the attention sees what a user rates and does not
# like, not only what they like (docs/quality.md, "The history goal").
DISLIKED_ITEM = "disliked_item_id"
DISLIKED_LABEL = "disliked"
DISLIKED_HISTORY_COLUMN = history_column(DISLIKED_ITEM)
# The models --sequences adds: DLRM with the film history by target attention, and the
# same DLRM without the attention (what the history's aggregates alone give it). Both
# know a user by their past, not their id: 84% of the time split's test ratings are by
# users the training window never saw, whose id and zip code (about one a user) are
# untrained rows, while an id the model can learn lets it ignore the past in training
# (docs/quality.md, "The history goal").
HISTORY_MODELS = ("dlrm_history", "dlrm_aggregates")
USER_KEYS = ("user_id", "zip_code")


def write_ratings(table: Table, folder: str, extra: dict[str, np.ndarray] | None = None) -> str:
    """Writes the table's rows, in their order, as a Parquet log (every feature, its ids
    as integers, ``label``, ``time`` and ``row``, the row's index in the table, in row
    groups of `ROW_GROUP_ROWS`, and ``extra``'s columns, one value a row) in
    ``folder/ratings``, which it returns.

    Raises:
        ValueError: a table without times.
    """
    if table.times is None:
        raise ValueError("the log needs the ratings' times")
    columns: dict[str, np.ndarray] = {name: table.categorical[:, k] for k, name in enumerate(CATEGORICAL)}
    columns.update({name: table.numerical[:, k] for k, name in enumerate(NUMERICAL)})
    columns.update(
        label=table.labels.astype(np.int8), time=table.times, row=np.arange(len(table.labels), dtype=np.int64)
    )
    columns.update(extra or {})
    os.makedirs(os.path.join(folder, "ratings"), exist_ok=True)
    pq.write_table(pa.table(columns), os.path.join(folder, "ratings", "part-0.parquet"), row_group_size=ROW_GROUP_ROWS)
    return os.path.join(folder, "ratings")


def write_log(table: Table, folder: str, max_history: int = 1) -> str:
    """Writes the table's rows, in their order, as a Parquet log (``folder/ratings``:
    every feature, ``label``, ``time`` and ``row``, the row's index in the table, in row
    groups of `ROW_GROUP_ROWS`) and runs ``data.histories`` over it with the aggregates
    (the film history of ``max_history`` items, the user's and film's past counts and
    rates), then again for the history of disliked films (`DISLIKED_HISTORY_COLUMN`);
    returns the log with its histories (``folder/with_history``), the table's rows in
    the same order.

    Raises:
        ValueError: a table without times.
    """
    ratings = write_ratings(
        table,
        folder,
        {
            DISLIKED_ITEM: table.categorical[:, CATEGORICAL.index("item_id")],
            DISLIKED_LABEL: (1 - table.labels).astype(np.int8),
        },
    )
    liked = os.path.join(folder, "liked")
    build_histories(
        HistoryFlags(
            ratings,
            liked,
            "user_id",
            "item_id",
            "time",
            "label",
            max_history=max_history,
            aggregates=True,
            overwrite=True,
        )
    )
    output = os.path.join(folder, "with_history")
    build_histories(
        HistoryFlags(
            liked, output, "user_id", DISLIKED_ITEM, "time", DISLIKED_LABEL, max_history=max_history, overwrite=True
        )
    )
    return output


def read_aggregates(log: str) -> np.ndarray:
    """(rows, 6) float64: the `HISTORY_AGGREGATES` columns of a log `write_log` wrote."""
    written = pq.read_table(os.path.join(log, "part-0.parquet"), columns=HISTORY_AGGREGATES)
    return np.stack(
        [written.column(name).to_numpy(zero_copy_only=False).astype(np.float64) for name in HISTORY_AGGREGATES], axis=1
    )


def history_aggregates(table: Table, work_dir: str) -> np.ndarray:
    """(rows, 6) float64: each row's user's and film's events, positive events and
    positive rate strictly before its time (NaN without a past event), in
    `HISTORY_AGGREGATES`' order, computed by data.histories over all the table's rows
    (a test row's past is every earlier rating, as a deployed model's would be).

    Raises:
        ValueError: a table without times.
    """
    return read_aggregates(write_log(table, os.path.join(work_dir, "history")))


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


def time_order(table: Table, max_rows: int | None = None) -> np.ndarray:
    """The rows of the time split's log, oldest first (ties in row order): all of them,
    or the first ``max_rows`` of the seeded permutation."""
    assert table.times is not None, "the time split needs the ratings' times"
    rows = np.sort(np.random.default_rng(SPLIT_SEED).permutation(len(table.labels))[:max_rows])
    return rows[np.argsort(table.times[rows], kind="stable")]


def time_split_flags(log: str, cardinalities: Sequence[int]) -> list[str]:
    """The Parquet source's flags that read ``log`` as the models do: ids already dense
    (modulo tables of each feature's cardinality), numerical values as they are, and the
    latest `TIME_WINDOW` of the time range test, the one before it validation."""
    return [
        "--parquet_path",
        log,
        "--label_column",
        "label",
        "--sparse_columns",
        ",".join(CATEGORICAL),
        "--dense_columns",
        ",".join(NUMERICAL),
        "--dense_transform",
        "none",
        "--id_hashing",
        "modulo",
        "--num_embeddings_per_feature",
        ",".join(map(str, cardinalities)),
        "--time_column",
        "time",
        "--validation_window",
        TIME_WINDOW,
        "--test_window",
        TIME_WINDOW,
    ]


def history_model_flags(name: str, cardinalities: Sequence[int]) -> list[str]:
    """The flags a `HISTORY_MODELS` model adds to the time split's data flags: the
    categorical features but `USER_KEYS` (with their table sizes), the user's and film's
    past aggregates as dense features beside the numerical ones (log1p: counts reach
    hundreds; a rate without a past is null, read as 0), and for ``dlrm_history`` the
    histories of liked and of disliked films, both in the film's table, under DIN with
    softmax weights; [] for any other model."""
    if name not in HISTORY_MODELS:
        return []
    kept = [k for k, feature in enumerate(CATEGORICAL) if feature not in USER_KEYS]
    flags = [
        "--sparse_columns",
        ",".join(CATEGORICAL[k] for k in kept),
        "--num_embeddings_per_feature",
        ",".join(str(cardinalities[k]) for k in kept),
        "--dense_columns",
        ",".join([*NUMERICAL, *HISTORY_AGGREGATES]),
        "--dense_transform",
        "log1p",
    ]
    if name == "dlrm_history":  # the best validation AUROC of the variants tried (docs/quality.md)
        histories = f"{HISTORY_COLUMN}:item_id,{DISLIKED_HISTORY_COLUMN}:item_id"
        flags += ["--sequence_columns", histories, "--max_history", str(MAX_HISTORY), "--din_softmax"]
    return flags


def time_splits(data_flags: Sequence[str]) -> dict[str, np.ndarray]:
    """{train, validation, test: the ``row`` values of the log's rows in that split},
    split by the Parquet source the models' data flags (`time_split_flags`) open: the
    baselines take exactly the models' rows."""
    _, source = parse_config_and_source([*data_flags, "--recipe", RECIPE_FLAGS["recipe"]], "bench/quality.py", "")
    dataset = source.open()
    return {
        split: np.concatenate(
            [dataset.read_segment(s, ["row"]).column("row").to_numpy() for s in dataset.splits[split]]
        ).astype(np.int64)
        for split in ("train", "validation", "test")
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


def _logit_metrics(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    metrics = BinaryClassificationMetrics(torch.device("cpu"))
    metrics.update(torch.from_numpy(np.asarray(logits, dtype=np.float32)), torch.from_numpy(labels))
    return metrics.compute()


def lightgbm_baseline(
    table: Table, splits: dict[str, np.ndarray], seeds: Sequence[int], aggregates: np.ndarray | None = None
) -> list[dict[str, float]]:
    """One test result per seed of LightGBM on the categorical ids (LightGBM
    categorical features), the numerical features and, given, the raw history
    aggregates (counts, and rates that are NaN without a past). The leaves and minimum
    leaf size are those of `LGBM_GRID` with the best validation AUROC at the first seed;
    every fit stops when the validation AUROC has not risen for `LGBM_PATIENCE` rounds
    and predicts with its best round. The seed draws the rows and features each tree sees."""
    try:
        import lightgbm
    except ImportError as error:  # a dev dependency (requirements-dev.txt)
        raise RuntimeError(f"the LightGBM baseline needs lightgbm (requirements-dev.txt): {error}") from error
    features = np.concatenate(
        [table.categorical.astype(np.float64), table.numerical.astype(np.float64)]
        + ([] if aggregates is None else [aggregates]),
        axis=1,
    )

    def fit(params: dict, seed: int) -> tuple[float, dict[str, float]]:
        data = {s: (features[splits[s]], table.labels[splits[s]]) for s in ("train", "validation", "test")}
        train = lightgbm.Dataset(*data["train"], categorical_feature=list(range(len(CATEGORICAL))), free_raw_data=False)
        validation = lightgbm.Dataset(*data["validation"], reference=train)
        booster = lightgbm.train(
            {**LGBM_FIXED, **params, "seed": seed},
            train,
            num_boost_round=LGBM_ROUNDS,
            valid_sets=[validation],
            callbacks=[lightgbm.early_stopping(LGBM_PATIENCE, verbose=False)],
        )
        scores = {
            s: booster.predict(data[s][0], num_iteration=booster.best_iteration, raw_score=True)
            for s in ("validation", "test")
        }
        validation_auroc = _logit_metrics(scores["validation"], data["validation"][1])["auroc"]
        return validation_auroc, {
            **_logit_metrics(scores["test"], data["test"][1]),
            **params,
            "rounds": booster.best_iteration,
            "validation_auroc": validation_auroc,
        }

    chosen = max(LGBM_GRID, key=lambda params: fit(params, seeds[0])[0])
    return [fit(chosen, seed)[1] for seed in seeds]


def train_model(
    name: str,
    data_flags: Sequence[str],
    log_path: str,
    nproc: int,
    recipe: dict[str, str] = RECIPE_FLAGS,
    seed: int = 0,
    extra_flags: Sequence[str] = (),
    reuse_log: bool = False,
) -> dict[str, float]:
    """Trains one entry point (`MODELS`, by the name's first word: ``dlrm_history`` is
    DLRM with ``extra_flags`` naming the history) with the recipe on the data flags; its
    test metrics, with the best validation AUROC as ``validation_auroc``. With
    ``reuse_log`` a log at ``log_path`` that holds a finished run's summary is read
    instead (the caller vouches that it was run with the same flags)."""
    if reuse_log and os.path.exists(log_path):
        records = read_log(log_path)
        if any(r["event"] == "summary" for r in records):
            best = [r for r in records if r["event"] == "summary"][-1]["best_validation"]
            return {**eval_record(records, "test"), "validation_auroc": best["auroc"]}
    argv = [*data_flags, "--log_path", log_path, "--seed", str(seed), "--log_every_n_steps", "100"]
    for option, value in recipe.items():
        argv += [f"--{option}", value]
    results = launch(MODELS[name.split("_")[0]], argv + list(extra_flags), nproc=nproc)
    if any(code != 0 for code in results.values()):
        raise RuntimeError(f"{name} training failed: exit codes {results}")
    records = read_log(log_path)
    best = [r for r in records if r["event"] == "summary"][-1]["best_validation"]
    return {**eval_record(records, "test"), "validation_auroc": best["auroc"]}


def summarize(runs: Sequence[dict[str, Any]], seeds: Sequence[int] | None) -> dict[str, Any]:
    """One model's figures over its runs: each of `FIGURES` as the mean, ``*_std`` the
    sample standard deviation (0 for one run), the seeds and each seed's test AUROC;
    the first run's other fields (rows, positive rate, chosen hyper-parameters)."""
    summary: dict[str, Any] = {k: v for k, v in runs[0].items() if not isinstance(v, (dict, list))}
    for key in FIGURES:
        values = np.array([r[key] for r in runs], dtype=np.float64)
        summary[key] = float(values.mean())
        summary[f"{key}_std"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    summary["seeds"] = list(seeds) if seeds is not None else None  # None: deterministic, fitted once
    summary["auroc_per_seed"] = [float(r["auroc"]) for r in runs]
    return summary


def run(
    work_dir: str,
    max_rows: int | None = None,
    nproc: int = 1,
    recipe: dict[str, str] = RECIPE_FLAGS,
    history: bool = False,
    split: str = "random",
    seeds: Sequence[int] = (0,),
    models: Sequence[str] = ALL_MODELS,
    model_flags: Sequence[str] = (),
    sequences: bool = False,
    reuse_logs: bool = False,
) -> dict[str, dict[str, Any]]:
    """Fetches and converts the data, trains the models and the baselines; {model:
    `summarize`'s figures over ``seeds``}.

    Args:
        work_dir: holds the wheel, the converted data set and the runs' logs.
        max_rows: use only this many rows (of the seeded permutation).
        nproc: ranks per training run.
        recipe: the models' flags.
        history: also fit ``logistic_regression_history`` and ``lightgbm_history``, the
            baselines with the user's and film's leak-free past aggregates
            (`history_aggregates`).
        split: "random" or "time" (`SPLITS`).
        seeds: the training seeds of DLRM, DCNv2 and LightGBM.
        models: which of `ALL_MODELS` to run.
        model_flags: more flags of DLRM and DCNv2 (after the recipe's: they win).
        sequences: (time split) also train ``dlrm_history``, DLRM with
            ``--sequence_columns item_id_history:item_id``, and ``dlrm_aggregates``,
            the same model without the attention (`history_model_flags`).
        reuse_logs: read the finished runs' logs already in ``work_dir`` rather than
            train them again (a rerun, or a run cut short, with the same flags).

    Raises:
        ValueError: sequences on the random split, or when the entry points do not take
            ``--sequence_columns`` yet.

    Example::

        run("data_cache/quality", split="time", seeds=range(5))["dlrm"]["auroc"]
    """
    if sequences and split != "time":
        raise ValueError("--sequences needs --split time (a history is the past of a log in time order)")
    table = load_movielens(fetch_wheel(os.path.join(work_dir, "wheel")))
    if split == "time":
        table = table.take(time_order(table, max_rows))
        log = write_log(table, os.path.join(work_dir, "movielens_100k_time"), MAX_HISTORY)
        data_flags = time_split_flags(log, table.cardinalities)
        splits = time_splits(data_flags)
        aggregates = read_aggregates(log) if history else None
    else:
        splits = split_rows(len(table.labels), max_rows)
        data_flags = ["--dataset_path", write_dataset(table, splits, os.path.join(work_dir, "movielens_100k"))]
        aggregates = history_aggregates(table, work_dir) if history else None
    seeds = list(seeds)
    results: dict[str, dict[str, Any]] = {}
    if "logistic_regression" in models:
        results["logistic_regression"] = summarize([logistic_regression_baseline(table, splits)], None)
        if aggregates is not None:
            aggregated = with_history_aggregates(table, aggregates, splits["train"])
            results["logistic_regression_history"] = summarize([logistic_regression_baseline(aggregated, splits)], None)
    if "lightgbm" in models:
        results["lightgbm"] = summarize(lightgbm_baseline(table, splits, seeds), seeds)
        if aggregates is not None:
            results["lightgbm_history"] = summarize(lightgbm_baseline(table, splits, seeds, aggregates), seeds)
    trained = [name for name in MODELS if name in models] + (list(HISTORY_MODELS) if sequences else [])
    for name in trained:
        extra = [*history_model_flags(name, table.cardinalities), *model_flags]
        runs = [
            train_model(
                name,
                data_flags,
                os.path.join(work_dir, f"{name}_{split}_seed{seed}.jsonl"),
                nproc,
                recipe,
                seed,
                extra,
                reuse_logs,
            )
            for seed in seeds
        ]
        results[name] = summarize(runs, seeds)
    expected = len(splits["test"])
    for name, figures in results.items():
        if figures["num_samples"] != expected:
            raise RuntimeError(f"{name} was tested on {figures['num_samples']} rows, not the {expected} test rows")
    return results


def goals(results: dict[str, dict[str, Any]], split: str) -> dict[str, bool]:
    """The goals the figures decide (means over the seeds): on the random split each
    network >= logistic regression + `RANDOM_SPLIT_MARGIN`; on the time split each
    network >= logistic regression (no history), and DLRM with the history >= LightGBM
    with the history's aggregates and >= DLRM without it + `HISTORY_MARGIN`."""
    auroc = {name: r["auroc"] for name, r in results.items()}
    found: dict[str, bool] = {}
    if "logistic_regression" in auroc:
        margin = RANDOM_SPLIT_MARGIN if split == "random" else 0.0
        for name in MODELS:
            if name in auroc:
                found[f"{name}_vs_logistic_regression"] = auroc[name] >= auroc["logistic_regression"] + margin
    if "dlrm_history" in auroc:
        if "lightgbm_history" in auroc:
            found["dlrm_history_vs_lightgbm_history"] = auroc["dlrm_history"] >= auroc["lightgbm_history"]
        if "dlrm" in auroc:
            found["dlrm_history_vs_dlrm"] = auroc["dlrm_history"] >= auroc["dlrm"] + HISTORY_MARGIN
    return found


@dataclass
class QualityFlags:
    """The flags of ``python bench/quality.py``: what it measures and how."""

    work_dir: str = flag("data_cache/quality", help="wheel, converted data and run logs")
    split: str = flag(
        "random",
        choices=SPLITS,
        help="random: a seeded 80/10/10 permutation; time: the latest 10%% of the time range test, "
        "the 10%% before validation, from a Parquet log",
    )
    seeds: int = flag(5, help="seeds 0..N-1 of every trained model (mean +- std reported)")
    models: str = flag(",".join(ALL_MODELS), help=f"comma list of models to run, of {','.join(ALL_MODELS)}")
    max_rows: int | None = flag(None, help="use this many rows of the permutation")
    nproc: int = flag(1, help="ranks of each training run")
    history_aggregates: bool = flag(
        False, help="add the baselines given the user's and film's leak-free past counts and rates"
    )
    sequences: bool = flag(
        False, help="time split: add DLRM with target attention over the film history (--sequence_columns)"
    )
    reuse_logs: bool = flag(
        False,
        help="read a model and seed's finished run log in --work_dir instead of training it again "
        "(only when rerunning with the same flags)",
    )
    model_flags: str = flag("", help='more flags of DLRM and DCNv2, after the recipe\'s (quoted: "--embedding_dim 8")')


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), QualityFlags, argv)
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(ALL_MODELS))
    if unknown or args.seeds < 1:
        print(
            f"--models {args.models}: unknown {','.join(unknown)} (of {','.join(ALL_MODELS)})"
            if unknown
            else f"--seeds {args.seeds}: give at least 1",
            file=sys.stderr,
        )
        return 2
    try:
        results = run(
            args.work_dir,
            args.max_rows,
            args.nproc,
            history=args.history_aggregates,
            split=args.split,
            seeds=range(args.seeds),
            models=models,
            model_flags=shlex.split(args.model_flags),
            sequences=args.sequences,
            reuse_logs=args.reuse_logs,
        )
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    baseline = results.get("logistic_regression", {}).get("auroc")

    def versus(auroc: float) -> str:
        return "" if baseline is None else f"{auroc - baseline:+.4f}"

    print(
        f"{'model':<28} {'test AUROC':>17} {'vs LR':>7} {'NE':>15} {'calibration':>11} {'rows':>7} "
        f"{'validation AUROC':>16}"
    )
    for name, r in results.items():
        print(
            f"{name:<28} {r['auroc']:>8.4f} +-{r['auroc_std']:.4f} {versus(r['auroc']):>7} "
            f"{r['ne']:>6.4f} +-{r['ne_std']:.4f} {r['calibration']:>11.4f} {r['num_samples']:>7} "
            f"{r['validation_auroc']:>16.4f}"
        )
    found = goals(results, args.split)
    print(
        json.dumps(
            {
                "event": "quality",
                "data": "movielens_100k",
                "split": args.split,
                "seeds": args.seeds,
                "flags": {**RECIPE_FLAGS, "model_flags": args.model_flags},
                "recipe_settings": RECIPES[RECIPE_FLAGS["recipe"]].options(),
                "goals": found,
                "goal_met": all(found.values()) if found else None,
                **{
                    name: {
                        k: r[k]
                        for k in (*FIGURES, *(f"{f}_std" for f in FIGURES), "num_samples", "seeds", "auroc_per_seed")
                    }
                    for name, r in results.items()
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
