"""An HTTP endpoint for an exported model, batching concurrent requests.

    python -m serving.serve --model MODEL_DIR [--host 127.0.0.1] [--port 8080]
        [--variant fp32|fp16|int8|fp32_aoti|...] [--trust_native_code] [--max_batch_rows 4096] [--max_batch_delay_ms 2] [--num_threads N]
        [--max_body_bytes 67108864] [--request_timeout_s 30] [--max_connections 256] [--parse_threads 2]
        [--drain_timeout_s 20] [--base BASE_DIR] [--reload_interval_s 2]

``POST /predict`` with lines in the model's input layout as the body (as ``python -m
serving.predict`` reads them: raw Criteo lines, or BYO CSV rows for a model trained
with --dataset_path, labelled or not; for a model trained with --parquet_path, JSON
objects keyed by column name, one per line, each naming every column, or, with the query
``?missing=null``, those it has, the others read as null; a history feature of a model
with ``--sequence_columns``: a list of raw ids, oldest first; with a Content-Length or chunked) answers ``200``
with one probability per line, and the count of unseen ids (ids no training row held,
mapped as serving.predict maps them: docs/serving.md) in the header ``x-unseen-ids``;
with ``Accept: application/json`` the answer is JSON ``{"probabilities": [...],
"unseen_ids": N, "unseen_ids_by_feature": {"cat_3": n, ...}}``. Errors are JSON ``{"error": "..."}``: ``400`` for a bad
request line (named; a JSON line nested deeper than a row too), an unknown query, or an unparseable HTTP request (a Content-Length that is no
number, say), ``413`` for a body above --max_body_bytes, ``408`` for a request not
received whole within --request_timeout_s, ``503`` (uvicorn's) beyond
--max_connections. ``GET /health`` answers ``ok``.

uvicorn (its h11 protocol) does the HTTP framing on one event-loop thread, so a slow or
stalled client holds a socket, not a thread. Bodies are parsed and transformed on
--parse_threads threads; one model thread runs the waiting requests' rows together: it
takes what is queued, waits at most --max_batch_delay_ms for more, up to
--max_batch_rows rows, and runs one forward for all of them.

A --model that is a symlink (``STATE_DIR/current``) is followed: every
--reload_interval_s seconds the server resolves it, and when it names another export
it loads and checks that export and swaps it in (`ModelWatcher`); requests already
parsed finish on the model that parsed them, and a bad model is refused in one line
while the old one keeps serving.

On SIGTERM (what systemd and Kubernetes send) or SIGINT the server stops accepting
connections, closes idle ones, lets the requests in flight finish (for at most
--drain_timeout_s; then they are cancelled), prints one line: requests, rows and unseen
ids by feature, and exits 0.

Example::

    curl --data-binary @day_23.tsv http://127.0.0.1:8080/predict
"""

import asyncio
import contextlib
import functools
import json
import os
import queue
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import h11
import numpy as np
import torch
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from common.cli import run_cli
from common.config_flags import flag
from common.errors import BadInput
from common.sigterm import Terminated, raise_on_sigterm
from serving.cli import MODEL_DIR_HELP, parse_config, serving_parser
from serving.delta import different_inputs, is_delta
from serving.layouts.base import MalformedLineError
from serving.layouts.parquet_rows import ParquetRows
from serving.model_files import TRUST_FLAG
from serving.predict import BASE_HELP, TRUST_HELP, VARIANTS, Predictor


@dataclass
class _Request:
    dense: np.ndarray
    ids: np.ndarray
    result: Future
    predictor: Predictor  # the model that parsed the rows runs them, whatever reloads meanwhile


