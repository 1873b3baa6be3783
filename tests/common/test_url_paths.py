"""Credentials never leave the environment: a URL with user-info or a secret query
parameter is refused in one line that masks them, and a run on a local S3 server
(moto) with its credentials in the environment writes them nowhere (console, JSON
log, checkpoint, exported model, predictions)."""

import os
import subprocess
import sys

import pyarrow.fs as pafs
import pytest

from common.errors import BadInput
from common.url_paths import ALLOWED_QUERY, check_url_path, redacted, redacted_record, redacted_text
from harness.launch import REPO, read_log, run_script

KEY_ID = "AKIAPLANTEDKEY4TEST"
SECRET = "planted/Secret+Key0987654321abcdefXYZ"
TOKEN = "plantedSessionToken5555"


def test_redacted_masks_user_info_and_every_query_value_but_the_allowed_options():
    assert (
        redacted(f"s3://{KEY_ID}:{SECRET}@clicks/log?region=eu-west-1&secret_key={SECRET}")
        == "s3://***@clicks/log?region=eu-west-1&secret_key=***"
    )
    assert (
        redacted("https://host/t.parquet?X-Amz-Signature=abc#part") == "https://host/t.parquet?X-Amz-Signature=***#***"
    )
    for plain in (
        "/data/clicks/*.parquet",
        "lake/date=2026-11-01/[ab]*.parquet",
        "s3://clicks/log/**/*.parquet",
        "gs://b/log?scheme=http&endpoint_override=127.0.0.1:9000",
    ):
        assert redacted(plain) == plain
    line = f"dlrm_main.py: error: --parquet_path 's3://{KEY_ID}:{SECRET}@b/x?session_token={TOKEN}': gone"
    assert redacted_text(line) == "dlrm_main.py: error: --parquet_path 's3://***@b/x?session_token=***': gone"
    once = redacted_text(line)
    assert redacted_text(once) == once  # a line said twice keeps its punctuation
    record = {"data": {"parquet_path": f"s3://k:{SECRET}@b"}, "steps": [1, f"gs://b?x={SECRET}"], "n": 3}
    assert redacted_record(record) == {"data": {"parquet_path": "s3://***@b"}, "steps": [1, "gs://b?x=***"], "n": 3}


@pytest.mark.parametrize(
    "url, refusal",
    [
        (
            f"s3://{KEY_ID}:{SECRET}@clicks/log",
            "s3://***@clicks/log: credentials in a URL (user-info before @) are refused",
        ),
        (
            f"s3://clicks/log?region=us-east-1&secret_key={SECRET}",
            "s3://clicks/log?region=us-east-1&secret_key=***: query parameter secret_key is refused",
        ),
        (f"hdfs://namenode:8020/log?kerb_ticket={SECRET}", "query parameter kerb_ticket is refused"),
    ],
)
def test_a_url_with_credentials_is_refused_masked(url, refusal):
    with pytest.raises(BadInput) as error:
        check_url_path(url, "--parquet_path")
    assert refusal in str(error.value) and "AWS_PROFILE" in str(error.value)
    assert SECRET not in str(error.value) and KEY_ID not in str(error.value)


def test_the_allowed_query_options_are_ones_pyarrow_takes():
    """Each allowed option is one pyarrow's S3, GCS or HDFS filesystem reads from a URL
    (else the allow-list would let an unknown, maybe secret, parameter through)."""
    for url in (
        "s3://bucket/key?region=eu-west-1&scheme=http&endpoint_override=127.0.0.1:1",
        "gs://bucket/key?retry_limit_seconds=1&project_id=p&scheme=http&endpoint_override=127.0.0.1:1",
    ):
        pafs.FileSystem.from_uri(url)
        assert {pair.split("=")[0] for pair in url.split("?")[1].split("&")} <= ALLOWED_QUERY
    for secret in ("access_key", "secret_key", "session_token", "kerb_ticket", "credentials"):
        assert secret not in ALLOWED_QUERY


def test_a_sweep_refuses_credentials_in_its_flags(tmp_path):
    from sweeps.spec import SweepError, load_sweep
    from sweeps.training_flags import run_commands

    spec = tmp_path / "sweep.yaml"
    # slurm: the whole configuration is not checked on this host (its data is elsewhere), the URLs are.
    spec.write_text(
        f"name: s\nscript: dlrm_main.py\nscheduler: slurm\nnnodes: 1\nnproc_per_node: 1\n"
        f"output_dir: {tmp_path}/out\nflags:\n  parquet_path: s3://{KEY_ID}:{SECRET}@b/log\n"
        "  sparse_columns: C1\ngrid:\n  learning_rate: [0.1, 0.2]\n"
    )
    with pytest.raises(SweepError) as error:
        run_commands(load_sweep(str(spec)))
    assert "flags.parquet_path: --parquet_path s3://***@b/log: credentials in a URL" in str(error.value)
    assert SECRET not in str(error.value)


def _files_holding(root: str, needles: list[bytes]) -> list[str]:
    found = []
    for directory, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(directory, name), "rb") as f:
                data = f.read()
            found += [f"{os.path.join(directory, name)}: {n!r}" for n in needles if n in data]
    return found


