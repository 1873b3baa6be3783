"""A minimal HTTP endpoint for an exported model, batching concurrent requests.

    python -m training.serve --model MODEL_DIR [--host 127.0.0.1] [--port 8080]
        [--variant fp32|fp16|int8] [--max_batch_rows 4096] [--max_batch_delay_ms 2] [--num_threads N]

``POST /predict`` with lines in the model's input layout as the body (as ``python -m
training.predict`` reads them: raw Criteo lines, or BYO CSV rows for a model trained
with --dataset_path; labelled or not) answers ``200`` with one
probability per line, or ``400`` with one line naming the bad request line. ``GET
/health`` answers ``ok``. Each request is parsed and transformed in its own thread;
one model thread runs the waiting requests' rows together: it takes what is queued,
waits at most --max_batch_delay_ms for more, up to --max_batch_rows rows, and runs one
forward for all of them.

Example::

    curl --data-binary @day_23.tsv http://127.0.0.1:8080/predict
"""

import contextlib
import queue
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from common.cli import OneLineParser
from training.predict import VARIANTS, MalformedLineError, Predictor


@dataclass
class _Request:
    dense: np.ndarray
    ids: np.ndarray
    result: Future


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
            raise ValueError(f"--max_batch_rows must be positive, got {max_batch_rows}")
        if max_batch_delay_ms < 0:
            raise ValueError(f"--max_batch_delay_ms must not be negative, got {max_batch_delay_ms}")
        self.predictor = predictor
        self.max_batch_rows = max_batch_rows
        self.max_batch_delay = max_batch_delay_ms / 1e3
        self.batch_requests: List[int] = []  # requests per forward, for reports and tests
        self._queue: "queue.Queue[Optional[_Request]]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="model", daemon=True)
        self._thread.start()

    def submit(self, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Probabilities of prepared rows (see `Predictor.prepare`); blocks until done."""
        request = _Request(dense, ids, Future())
        self._queue.put(request)
        return request.result.result()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _gather(self, first: _Request) -> Tuple[List[_Request], bool]:
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
            if rows + len(request.dense) > self.max_batch_rows:
                self._queue.put(request)  # the next forward's (order across requests is free)
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
                probabilities = self.predictor.predict_transformed(
                    np.concatenate([r.dense for r in batch]), np.concatenate([r.ids for r in batch]))
            except Exception as e:  # the model failed: every waiting request learns why
                for request in batch:
                    request.result.set_exception(e)
                continue
            self.batch_requests.append(len(batch))
            start = 0
            for request in batch:
                request.result.set_result(probabilities[start:start + len(request.dense)])
                start += len(request.dense)


def make_server(batcher: BatchingPredictor, host: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server (not yet serving) answering /predict and /health with ``batcher``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self._reply(200, b"ok\n")
            else:
                self._reply(404, b"not found: GET /health or POST /predict\n")

        def do_POST(self) -> None:
            if self.path != "/predict":
                self._reply(404, b"not found: POST /predict\n")
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                dense, ids = batcher.predictor.prepare_lines(body, "request")
            except MalformedLineError as e:
                self._reply(400, f"error: {e}\n".encode())
                return
            probabilities = batcher.submit(dense, ids) if len(dense) else np.zeros(0, np.float32)
            self._reply(200, "".join(f"{p:.7g}\n" for p in probabilities).encode())

        def _reply(self, status: int, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args) -> None:  # one line per request is noise here
            pass

    return _Server((host, port), Handler)


@contextlib.contextmanager
def serving_in_background(predictor: Predictor, max_batch_delay_ms: float = 2.0, max_batch_rows: int = 4096,
                          host: str = "127.0.0.1", port: int = 0) -> Iterator[Tuple[str, BatchingPredictor]]:
    """Serves ``predictor`` from a background thread for the duration of a ``with``
    block (port 0: a free one); yields the base URL and the batcher, stops both after.

    Example::

        with serving_in_background(Predictor("model_dir")) as (url, batcher):
            urllib.request.urlopen(url + "/health")
    """
    batcher = BatchingPredictor(predictor, max_batch_rows, max_batch_delay_ms)
    server = make_server(batcher, host, port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://{host}:{server.server_address[1]}", batcher
    finally:
        server.shutdown()
        server.server_close()
        batcher.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # The default backlog of 5 makes the 6th simultaneous client wait for a SYN resend (1 s).
    request_queue_size = 128


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = OneLineParser(prog="python -m training.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a directory written by python -m training.export")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on")
    parser.add_argument("--variant", choices=VARIANTS, default="fp32", help="which exported model to serve")
    parser.add_argument("--max_batch_rows", type=int, default=4096, help="rows per forward at most")
    parser.add_argument("--max_batch_delay_ms", type=float, default=2.0,
                        help="how long a request waits for others to share its forward")
    parser.add_argument("--num_threads", type=int, default=None,
                        help="torch intra-op threads (default torch's; 1 is much faster for small batches on a busy host)")
    args = parser.parse_args(argv)
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    try:
        batcher = BatchingPredictor(Predictor(args.model, args.variant), args.max_batch_rows, args.max_batch_delay_ms)
        server = make_server(batcher, args.host, args.port)
    except (ValueError, OSError) as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    print(f"serving {args.model} ({args.variant}) on http://{args.host}:{server.server_address[1]}/predict", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        batcher.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
