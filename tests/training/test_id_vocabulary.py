"""--id_hashing vocabulary: the vocabulary built from the training split alone before the
model is built, the tables sized from it (a --num_embeddings_per_feature cap keeping the
most frequent ids), and bad flags one line, exit 2."""

import numpy as np
import pyarrow.parquet as pq
import pytest

import dlrm_main
from data.parquet.id_vocabulary import IdVocabulary, count_ids
from data.synthetic_parquet import SyntheticParquetSpec, generate_synthetic_parquet
from training.flags import build_parser, config_and_source_from_args

COLUMNS = ["C1", "C3", "M1"]
TINY = [
    *("--embedding_dim", "8", "--dense_arch_layer_sizes", "16,8", "--over_arch_layer_sizes", "16,1"),
    *("--batch_size", "500", "--device", "cpu", "--time_column", "date", "--dense_columns", "I*"),
    *("--sparse_columns", ",".join(COLUMNS)),
]


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("vocabulary") / "lake")
    spec = SyntheticParquetSpec(days=3, rows_per_day=2000, files_per_day=1, row_group_rows=700, multi_hot_columns=1)
    generate_synthetic_parquet(spec, root)
    return root


def _configure(argv):
    return config_and_source_from_args(build_parser("dlrm_main.py", "").parse_args(argv))


def _training_day(lake, min_id_count, max_rows=None):
    """The vocabulary of the first day (the training split: the next two are validation and test)."""
    table = pq.read_table(f"{lake}/date=2026-11-01", columns=COLUMNS)
    return IdVocabulary.of(COLUMNS, count_ids(COLUMNS, [table]), min_id_count, max_rows)


def test_the_vocabulary_of_the_training_split_sizes_the_tables(lake, capsys):
    config, source = _configure(["--parquet_path", lake, *TINY, "--id_hashing", "vocabulary", "--min_id_count", "3"])
    expected = _training_day(lake, 3)
    vocabulary = source.vocabulary()
    assert [k.tolist() for k in vocabulary.kept] == [k.tolist() for k in expected.kept]
    assert [r.tolist() for r in vocabulary.rare] == [r.tolist() for r in expected.rare]
    assert config.model.num_embeddings_per_feature == expected.table_sizes
    assert all(len(r) for r in expected.rare)  # rare ids exist: they read row 0
    out = capsys.readouterr().out
    assert f"--num_embeddings_per_feature {','.join(map(str, expected.table_sizes))}" in out


def test_num_embeddings_per_feature_caps_the_tables(lake):
    cap = [50, 10_000, 200]
    argv = ["--parquet_path", lake, *TINY, "--id_hashing", "vocabulary", "--num_embeddings_per_feature"]
    config, _ = _configure([*argv, ",".join(map(str, cap))])
    expected = _training_day(lake, 1, cap)
    uncapped = _training_day(lake, 1)
    assert config.model.num_embeddings_per_feature == expected.table_sizes
    sizes = expected.table_sizes
    assert sizes[0] == 50 and sizes[2] == 200 and sizes[1] == uncapped.table_sizes[1] < 10_000
    assert np.isin(expected.kept[0], uncapped.kept[0]).all()


def run_main(capsys, argv):
    try:
        code = dlrm_main.main(argv)
    except SystemExit as e:
        code = e.code
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--min_id_count", "3"], "--min_id_count builds a vocabulary of the training split's ids: it needs"),
        (["--id_hashing", "vocabulary", "--min_id_count", "0"], "--min_id_count must be at least 1, got 0"),
        (["--id_hashing", "vocabulary", "--num_embeddings", "auto"], "it needs --id_hashing hash"),
        (
            ["--id_hashing", "vocabulary", "--validation_window", "1d", "--test_window", "2d"],
            "the train split has no rows",
        ),
        (["--id_hashing", "vocabulary", "--rolling_windows", "2"], "vocabulary is built from one training split"),
    ],
)
def test_bad_vocabulary_flags_are_one_line_exit_2(lake, capsys, argv, message):
    code, err = run_main(capsys, ["--parquet_path", lake, *TINY, *argv])
    assert code == 2 and len(err) == 1 and message in err[0], err