class BatchingPredictor:
    """Runs the rows of concurrent `submit` calls through shared forwards, on one thread.

    Args:
        predictor: the loaded model.
        max_batch_rows: rows per forward at most (a larger request runs alone).
        max_batch_delay_ms: how long the first waiting request waits for company.

    Example::

        batcher = BatchingPredictor(Predictor("model_dir"))
        probabilities = batcher.submit(*predictor.prepare_lines(lines))
        batcher.close()
    """

    def __init__(self, predictor: Predictor, max_batch_rows: int = 4096, max_batch_delay_ms: float = 2.0) -> None:
        if max_batch_rows <= 0:
            raise BadInput(f"--max_batch_rows must be positive, got {max_batch_rows}")
        if max_batch_delay_ms < 0:
            raise BadInput(f"--max_batch_delay_ms must not be negative, got {max_batch_delay_ms}")
        self.predictor = predictor
        self.max_batch_rows = max_batch_rows
        self.max_batch_delay = max_batch_delay_ms / 1e3
        self.batch_requests: list[int] = []  # requests per forward, for reports and tests
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="model", daemon=True)
        self._thread.start()

    def submit(self, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Probabilities of prepared rows (see `Predictor.prepare`); blocks until done."""
        return self.enqueue(dense, ids).result()

    def enqueue(self, dense: np.ndarray, ids: np.ndarray, predictor: Predictor | None = None) -> Future:
        """Queues prepared rows; the future's result is their probabilities, by
        ``predictor`` (the one that prepared them; default: the one in service)."""
        request = _Request(dense, ids, Future(), predictor or self.predictor)
        self._queue.put(request)
        return request.result

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _gather(self, first: _Request) -> tuple[list[_Request], bool]:
        """The first request and those arriving within the delay, up to the row limit;
        and whether closing was asked meanwhile."""
        batch, rows = [first], len(first.dense)
        deadline = time.perf_counter() + self.max_batch_delay
        while rows < self.max_batch_rows:
            try:
                request = self._queue.get(timeout=max(0.0, deadline - time.perf_counter()))
            except queue.Empty:
                break
            if request is None:
                return batch, True
            if rows + len(request.dense) > self.max_batch_rows or request.predictor is not first.predictor:
                # The next forward's (order across requests is free); a request parsed by
                # another model (a reload happened between them) runs on that model.
                self._queue.put(request)
                break
            batch.append(request)
            rows += len(request.dense)
        return batch, False

    def _run(self) -> None:
        closing = False
        while not closing:
            first = self._queue.get()
            if first is None:
                return
            batch, closing = self._gather(first)
            try:
                probabilities = first.predictor.predict_transformed(
                    np.concatenate([r.dense for r in batch]), np.concatenate([r.ids for r in batch])
                )
            except Exception as e:  # the model failed: every waiting request learns why
                for request in batch:
                    request.result.set_exception(e)
                continue
            self.batch_requests.append(len(batch))
            start = 0
            for request in batch:
                request.result.set_result(probabilities[start : start + len(request.dense)])
                start += len(request.dense)


# How often a --model that is a symlink is looked at, unless --reload_interval_s says.
DEFAULT_RELOAD_INTERVAL_S = 2.0


def follows_a_link(path: str) -> bool:
    """Whether ``path`` is, or passes through, a symlink: a name that can be pointed at
    another export (`common.atomic.atomic_symlink`)."""
    return os.path.realpath(path) != os.path.abspath(path)


def check_replacement(serving: Predictor, new: Predictor) -> None:
    """Refuses (BadInput) a model to swap in for ``serving``: one whose inputs differ
    (requests parsed for one would not fit the other, and the counts of unseen ids are
    per feature), or whose probe forward (a few rows of zeros) gives no probabilities."""
    other = different_inputs(new.inputs, serving.inputs)
    if other is not None:
        raise BadInput(f"its inputs differ from the model in service ({other}): restart the server to serve it")
    dense = np.zeros((2, new.layout.num_dense), np.float32)
    probabilities = new.predict_transformed(dense, np.zeros((2, new.layout.num_sparse_columns), np.int64))
    if probabilities.shape != (2,) or not ((probabilities >= 0) & (probabilities <= 1)).all():
        raise BadInput(f"its probe forward gave {probabilities.tolist()}, not two probabilities")


def model_loader(variant: str, trust_native_code: bool, base: str | None) -> Callable[[str], Predictor]:
    """How `ModelWatcher` loads the export a link is switched to: the server's variant
    and flags, ``base`` (--base) for a delta export only (the link may name a full
    export later, which --base does not concern)."""

    def load(model_dir: str) -> Predictor:
        return Predictor(
            model_dir, variant, trust_native_code=trust_native_code, base=base if is_delta(model_dir) else None
        )

    return load


class ModelWatcher:
    """Follows a --model path that is a symlink (``STATE_DIR/current``): every
    ``interval_s`` it resolves the path, and when it names another export, loads that
    export whole (every file against its manifest, a delta onto its base) from the
    resolved directory, checks it (`check_replacement`) and swaps it in for the
    batcher's next requests; requests already parsed finish on the model that parsed
    them. A model that fails to load or check is refused with one line, and the one
    in service keeps serving (and is not tried again until the link moves again).

    Args:
        path: the --model path to follow.
        batcher: whose ``predictor`` is swapped.
        load: loads the model of a directory (the server's variant and flags).
        interval_s: seconds between two looks.
        log: where the one-line reports go (default: stdout, the server's log).

    Example::

        watcher = ModelWatcher("state/current", batcher, Predictor, 2.0)
        watcher.start(); ...; watcher.close()
    """

    def __init__(
        self,
        path: str,
        batcher: BatchingPredictor,
        load: Callable[[str], Predictor],
        interval_s: float,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.path, self.batcher, self.load, self.interval_s = path, batcher, load, interval_s
        self.log = log or functools.partial(print, flush=True)
        self.serving = os.path.realpath(path)
        self.reloads = 0
        self._refused: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reload", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.check()

    def check(self) -> bool:
        """One look at the path: whether another model was swapped in."""
        target = os.path.realpath(self.path)
        if target in (self.serving, self._refused):
            return False
        try:
            predictor = self.load(target)  # the resolved directory: the link may move again meanwhile
            check_replacement(self.batcher.predictor, predictor)
        except Exception as e:  # BadInput, and whatever else a bad model raises: never the server's end
            self._refused = target
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            self.log(f"reload refused: {self.path} -> {target}: {reason}; still serving {self.serving}")
            return False
        self.batcher.predictor = predictor
        self.serving, self._refused, self.reloads = target, None, self.reloads + 1
        self.log(f"reloaded {self.path}: now serving {target} (step {predictor.inputs.step})")
        return True


@dataclass
class HttpLimits:
    """What one client may take of the server. A request (headers and body) must arrive
    whole within request_timeout_s of the connection opening or of the previous answer
    on it (408 and the connection closed otherwise).

    Example::

        HttpLimits(max_body_bytes=1 << 20, request_timeout_s=5).validate()
    """

    max_body_bytes: int = flag(64 << 20, help="largest request body accepted (413 above)")
    request_timeout_s: float = flag(30.0, help="seconds a request may take to arrive whole (408 after)")
    max_connections: int = flag(256, help="open connections at most (503 beyond)")
    parse_threads: int = flag(2, help="threads parsing request bodies")
    # Below Kubernetes' default grace period (30 s), after which it kills the process.
    drain_timeout_s: float = flag(
        20.0, help="on SIGTERM or SIGINT, seconds the requests in flight may take to finish (cancelled after)"
    )

    def validate(self) -> None:
        for name in ("max_body_bytes", "max_connections", "parse_threads"):
            if getattr(self, name) <= 0:
                raise BadInput(f"--{name} must be positive, got {getattr(self, name)}")
        if not self.request_timeout_s > 0:
            raise BadInput(f"--request_timeout_s must be positive, got {self.request_timeout_s}")
        if not self.drain_timeout_s >= 0:
            raise BadInput(f"--drain_timeout_s must not be negative, got {self.drain_timeout_s}")


class HttpError(Exception):
    """An answer other than 200: its status and the one-line reason sent as JSON."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def error_body(message: str) -> bytes:
    """The JSON body of every error answer."""
    return json.dumps({"error": message}).encode() + b"\n"


def _closing_answer(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 error answer, for the protocol to write just before it closes."""
    body = error_body(message)
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


class _Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for receiving each request whole (uvicorn
    has none: its keep-alive timer stops at a request's first byte, so a client
    trickling bytes would hold the connection forever) and a JSON 400 for requests h11
    cannot parse. Relies on H11Protocol's attributes as of the pinned uvicorn."""

    request_timeout_s = 30.0  # set per server by a subclass (see _protocol_class)

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._arm_deadline()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR):
            self._disarm_deadline()  # the request is whole (or refused): the app may take its time

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_deadline()  # the next request on this connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_deadline()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self.transport.write(
            _closing_answer(
                400,
                "Bad Request",
                "malformed HTTP request: its request line, "
                "headers or body framing (Content-Length, chunks) do not parse",
            )
        )
        self.transport.close()

    def _arm_deadline(self) -> None:
        self._disarm_deadline()
        self._deadline = self.loop.call_later(self.request_timeout_s, self._deadline_passed)

    def _disarm_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _deadline_passed(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self.conn.their_state is h11.DONE:
            return  # closed meanwhile, or a pipelined request already whole
        if self.conn.our_state is h11.IDLE or (
            self.conn.our_state is h11.SEND_RESPONSE and not self.cycle.response_started
        ):
            self.transport.write(
                _closing_answer(
                    408, "Request Timeout", f"request not received whole within {self.request_timeout_s:g} s"
                )
            )
        self.transport.close()


def _protocol_class(request_timeout_s: float) -> type:
    return type("Protocol", (_Protocol,), {"request_timeout_s": request_timeout_s})


class PredictApp:
    """The ASGI application: ``POST /predict`` through ``batcher``, ``GET /health``.

    Args:
        batcher: runs the prepared rows.
        limits: body size and parsing threads (the other limits are the server's).

    Example::

        app = PredictApp(BatchingPredictor(Predictor("model_dir")), HttpLimits())
        uvicorn.run(app)  # or see serving_in_background
    """

    def __init__(self, batcher: BatchingPredictor, limits: HttpLimits) -> None:
        self.batcher = batcher
        self.limits = limits
        self._parsers = ThreadPoolExecutor(limits.parse_threads, thread_name_prefix="parse")
        # Answered requests, their rows and unseen ids per feature (updated on the event loop thread).
        self.requests, self.rows = 0, 0
        self.unseen = np.zeros(len(batcher.predictor.inputs.counted_feature_names), np.int64)
        self.ids = np.zeros_like(self.unseen)  # the unseen shares' denominators

    def close(self) -> None:
        self._parsers.shutdown()

    def summary(self) -> str:
        """The line the server prints when it stops."""
        by_feature = self.batcher.predictor.unseen_by_feature(self.unseen)
        named = ", ".join(f"{name} {n}" for name, n in by_feature.items())
        shares = self.batcher.predictor.unseen_shares(self.unseen, self.ids)
        share = "; unseen share " + ", ".join(f"{name} {s:.2%}" for name, s in shares.items()) if shares else ""
        return f"answered {self.requests} requests, {self.rows} rows{share}; unseen ids {int(self.unseen.sum())}" + (
            f" ({named})" if named else ""
        )

    async def __call__(
        self,
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[dict[str, Any]]],
        send: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            return
        try:
            if scope["path"] == "/health" and scope["method"] == "GET":
                await _answer(send, 200, b"ok\n")
                return
            if scope["path"] != "/predict" or scope["method"] != "POST":
                raise HttpError(404, "not found: GET /health or POST /predict")
            # One model answers the request, parsing and forward, even if another is
            # swapped in meanwhile (`ModelWatcher`).
            predictor = self.batcher.predictor
            missing_as_null = self._query(scope, predictor)
            body = await self._read_body(scope, receive)
            loop = asyncio.get_running_loop()
            prepared = await loop.run_in_executor(
                self._parsers,
                functools.partial(predictor.read_lines, body, "request", missing_as_null=missing_as_null),
            )
            probabilities = (
                await asyncio.wrap_future(self.batcher.enqueue(prepared.dense, prepared.ids, predictor))
                if len(prepared.dense)
                else np.zeros(0, np.float32)
            )
        except MalformedLineError as e:
            await _answer(send, 400, error_body(str(e)))
        except HttpError as e:
            await _answer(send, e.status, error_body(str(e)))
        else:
            self.requests, self.rows = self.requests + 1, self.rows + len(probabilities)
            self.unseen += prepared.unseen
            self.ids += prepared.id_counts
            unseen = int(prepared.unseen.sum())
            shares = self.batcher.predictor.unseen_shares(prepared.unseen, prepared.id_counts)
            if b"application/json" in dict(scope["headers"]).get(b"accept", b""):
                await _answer(
                    send,
                    200,
                    json.dumps(
                        {
                            "probabilities": [float(f"{p:.7g}") for p in probabilities],
                            "unseen_ids": unseen,
                            "unseen_ids_by_feature": predictor.unseen_by_feature(prepared.unseen),
                            "unseen_share_by_feature": shares,
                        }
                    ).encode(),
                    content_type=b"application/json",
                    unseen_ids=unseen,
                    unseen_shares=shares,
                )
            else:
                body = "".join(f"{p:.7g}\n" for p in probabilities).encode()
                await _answer(send, 200, body, unseen_ids=unseen, unseen_shares=shares)

    def _query(self, scope: dict[str, Any], predictor: Predictor) -> bool:
        """Whether the query string asks for missing columns as null (``missing=null``,
        a Parquet model's only); any other query is refused, so that a misspelt
        option is not silently ignored."""
        query = urllib.parse.parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        if not query:
            return False
        if query != [("missing", "null")]:
            raise HttpError(
                400,
                f"unknown query {scope['query_string'].decode('latin-1')[:80]!r}: /predict takes "
                "none, or missing=null (a Parquet model's rows may leave columns out, read as null)",
            )
        if not isinstance(predictor.layout, ParquetRows):
            raise HttpError(400, "missing=null: only a Parquet model's JSON rows have columns to leave out")
        return True

    async def _read_body(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]]) -> bytes:
        limit = self.limits.max_body_bytes
        too_large = HttpError(413, f"request body above --max_body_bytes {limit}")
        declared = dict(scope["headers"]).get(b"content-length")  # h11 checked it is a number
        if declared is not None and int(declared) > limit:
            raise too_large  # before reading a byte of it
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise HttpError(400, "client disconnected before the body ended")  # nobody reads it
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                raise too_large
            if not message.get("more_body", False):
                return b"".join(chunks)


async def _answer(
    send: Callable[[dict[str, Any]], Awaitable[None]],
    status: int,
    body: bytes,
    content_type: bytes = b"text/plain",
    unseen_ids: int = 0,
    unseen_shares: dict[str, float] | None = None,
) -> None:
    headers = [(b"content-length", str(len(body)).encode())]
    if status == 200:
        headers += [(b"content-type", content_type), (b"x-unseen-ids", str(unseen_ids).encode())]
        if unseen_shares:  # feature=share of its ids in the request, of the features with unseen ids
            shares = ",".join(f"{name}={share:.4g}" for name, share in unseen_shares.items())
            headers.append((b"x-unseen-share", shares.encode()))
    else:  # JSON; and the connection closes, as the body may not have been read
        headers += [(b"content-type", b"application/json"), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Uvicorn(uvicorn.Server):
    """uvicorn's server saying, when it starts to stop, how many requests it lets finish."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        in_flight = len(self.server_state.tasks)
        # Closed before the line says so (uvicorn's shutdown closes them again, a no-op):
        # a client that read it and connects is refused, however loaded the machine.
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        if in_flight:
            print(
                f"stopping: no new connections; finishing {in_flight} request(s) in flight (at most "
                f"--drain_timeout_s {self.config.timeout_graceful_shutdown:g} s)",
                flush=True,
            )
        await super().shutdown(sockets)


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` and listening (port 0: a free one); one-line
    BadInput/OSError when it cannot be."""
    if not 0 <= port <= 65535:
        raise BadInput(f"--port {port}: not a TCP port (0 to 65535)")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as e:
        raise BadInput(f"--host {host}: {e.strerror}") from None
    try:
        return socket.create_server((host, port), family=family, backlog=1024)
    except OSError as e:
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror}") from None


class Server:
    """uvicorn serving ``PredictApp`` on an already listening socket.

    Args:
        batcher: runs the prepared rows.
        sock: from `listening_socket`.
        limits: what one client may take.

    Example::

        server = Server(batcher, listening_socket("127.0.0.1", 0), HttpLimits())
        threading.Thread(target=server.run).start(); ...; server.stop()
    """

    def __init__(self, batcher: BatchingPredictor, sock: socket.socket, limits: HttpLimits) -> None:
        limits.validate()
        self.sock = sock
        self.app = PredictApp(batcher, limits)
        self._uvicorn = _Uvicorn(
            uvicorn.Config(
                self.app,
                http=_protocol_class(limits.request_timeout_s),
                lifespan="off",
                log_config=None,
                access_log=False,
                limit_concurrency=limits.max_connections,
                timeout_graceful_shutdown=limits.drain_timeout_s,
            )
        )

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def run(self) -> None:
        """Serves until `stop` (or SIGINT/SIGTERM when run on the main thread: after
        draining, uvicorn raises the signal again, to the handler in place before)."""
        try:
            self._uvicorn.run(sockets=[self.sock])
        finally:
            self.app.close()
            self.sock.close()

    def stop(self) -> None:
        self._uvicorn.should_exit = True


@contextlib.contextmanager
def serving_in_background(
    predictor: Predictor,
    max_batch_delay_ms: float = 2.0,
    max_batch_rows: int = 4096,
    host: str = "127.0.0.1",
    port: int = 0,
    limits: HttpLimits | None = None,
) -> Iterator[tuple[str, BatchingPredictor]]:
    """Serves ``predictor`` from a background thread for the duration of a ``with``
    block (port 0: a free one); yields the base URL and the batcher, stops both after.

    Example::

        with serving_in_background(Predictor("model_dir")) as (url, batcher):
            urllib.request.urlopen(url + "/health")
    """
    batcher = BatchingPredictor(predictor, max_batch_rows, max_batch_delay_ms)
    try:
        server = Server(batcher, listening_socket(host, port), limits or HttpLimits())
        thread = threading.Thread(target=server.run, name="http", daemon=True)
        thread.start()
        try:
            yield f"http://{host}:{server.port}", batcher
        finally:
            server.stop()
            thread.join()
    finally:
        batcher.close()


@dataclass(kw_only=True)
class ServeConfig:
    """The model ``python -m serving.serve`` serves, where, and how it batches requests."""

    model: str = flag(help=MODEL_DIR_HELP + "; a symlink to one is followed (--reload_interval_s)")
    base: str | None = flag(None, help=BASE_HELP)
    reload_interval_s: float | None = flag(
        None,
        help="seconds between two looks at where --model points, to serve the export it is switched to "
        f"(unset: every {DEFAULT_RELOAD_INTERVAL_S:g} s when --model is a symlink, else never; 0: never)",
    )
    host: str = flag("127.0.0.1", help="address to listen on")
    port: int = flag(8080, help="port to listen on")
    variant: str = flag("fp32", choices=VARIANTS, help="which exported model to serve")
    trust_native_code: bool = flag(False, name=TRUST_FLAG.removeprefix("--"), help=TRUST_HELP)
    max_batch_rows: int = flag(4096, help="rows per forward at most")
    max_batch_delay_ms: float = flag(2.0, help="how long a request waits for others to share its forward")
    num_threads: int | None = flag(
        None, help="torch intra-op threads (default torch's; 1 is much faster for small batches on a busy host)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    parser = serving_parser("serve", __doc__)
    config, limits = parse_config(parser, [ServeConfig, HttpLimits], argv)
    return run_cli(lambda: _serve(config, limits), parser.prog)


def _serve(args: ServeConfig, limits: HttpLimits) -> int:
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    limits.validate()
    interval = args.reload_interval_s
    if interval is None:
        interval = DEFAULT_RELOAD_INTERVAL_S if follows_a_link(args.model) else 0.0
    if not interval >= 0:
        raise BadInput(f"--reload_interval_s must not be negative, got {args.reload_interval_s}")
    try:
        sock = listening_socket(args.host, args.port)
    except OSError as e:  # the port is taken, say
        raise BadInput(str(e)) from e

    load = model_loader(args.variant, args.trust_native_code, args.base)
    try:
        # The resolved directory: what the link names now is what is served (and watched from).
        first = Predictor(
            os.path.realpath(args.model), args.variant, trust_native_code=args.trust_native_code, base=args.base
        )
        batcher = BatchingPredictor(first, args.max_batch_rows, args.max_batch_delay_ms)
    except (BadInput, OSError) as e:
        sock.close()
        raise BadInput(str(e)) from e
    server = Server(batcher, sock, limits)
    watcher = ModelWatcher(args.model, batcher, load, interval) if interval > 0 else None
    print(f"serving {args.model} ({args.variant}) on http://{args.host}:{server.port}/predict", flush=True)
    if watcher is not None:
        print(f"following {args.model} -> {watcher.serving}: every {interval:g} s", flush=True)
        watcher.start()
    # uvicorn drains on either signal, then raises it again: SIGINT's KeyboardInterrupt,
    # and SIGTERM as Terminated (by default it would kill the process before the summary).
    with raise_on_sigterm():
        try:
            server.run()
        except (KeyboardInterrupt, Terminated):
            pass
        finally:
            if watcher is not None:
                watcher.close()
            batcher.close()
            print(f"{args.model}: {server.app.summary()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
