"""A local S3 server (moto's server mode) holding a copy of a table, for the tests that
read Parquet from object storage as a user's lake would be read."""

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

from harness.launch import free_port


def _wait_for_port(port: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"moto_server did not listen on port {port}")


@contextlib.contextmanager
def s3_serving(table: str, monkeypatch, credentials: dict[str, str]) -> Iterator[int]:
    """A moto server on a free port with the files of ``table`` (a local directory)
    under ``s3://clicks/log/``, and the environment set as a user's would be: the
    ``credentials`` (AWS_ACCESS_KEY_ID, ...), the region, no instance metadata. Yields
    the port; stops the server on leaving."""
    import boto3

    port = free_port()
    server = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(port)
        for name, value in {
            **credentials,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }.items():
            monkeypatch.setenv(name, value)
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1")
        s3.create_bucket(Bucket="clicks")
        for directory, _, files in os.walk(table):
            for name in files:
                path = os.path.join(directory, name)
                s3.upload_file(path, "clicks", "log/" + os.path.relpath(path, table))
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)
