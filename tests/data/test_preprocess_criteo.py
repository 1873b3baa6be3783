"""Raw Criteo TSV -> binary layout: values, thresholds, modulo, bad lines, resume."""

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from common.errors import BadInput
from data.binary.criteo_layout import NUM_DENSE_FEATURES, NUM_SPARSE_FEATURES, read_metadata
from data.preprocess.criteo_transforms import VOCABULARY_FILE, read_vocabulary
from data.preprocess_criteo import PreprocessConfig, main, preprocess
from data.synthetic_criteo import SyntheticCriteoSpec, write_raw_day
from data.text.criteo_tsv import parse_criteo_lines
from harness.launch import REPO

RNG = np.random.default_rng(11)


def random_line(rng, hashes=None) -> list:
    ints = [("" if rng.random() < 0.2 else str(int(rng.integers(-3, 5000)))) for _ in range(NUM_DENSE_FEATURES)]
    cats = hashes or [
        ("" if rng.random() < 0.1 else f"{int(rng.integers(0, 2**32)):08x}") for _ in range(NUM_SPARSE_FEATURES)
    ]
    return [str(int(rng.integers(0, 2)))] + ints + cats


def write_day(path: str, lines: list) -> None:
    text = "".join("\t".join(fields) + "\n" for fields in lines).encode()
    if path.endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(text)
    else:
        with open(path, "wb") as f:
            f.write(text)


def reference(fields: list):
    """The documented transforms, line by line in plain Python."""
    dense = [np.float32(np.log(max(int(v or "0"), 0) + 3.0)) for v in fields[1:14]]
    hashes = [int(v or "0", 16) for v in fields[14:]]
    return int(fields[0]), dense, hashes


@pytest.fixture
def raw_days(tmp_path):
    days = [[random_line(RNG) for _ in range(n)] for n in (50, 37, 20)]
    names = ["day_0", "day_1.gz", "day_2"]
    raw = tmp_path / "raw"
    raw.mkdir()
    for name, lines in zip(names, days):
        write_day(str(raw / name), lines)
    return str(raw), days


def load_day(out: str, day: int):
    return tuple(np.load(os.path.join(out, f"day_{day}_{k}.npy")) for k in ("dense", "sparse", "labels"))


def test_values_match_the_documented_transforms(raw_days, tmp_path):
    raw, days = raw_days
    out = str(tmp_path / "out")
    metadata = preprocess(PreprocessConfig(raw, out, "criteo_1t", chunk_bytes=1024))
    assert metadata.rows_per_day == [50, 37, 20]
    max_ids = np.zeros(NUM_SPARSE_FEATURES, np.int64)
    for day, lines in enumerate(days):
        dense, sparse, labels = load_day(out, day)
        assert dense.dtype == np.float32 and sparse.dtype == np.int32 and labels.shape == (len(lines), 1)
        for row, fields in enumerate(lines):
            label, ref_dense, ref_hashes = reference(fields)
            assert labels[row, 0] == label
            assert np.array_equal(dense[row], np.asarray(ref_dense, np.float32))
            assert sparse[row].tolist() == [h & 0x7FFFFFFF for h in ref_hashes]
        max_ids = np.maximum(max_ids, sparse.max(axis=0))
    assert metadata.num_embeddings_per_feature == (max_ids + 1).tolist()
    assert metadata.bad_lines == {"day_0": 0, "day_1.gz": 0, "day_2": 0}
    assert not [f for f in os.listdir(out) if "tmp" in f]