def test_a_file_holding_a_credential_is_found(tmp_path):
    """Positive control of the search the test below ends with: a secret deep in a
    directory tree, inside binary data, is found and named."""
    (tmp_path / "ckpt" / "0").mkdir(parents=True)
    (tmp_path / "ckpt" / "0" / "shard.bin").write_bytes(b"\x00\x01" + SECRET.encode() + b"\xff")
    (tmp_path / "log.jsonl").write_text("{}\n")
    assert _files_holding(str(tmp_path), [KEY_ID.encode(), SECRET.encode()]) == [
        f"{tmp_path / 'ckpt' / '0' / 'shard.bin'}: {SECRET.encode()!r}"
    ]


@pytest.mark.slow
def test_no_output_of_a_run_holds_the_credentials(tmp_path, monkeypatch):
    from tests.data.test_parquet_source_training import TINY, write_click_log
    from tests.support.s3 import s3_serving
    from tests.support.sweeps import sweeps, write_sweep

    table = str(tmp_path / "table")
    write_click_log(table)
    out = tmp_path / "out"
    out.mkdir()
    console = []
    with s3_serving(
        table, monkeypatch, {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_SESSION_TOKEN": TOKEN}
    ) as port:
        # The endpoint in the URL's allowed options; the credentials in the environment.
        url = f"s3://clicks/log?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
        flags = [
            *TINY,
            "--log_path",
            str(out / "log.jsonl"),
            "--checkpoint_dir",
            str(out / "ckpt"),
            "--checkpoint_at_epoch_end",
        ]
        train = run_script(["dlrm_main.py", "--parquet_path", url, *flags], timeout=300)
        console += [train.stdout, train.stderr]
        assert train.returncode == 0, train.stderr[-3000:]
        assert f"data: {url} |" in train.stdout
        commands = [
            [
                "-m",
                "serving.export",
                "--checkpoint",
                str(out / "ckpt"),
                "--output",
                str(out / "model"),
                "--quantize",
                "none",
            ],
            [
                "-m",
                "serving.predict",
                "--model",
                str(out / "model"),
                "--input",
                url,
                "--output",
                str(out / "scores.parquet"),
                "--metrics_output",
                str(out / "metrics.json"),
            ],
            ["-m", "training.report", str(out / "log.jsonl"), "--output", str(out / "run.png")],
        ]
        for command in commands:
            proc = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=300)
            console += [proc.stdout, proc.stderr]
            assert proc.returncode == 0, proc.stderr[-3000:]
        # A sweep of one run on the same URL: its run.json, log and results files.
        sweep = write_sweep(
            tmp_path / "sweep.yaml",
            nproc_per_node=1,
            output_dir=str(out / "sweep"),
            flags={"parquet_path": url, **{k[2:]: v for k, v in zip(TINY[::2], TINY[1::2])}},
            grid={"learning_rate": [0.05]},
        )
        proc = sweeps(["run", sweep])
        console += [proc.stdout, proc.stderr]
        assert proc.returncode == 0, proc.stderr[-3000:]
        # The same run and predict with the credentials in the URL: refused before anything is written.
        leaky = f"s3://{KEY_ID}:{SECRET}@clicks/log?region=us-east-1&session_token={TOKEN}"
        refused = run_script(
            [
                "dlrm_main.py",
                "--parquet_path",
                leaky,
                *TINY,
                "--log_path",
                str(out / "refused.jsonl"),
                "--checkpoint_dir",
                str(out / "refused"),
            ],
            timeout=300,
        )
        predict = subprocess.run(
            [
                sys.executable,
                "-m",
                "serving.predict",
                "--model",
                str(out / "model"),
                "--input",
                leaky,
                "--output",
                str(out / "refused.parquet"),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        console += [refused.stdout, refused.stderr, predict.stdout, predict.stderr]
    masked = (
        "s3://***@clicks/log?region=us-east-1&session_token=***: credentials in a URL (user-info before @) are refused"
    )
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"dlrm_main.py: error: --parquet_path {masked}, as the URL is printed and recorded; give credentials in the "
        "environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN) or a profile, AWS_PROFILE; GCS: "
        "GOOGLE_APPLICATION_CREDENTIALS (docs/data.md)"
    ], refused.stderr
    assert predict.returncode == 2 and f"--input {masked}" in predict.stderr.strip().splitlines()[-1]
    assert not any(os.path.exists(out / name) for name in ("refused.jsonl", "refused", "refused.parquet"))
    assert {"log.jsonl", "ckpt", "model", "scores.parquet", "metrics.json", "run.png", "sweep"} <= set(os.listdir(out))
    assert {"results.md", "results.csv", "results.png"} <= set(os.listdir(out / "sweep"))
    assert read_log(str(out / "log.jsonl"))
    needles = [KEY_ID, SECRET, TOKEN]
    assert [n for n in needles if any(n in text for text in console)] == []
    assert _files_holding(str(out), [n.encode() for n in needles]) == []


@pytest.mark.parametrize(
    "flag", ["--checkpoint_dir", "--restore_checkpoint_path", "--tensorboard_dir", "--parquet_path"]
)
def test_every_url_flag_of_training_refuses_credentials(flag, capsys):
    from training.flags import parse_config

    extra = ["--sparse_columns", "C1"] if flag == "--parquet_path" else []
    with pytest.raises(SystemExit) as exit_:
        parse_config([flag, f"s3://{KEY_ID}:{SECRET}@bucket/run", *extra], "dlrm_main.py", "")
    assert exit_.value.code == 2
    assert capsys.readouterr().err.startswith(f"dlrm_main.py: error: {flag} s3://***@bucket/run: credentials in a URL")
