"""The HTTP endpoint against hostile clients, over real sockets: chunked bodies,
oversized and malformed framing, stalled connections, the connection and thread bound."""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import numpy as np
import pytest

from data.binary.criteo_layout import NUM_SPARSE_FEATURES
from data.preprocess.criteo_transforms import VOCABULARY_FILE, read_vocabulary
from serving import predict, serve
from tests.support.exported_model import raw_test_lines


@pytest.fixture(scope="module")
def predictor(trained):
    return predict.Predictor(trained["model"], "int8")


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


def exchange(url: str, request: bytes) -> tuple[int, bytes]:
    """Sends raw bytes, reads until the server closes; the status and the body."""
    with socket.create_connection(address(url), timeout=60) as s:
        s.sendall(request)
        answer = read_until_closed(s)
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def read_until_closed(s: socket.socket) -> bytes:
    chunks = []
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


@pytest.mark.slow
def test_chunked_body_is_read_whole(trained, predictor):
    lines = raw_test_lines(trained, 7)
    with serve.serving_in_background(predictor, max_batch_delay_ms=0) as (url, _):
        connection = http.client.HTTPConnection(*address(url), timeout=60)
        # Chunks cut lines in the middle: the body is what counts, not its pieces.
        body = b"".join(lines)
        connection.request("POST", "/predict", body=iter([body[:50], body[50:1000], body[1000:]]), encode_chunked=True)
        response = connection.getresponse()
        assert response.status == 200
        answer = np.array(response.read().decode().split(), dtype=np.float32)
        connection.close()
    assert len(answer) == 7
    np.testing.assert_allclose(answer, predictor.predict_lines(body), rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("length", ["abc", "-5", "1e3", "12, 13"])
def test_bad_content_length_is_400(predictor, length):
    with serve.serving_in_background(predictor) as (url, _):
        status, body = exchange(url, f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode())
        assert (status, json.loads(body)) == (
            400,
            {
                "error": "malformed HTTP request: its request line, headers or "
                "body framing (Content-Length, chunks) do not parse"
            },
        )
        assert exchange(url, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") == (200, b"ok\n")


@pytest.mark.slow
def test_body_above_the_limit_is_413(trained, predictor):
    limits = serve.HttpLimits(max_body_bytes=1000)
    with serve.serving_in_background(predictor, limits=limits) as (url, _):
        # Declared: refused before a byte of the body is read (1 TiB is never allocated).
        status, body = exchange(url, b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 1099511627776\r\n\r\n")
        assert (status, json.loads(body)) == (413, {"error": "request body above --max_body_bytes 1000"})
        # Chunked: refused once the chunks pass the limit.
        chunk = b"x" * 600
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3)) + b"0\r\n\r\n"
        status, body = exchange(
            url, b"POST /predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked
        )
        assert (status, json.loads(body)) == (413, {"error": "request body above --max_body_bytes 1000"})
        # At the limit: answered.
        lines = b"".join(raw_test_lines(trained, 20))
        fitting = lines[: lines.rindex(b"\n", 0, 1000) + 1]
        connection = http.client.HTTPConnection(*address(url), timeout=60)
        connection.request("POST", "/predict", body=fitting)
        response = connection.getresponse()
        assert response.status == 200 and len(response.read().split()) == fitting.count(b"\n")
        connection.close()


@pytest.mark.slow
def test_bad_request_line_and_unknown_paths_answer_json(predictor):
    with serve.serving_in_background(predictor) as (url, _):
        status, body = exchange(url, b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n1\t2\n")
        assert status == 400 and json.loads(body)["error"].startswith("request line 1: expected 40 tab-separated")
        status, body = exchange(url, b"GET /predict HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (status, json.loads(body)) == (404, {"error": "not found: GET /health or POST /predict"})


@pytest.mark.slow
def test_stalled_connections_time_out_and_hold_no_thread(trained, predictor):
    """Clients that stop before their request is whole (nothing sent, half the headers,
    half the body) are answered 408 and closed after --request_timeout_s; while they
    stall they hold sockets, not threads; beyond --max_connections, 503."""
    stalls = [
        b"",
        b"POST /predict HTTP/1.1\r\nHost: x\r\n",
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n1\t2",
    ]
    limits = serve.HttpLimits(request_timeout_s=1.0, max_connections=60)
    timed_out = {"error": "request not received whole within 1 s"}
    lines = b"".join(raw_test_lines(trained, 3))
    with serve.serving_in_background(predictor, max_batch_delay_ms=0, limits=limits) as (url, _):
        connection = http.client.HTTPConnection(*address(url), timeout=60)
        connection.request("POST", "/predict", body=lines)  # starts the parsing thread
        assert connection.getresponse().read().count(b"\n") == 3
        connection.close()
        threads = threading.active_count()
        stalled = [socket.create_connection(address(url), timeout=60) for _ in range(48)]
        for i, s in enumerate(stalled):
            s.sendall(stalls[i % len(stalls)])
        assert threading.active_count() == threads
        for s in stalled:
            head, _, body = read_until_closed(s).partition(b"\r\n\r\n")
            s.close()
            assert head.startswith(b"HTTP/1.1 408 ") and json.loads(body) == timed_out

        # A keep-alive connection: its second request has the same deadline.
        with socket.create_connection(address(url), timeout=60) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /hea")
            answer = read_until_closed(s)
        assert answer.startswith(b"HTTP/1.1 200 ") and b"ok\n" in answer and b"HTTP/1.1 408 " in answer

        # The connection bound: the 61st is answered 503 (uvicorn's answer).
        idle = [socket.create_connection(address(url), timeout=60) for _ in range(60)]
        assert exchange(url, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 503
        for s in idle:
            read_until_closed(s)
            s.close()
        assert exchange(url, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") == (200, b"ok\n")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_server_finishes_requests_in_flight_and_prints_its_summary(trained, signum):
    """systemd and Kubernetes stop a service with SIGTERM, a terminal with SIGINT: on
    either the server process stops accepting connections, finishes the requests in
    flight (one still arriving, one waiting for its forward), prints its summary line
    and exits 0. Before, SIGTERM killed it with no summary, and uvicorn cancelled what
    had not finished within a second."""
    lines = b"".join(raw_test_lines(trained, 4))
    # The forward waits 2 s for company: a request sent whole is in flight that long.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serving.serve",
            "--model",
            trained["model"],
            "--port",
            "0",
            "--max_batch_delay_ms",
            "2000",
            "--num_threads",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = re.search(r"on (http://\S+)/predict", proc.stdout.readline()).group(1)
        head = f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(lines)}\r\n\r\n".encode()
        arriving = socket.create_connection(address(url), timeout=60)
        arriving.sendall(head + lines[:10])
        waiting = socket.create_connection(address(url), timeout=60)
        waiting.sendall(head + lines)
        idle = socket.create_connection(address(url), timeout=60)
        time.sleep(0.5)  # both requests reach the server
        proc.send_signal(signum)
        assert proc.stdout.readline() == (
            "stopping: no new connections; finishing 2 request(s) in flight (at most --drain_timeout_s 20 s)\n"
        )
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(address(url), timeout=60)
        assert read_until_closed(idle) == b""  # closed, as it had no request
        arriving.sendall(lines[10:])
        for s in (arriving, waiting):
            answer = read_until_closed(s)
            s.close()
            assert answer.startswith(b"HTTP/1.1 200 ") and answer.partition(b"\r\n\r\n")[2].count(b"\n") == 4
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out == f"{trained['model']}: answered 2 requests, 8 rows; unseen ids 0\n", (out, err)


def test_flags_of_the_limits(tmp_path, capsys):
    assert serve.main(["--model", str(tmp_path), "--port", "99999"]) == 2
    assert capsys.readouterr().err == "python -m serving.serve: error: --port 99999: not a TCP port (0 to 65535)\n"
    assert serve.main(["--model", str(tmp_path), "--max_body_bytes", "0"]) == 2
    assert capsys.readouterr().err == "python -m serving.serve: error: --max_body_bytes must be positive, got 0\n"
    assert serve.main(["--model", str(tmp_path), "--drain_timeout_s", "-1"]) == 2
    assert (
        capsys.readouterr().err == "python -m serving.serve: error: --drain_timeout_s must not be negative, got -1.0\n"
    )


@pytest.mark.slow
def test_hashes_outside_the_vocabulary_are_scored_as_training_did_and_counted(trained, predictor):
    """A Criteo model made with a vocabulary maps a hash it never kept to id 0, as
    preprocessing did (an empty field goes there too); the answer counts such hashes."""
    vocabulary = read_vocabulary(os.path.join(trained["data"], VOCABULARY_FILE), NUM_SPARSE_FEATURES)
    lines = [line.rstrip(b"\n").split(b"\t") for line in raw_test_lines(trained, 5)]
    never = next(h for h in range(1, 1 << 20) if h not in set(vocabulary[3].tolist()))
    lines[1][14 + 3] = f"{never:08x}".encode()  # cat_3 of the second line
    as_empty = [list(fields) for fields in lines]
    as_empty[1][14 + 3] = b""
    body = b"".join(b"\t".join(fields) + b"\n" for fields in lines)
    # The reference count: non-empty hashes each feature's vocabulary lacks.
    expected = {
        f"cat_{f}": n
        for f in range(NUM_SPARSE_FEATURES)
        if (
            n := sum(
                1 for fields in lines if fields[14 + f] and int(fields[14 + f], 16) not in set(vocabulary[f].tolist())
            )
        )
    }
    assert expected.get("cat_3", 0) >= 1
    with serve.serving_in_background(predictor, max_batch_delay_ms=0) as (url, _):
        connection = http.client.HTTPConnection(*address(url), timeout=60)
        connection.request("POST", "/predict", body=body, headers={"Accept": "application/json"})
        response = connection.getresponse()
        assert response.status == 200 and response.getheader("x-unseen-ids") == str(sum(expected.values()))
        answer = json.loads(response.read())
        connection.close()
    assert answer["unseen_ids_by_feature"] == expected and answer["unseen_ids"] == sum(expected.values())
    empty_body = b"".join(b"\t".join(fields) + b"\n" for fields in as_empty)
    np.testing.assert_allclose(answer["probabilities"], predictor.predict_lines(empty_body), rtol=1e-6)