def test_frequency_threshold_and_modulo_on_known_counts(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    a, b, c, d = "0000000a", "000000b0", "00000c00", "0000d000"
    other = ["00000001"] * 25
    # feature 0 over the training days: a x3, b x1, c x2; the test day adds d (unseen)
    write_day(str(raw / "day_0"), [random_line(RNG, [h] + other) for h in (a, b, c)])
    write_day(str(raw / "day_1"), [random_line(RNG, [h] + other) for h in (a, a, c)])
    write_day(str(raw / "day_2"), [random_line(RNG, [h] + other) for h in (a, b, c, d)])
    out = str(tmp_path / "t2")
    metadata = preprocess(PreprocessConfig(str(raw), out, "criteo_1t", frequency_threshold=2))
    # kept: a and c, numbered by hash order from 1; b (seen once) and d (unseen) -> 0
    assert metadata.num_embeddings_per_feature[0] == 3
    assert load_day(out, 0)[1][:, 0].tolist() == [1, 0, 2]
    assert load_day(out, 2)[1][:, 0].tolist() == [1, 0, 2, 0]
    assert metadata.num_embeddings_per_feature[1] == 2  # "00000001" seen 6 times
    vocabulary = np.load(os.path.join(out, "vocabulary.npz"))
    assert vocabulary["0"].tolist() == [0xA, 0xC00]

    sizes = [7] * NUM_SPARSE_FEATURES
    out = str(tmp_path / "mod")
    metadata = preprocess(PreprocessConfig(str(raw), out, "criteo_1t", num_embeddings_per_feature=sizes))
    assert load_day(out, 2)[1][:, 0].tolist() == [0xA % 7, 0xB0 % 7, 0xC00 % 7, 0xD000 % 7]
    assert metadata.num_embeddings_per_feature == sizes
    out = str(tmp_path / "both")
    metadata = preprocess(
        PreprocessConfig(
            str(raw), out, "criteo_1t", frequency_threshold=2, num_embeddings_per_feature=[2] * NUM_SPARSE_FEATURES
        )
    )
    assert load_day(out, 0)[1][:, 0].tolist() == [1, 0, 0]  # ids 1, 0, 2 modulo 2
    assert metadata.num_embeddings_per_feature[0] == 2


def test_bad_lines_error_names_file_and_line(raw_days, tmp_path, capsys):
    raw, days = raw_days
    lines = [random_line(RNG) for _ in range(5)]
    lines[3][5] = "12x"
    write_day(os.path.join(raw, "day_2"), lines)
    code = main(["--input_dir", raw, "--output_dir", str(tmp_path / "o"), "--dataset_name", "criteo_1t"])
    err = [l for l in capsys.readouterr().err.splitlines() if "error" in l]  # tqdm also writes to stderr
    assert code == 2 and len(err) == 1
    assert err[0] == (
        f"preprocess_criteo: error: {os.path.join(raw, 'day_2')} line 4: integer feature 4 is not a decimal integer"
    )
    # the days that finished are complete; the failed one left no file behind
    assert not os.path.exists(tmp_path / "o" / "day_2_dense.npy")
    assert not [f for f in os.listdir(tmp_path / "o") if "tmp" in f]


def test_bad_lines_skip_counts_per_file(raw_days, tmp_path):
    raw, days = raw_days
    lines = [random_line(RNG) for _ in range(6)]
    lines[0] = lines[0][:20]  # too few fields
    lines[2][0] = "7"  # label
    lines[4][30] = "xyz"  # not hex
    write_day(os.path.join(raw, "day_2"), lines)
    metadata = preprocess(PreprocessConfig(raw, str(tmp_path / "o"), "criteo_1t", on_bad_lines="skip"))
    assert metadata.bad_lines == {"day_0": 0, "day_1.gz": 0, "day_2": 3}
    assert metadata.rows_per_day[2] == 3
    kept = [lines[i] for i in (1, 3, 5)]
    dense, sparse, labels = load_day(str(tmp_path / "o"), 2)
    assert labels[:, 0].tolist() == [reference(f)[0] for f in kept]
    on_disk = json.load(open(tmp_path / "o" / "metadata.json"))
    assert on_disk["bad_lines"]["day_2"] == 3


def test_parser_reasons():
    good = ["1"] + ["2"] * NUM_DENSE_FEATURES + ["0000000f"] * NUM_SPARSE_FEATURES
    lines = [
        good,
        good[:39],
        ["x"] + good[1:],
        good[:3] + ["-"] + good[4:],
        good[:20] + ["123456789"] + good[21:],
        good[:5] + ["1" * 23] + good[6:],
    ]
    chunk = parse_criteo_lines("".join("\t".join(l) + "\n" for l in lines).encode())
    assert chunk.num_lines == 6 and len(chunk.labels) == 1
    assert chunk.bad_lines == [
        (1, "expected 40 tab-separated fields, found 39"),
        (2, "label must be 0 or 1"),
        (3, "integer feature 2 is not a decimal integer"),
        (4, "categorical feature 6 is not a hexadecimal hash"),
        (5, "integer feature 4 is out of range: 23 digits (at most 18)"),
    ]


# Fields that exercise the parser's slow paths and rejections.
_ODD_FIELDS = [
    b"",
    b"-",
    b"--5",
    b"+5",
    b" 5",
    b"5 ",
    b"\r",
    b"\x00",
    b"\x08",
    b"\x0b",
    b"\xff",
    b"1a",
    b":",
    b"/",
    b"9" * 19,
    b"-" + b"9" * 18,
    b"-" + b"9" * 19,
    b"0" * 19,
    b"-0",
    b"g",
    b"ABCDEF12",
    b"abcdef123",
    b"12 45678",
    b"0a0b0c\r",
]
_INT = re.compile(rb"-?[0-9]{1,18}")
_HEX = re.compile(rb"[0-9a-fA-F]{1,8}")


def _random_int_field(rng) -> bytes:
    """1 to 18 digits, sometimes zero-padded; 1 in 8 empty, 1 in 8 negative."""
    digits = int(rng.integers(1, 19))
    text = str(int(rng.integers(0, 10**digits))).zfill(int(rng.integers(0, digits + 1))).encode()
    kind = int(rng.integers(0, 8))
    return b"" if kind == 0 else b"-" + text if kind == 1 else text


def _random_hex_field(rng) -> bytes:
    """8 hex digits; 1 in 8 empty, 1 in 8 shorter, 1 in 8 upper case."""
    text = b"%08x" % int(rng.integers(0, 2**32))
    kind = int(rng.integers(0, 8))
    return b"" if kind == 0 else text[: int(rng.integers(1, 8))] if kind == 1 else text.upper() if kind == 2 else text


def _random_raw_line(rng, p_odd: float) -> bytes:
    """A line whose fields are each odd with probability p_odd, which has a wrong field
    count with probability p_odd, and ends in CRLF 1 time in 10."""
    fields = [str(int(rng.integers(0, 2))).encode()]
    fields += [_random_int_field(rng) for _ in range(NUM_DENSE_FEATURES)] + [
        _random_hex_field(rng) for _ in range(NUM_SPARSE_FEATURES)
    ]
    fields = [_ODD_FIELDS[int(rng.integers(len(_ODD_FIELDS)))] if rng.random() < p_odd else f for f in fields]
    if rng.random() < p_odd:
        fields = fields[: int(rng.integers(0, 40))] if rng.random() < 0.5 else fields + [b"1"]
    return b"\t".join(fields) + (b"\r\n" if rng.random() < 0.1 else b"\n")


def _first_bad(values: list, pattern: re.Pattern):
    """Index of the first non-empty value that does not match, or None."""
    return next((k for k, v in enumerate(values) if v and not pattern.fullmatch(v)), None)


def _reference_parse(data: bytes):
    """(dense, hashes, labels, bad lines) of raw lines, line by line in plain Python."""
    dense, hashes, labels, bad = [], [], [], []
    if data and not data.endswith(b"\n"):
        data += b"\n"
    for i, line in enumerate(data.split(b"\n")[:-1]):
        fields = (line[:-1] if line.endswith(b"\r") else line).split(b"\t")
        if len(fields) != 40:
            bad.append((i, f"expected 40 tab-separated fields, found {len(fields)}"))
        elif fields[0] not in (b"0", b"1"):
            bad.append((i, "label must be 0 or 1"))
        elif _first_bad(fields[1:14], _INT) is not None:
            k = _first_bad(fields[1:14], _INT)
            digits = fields[1 + k].removeprefix(b"-")
            bad.append(
                (
                    i,
                    f"integer feature {k} is out of range: {len(digits)} digits (at most 18)"
                    if len(digits) > 18 and digits.isdigit()
                    else f"integer feature {k} is not a decimal integer",
                )
            )
        elif _first_bad(fields[14:], _HEX) is not None:
            bad.append((i, f"categorical feature {_first_bad(fields[14:], _HEX)} is not a hexadecimal hash"))
        else:
            labels.append(int(fields[0]))
            dense.append([int(v or b"0") for v in fields[1:14]])
            hashes.append([int(v or b"0", 16) for v in fields[14:]])
    return (
        np.array(dense, np.int64).reshape(-1, NUM_DENSE_FEATURES),
        np.array(hashes, np.uint32).reshape(-1, NUM_SPARSE_FEATURES),
        np.array(labels, np.int32),
        bad,
    )


@pytest.mark.parametrize("p_odd", [0.0, 0.003, 0.05, 0.5])
def test_parser_matches_a_plain_python_parser(p_odd):
    """Random chunks with every field shape: 8-digit and longer, negative and zero-padded
    integers, short and upper-case hashes, CRLF, odd bytes, wrong field counts."""
    rng = np.random.default_rng(int(p_odd * 1000))
    for _ in range(40):
        data = b"".join(_random_raw_line(rng, p_odd) for _ in range(int(rng.integers(0, 80))))
        if data and rng.random() < 0.2:
            data = data[:-1]  # no final newline
        chunk = parse_criteo_lines(data)
        dense, hashes, labels, bad = _reference_parse(data)
        assert chunk.bad_lines == bad
        assert chunk.num_lines == data.count(b"\n") + (bool(data) and not data.endswith(b"\n"))
        np.testing.assert_array_equal(chunk.dense_raw, dense)
        np.testing.assert_array_equal(chunk.sparse_hash, hashes)
        np.testing.assert_array_equal(chunk.labels, labels)
        assert (chunk.dense_raw.dtype, chunk.sparse_hash.dtype, chunk.labels.dtype) == (np.int64, np.uint32, np.int32)


def test_kaggle_is_cut_into_consecutive_days(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    lines = [random_line(RNG) for _ in range(75)]
    for name in ("train.txt", "train.txt.gz"):
        for f in raw.iterdir():
            f.unlink()
        write_day(str(raw / name), lines)
        out = str(tmp_path / name)
        metadata = preprocess(PreprocessConfig(str(raw), out, "criteo_kaggle", chunk_bytes=2048))
        assert metadata.rows_per_day == [75 * (d + 1) // 7 - 75 * d // 7 for d in range(7)]
        labels = np.concatenate([load_day(out, d)[2][:, 0] for d in range(7)])
        assert labels.tolist() == [int(l[0]) for l in lines]


def _outputs(directory: str) -> dict:
    return {
        name: open(os.path.join(directory, name), "rb").read()
        for name in sorted(os.listdir(directory))
        if name.endswith(".npy") or name == "metadata.json"
    }


@pytest.mark.slow
def test_killed_run_resumes_to_identical_files(tmp_path):
    spec = SyntheticCriteoSpec(num_days=4, rows_per_day=60_000, seed=5)
    raw = tmp_path / "raw"
    raw.mkdir()
    for day in range(spec.num_days):
        write_raw_day(spec, str(raw / f"day_{day}"), day)
    args = [
        "--input_dir",
        str(raw),
        "--dataset_name",
        "criteo_1t",
        "--frequency_threshold",
        "2",
        "--chunk_bytes",
        "1048576",
    ]
    clean = str(tmp_path / "clean")
    assert main(args + ["--output_dir", clean]) == 0

    killed = str(tmp_path / "killed")
    proc = subprocess.Popen(
        [sys.executable, "-m", "data.preprocess_criteo", *args, "--output_dir", killed],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(killed, "day_0.done.json")) and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not os.path.exists(os.path.join(killed, "metadata.json"))
    done = {name for name in os.listdir(killed) if name.endswith(".done.json")}
    assert "day_0.done.json" in done and "day_3.done.json" not in done
    for name in os.listdir(killed):  # every file under a final name is whole
        if name.endswith(".npy"):
            np.load(os.path.join(killed, name))
    assert main(args + ["--output_dir", killed]) == 0
    assert _outputs(killed) == _outputs(clean)


def test_bad_arguments_are_one_line(tmp_path, capsys):
    assert (
        main(
            ["--input_dir", str(tmp_path / "none"), "--output_dir", str(tmp_path / "o"), "--dataset_name", "criteo_1t"]
        )
        == 2
    )
    assert "no such directory" in capsys.readouterr().err
    assert main(["--input_dir", str(tmp_path), "--output_dir", str(tmp_path / "o"), "--dataset_name", "criteo_1t"]) == 2
    assert "no day_<N> or day_<N>.gz files" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(
            [
                "--input_dir",
                str(tmp_path),
                "--output_dir",
                "o",
                "--dataset_name",
                "criteo_1t",
                "--num_embeddings_per_feature",
                "1,,2",
            ]
        )
    assert e.value.code == 2


@pytest.mark.slow
def test_parallel_workers_write_the_same_files(raw_days, tmp_path):
    raw, _ = raw_days
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    preprocess(PreprocessConfig(raw, one, "criteo_1t", frequency_threshold=1))
    preprocess(PreprocessConfig(raw, two, "criteo_1t", frequency_threshold=1, workers=2))
    assert _outputs(one) == _outputs(two)


@pytest.mark.slow
def test_two_ranks_learn_from_preprocessed_raw_logs(tmp_path):
    """Raw TSV of the learnable generator -> preprocessing with a threshold -> 2-rank run."""
    import dlrm_main
    from harness.launch import eval_record, launch, read_log

    spec = SyntheticCriteoSpec(
        num_days=3,
        rows_per_day=20_000,
        seed=9,
        cardinalities=[min(c, 1000) for c in SyntheticCriteoSpec().cardinalities],
    )
    raw = tmp_path / "raw"
    raw.mkdir()
    for day in range(spec.num_days):
        write_raw_day(spec, str(raw / (f"day_{day}.gz" if day == 1 else f"day_{day}")), day)
    out = str(tmp_path / "out")
    metadata = preprocess(PreprocessConfig(str(raw), out, "criteo_1t", frequency_threshold=3))
    log = str(tmp_path / "log.jsonl")
    assert launch(
        dlrm_main.main,
        [
            "--in_memory_binary_criteo_path",
            out,
            "--batch_size",
            "256",
            "--embedding_dim",
            "16",
            "--dense_arch_layer_sizes",
            "64,16",
            "--over_arch_layer_sizes",
            "64,32,1",
            "--optimizer",
            "adagrad",
            "--learning_rate",
            "0.05",
            "--log_path",
            log,
            "--seed",
            "1",
        ],
    ) == {0: 0, 1: 0}
    records = read_log(log)
    config = [r for r in records if r["event"] == "config"][0]
    assert config["model"]["num_embeddings_per_feature"] == metadata.num_embeddings_per_feature
    test = eval_record(records, "test")
    assert test["auroc"] > 0.6 and test["num_samples"] == 10_000


def _run(raw: str, out: str, capsys, *extra: str):
    """(exit code, stderr) of the command line on raw/ into out/."""
    code = main(["--input_dir", raw, "--output_dir", out, "--dataset_name", "criteo_1t", *extra])
    return code, capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar


def test_damaged_gz_is_one_line_naming_the_file(raw_days, tmp_path, capsys):
    """Preprocessing and predict (which reads its input through iter_line_chunks)."""
    from data.text.text_lines import DaySource, iter_line_chunks

    raw, _ = raw_days
    path = os.path.join(raw, "day_1.gz")
    data = open(path, "rb").read()
    for broken, reason in (
        (data[: len(data) // 2], "truncated (the compressed data ends early)"),
        (b"plain text, not gzip\n", "not valid gzip data (Not a gzipped file (b'pl'))"),
    ):
        with open(path, "wb") as f:
            f.write(broken)
        assert _run(raw, str(tmp_path / "o"), capsys) == (2, f"preprocess_criteo: error: {path}: {reason}")
        with pytest.raises(BadInput) as error:
            list(iter_line_chunks(DaySource(0, path), 1024))
        assert str(error.value) == f"{path}: {reason}"


def test_full_disk_names_the_file(raw_days, tmp_path, capsys):
    raw, _ = raw_days
    out = tmp_path / "o"
    out.mkdir()
    os.symlink("/dev/full", out / "day_0_dense.npy.tmp")  # every write to it fails with ENOSPC
    code, err = _run(raw, str(out), capsys)
    assert (code, err) == (
        2,
        f"preprocess_criteo: error: {out}/day_0_dense.npy.tmp: cannot write (No space left on device)",
    )
    assert not [name for name in os.listdir(out) if name.endswith((".tmp", ".npy"))]


def test_empty_input_is_refused(raw_days, tmp_path, capsys):
    raw, _ = raw_days
    open(os.path.join(raw, "day_2"), "w").close()
    assert _run(raw, str(tmp_path / "o"), capsys) == (
        2,
        f"preprocess_criteo: error: {raw}/day_2: no lines; every day needs rows (the last one is validation and test)",
    )
    assert not os.path.exists(tmp_path / "o" / "metadata.json")
    kaggle = tmp_path / "kaggle"
    kaggle.mkdir()
    write_day(str(kaggle / "train.txt"), [random_line(RNG) for _ in range(3)])
    code = main(["--input_dir", str(kaggle), "--output_dir", str(tmp_path / "k"), "--dataset_name", "criteo_kaggle"])
    assert (code, capsys.readouterr().err.strip().splitlines()[-1]) == (
        2,
        f"preprocess_criteo: error: {kaggle}/train.txt: 3 lines, fewer than the 7 days (--kaggle_days) it is cut into",
    )


def test_rerun_rewrites_a_truncated_day_and_removes_what_it_no_longer_owns(raw_days, tmp_path, capsys):
    raw, _ = raw_days
    out = str(tmp_path / "o")
    assert _run(raw, out, capsys, "--frequency_threshold", "1")[0] == 0
    clean = _outputs(out)
    sparse = os.path.join(out, "day_1_sparse.npy")
    with open(sparse, "r+b") as f:
        f.truncate(os.path.getsize(sparse) - 104)  # one row short, its done marker intact
    assert _run(raw, out, capsys, "--frequency_threshold", "1")[0] == 0
    assert _outputs(out) == clean
    # Fewer days, no vocabulary: the earlier run's last day and vocabulary go.
    os.remove(os.path.join(raw, "day_2"))
    assert _run(raw, out, capsys)[0] == 0
    assert sorted(os.listdir(out)) == sorted(
        [f"day_{d}_{k}.npy" for d in range(2) for k in ("dense", "sparse", "labels")]
        + ["day_0.done.json", "day_1.done.json", "metadata.json"]
    )


def test_vocabulary_of_a_training_run_applies_its_ids_to_a_new_day(tmp_path, capsys):
    rng = np.random.default_rng(3)
    raw = tmp_path / "raw"
    raw.mkdir()
    for day in range(3):  # hashes from a small pool: most are seen twice and kept
        write_day(
            str(raw / f"day_{day}"),
            [
                random_line(rng, ["%08x" % (0xA0000000 + int(rng.integers(0, 20))) for _ in range(NUM_SPARSE_FEATURES)])
                for _ in range(40)
            ],
        )
    raw = str(raw)
    trained = str(tmp_path / "train_bin")
    sizes = [7] * NUM_SPARSE_FEATURES
    preprocess(PreprocessConfig(raw, trained, "criteo_1t", frequency_threshold=2, num_embeddings_per_feature=sizes))
    # The new day: known hashes, hashes never kept, empty fields.
    vocabulary = read_vocabulary(os.path.join(trained, VOCABULARY_FILE), NUM_SPARSE_FEATURES)
    new_lines = [
        random_line(
            rng,
            [
                f"{vocabulary[f][i % len(vocabulary[f])]:08x}"
                if len(vocabulary[f]) and i % 3
                else ""
                if i % 2
                else f"{0xF0000000 + i:08x}"
                for f in range(NUM_SPARSE_FEATURES)
            ],
        )
        for i in range(12)
    ]
    new_raw = tmp_path / "new_raw"
    new_raw.mkdir()
    write_day(str(new_raw / "day_0"), new_lines)
    scored = str(tmp_path / "new_bin")
    assert (
        main(
            [
                "--input_dir",
                str(new_raw),
                "--output_dir",
                scored,
                "--dataset_name",
                "criteo_1t",
                "--vocabulary",
                trained,
            ]
        )
        == 0
    )
    _, sparse, labels = load_day(scored, 0)
    hashes = np.array([reference(fields)[2] for fields in new_lines], np.uint32)
    # The training run's ids: vocabulary position + 1 (0 for a hash it did not keep), modulo its sizes.
    expected = [
        [
            (int(np.searchsorted(vocabulary[f], h)) + 1 if h in set(vocabulary[f].tolist()) else 0) % 7
            for f, h in enumerate(row)
        ]
        for row in hashes
    ]
    assert sparse.tolist() == expected and np.count_nonzero(expected) > 100
    assert labels[:, 0].tolist() == [reference(fields)[0] for fields in new_lines]
    new_metadata, old_metadata = read_metadata(scored), read_metadata(trained)
    assert new_metadata.num_embeddings_per_feature == old_metadata.num_embeddings_per_feature
    assert (new_metadata.frequency_threshold, new_metadata.vocabulary_from) == (2, trained)
    copied = read_vocabulary(os.path.join(scored, VOCABULARY_FILE), NUM_SPARSE_FEATURES)
    assert all(np.array_equal(a, b) for a, b in zip(copied, vocabulary))
    capsys.readouterr()

    # Settings that the training run fixes, or a directory that is not one, are refused in one line.
    for extra, message in (
        (
            ["--vocabulary", trained, "--frequency_threshold", "3"],
            "--vocabulary takes the frequency threshold and table sizes of the training run: do not "
            "give --frequency_threshold or --num_embeddings_per_feature with it",
        ),
        (
            ["--vocabulary", str(new_raw)],
            f"--vocabulary {new_raw}: no metadata.json; give the --output_dir of the "
            "preprocess_criteo run that made the training data",
        ),
    ):
        assert (
            main(
                [
                    "--input_dir",
                    str(new_raw),
                    "--output_dir",
                    str(tmp_path / "x"),
                    "--dataset_name",
                    "criteo_1t",
                    *extra,
                ]
            )
            == 2
        )
        assert capsys.readouterr().err.strip() == f"preprocess_criteo: error: {message}"
