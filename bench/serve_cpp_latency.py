"""Per-row latency of the C++ server (serving/cpp dlrm_predict) against the Python predictor.

For each batch size, one request is a batch of raw Criteo lines (drawn in turn from
``--input``) answered with its probabilities: written to a running ``dlrm_predict``'s
stdin and read back from its stdout (the package loaded once, the pipe's round trip
included), and given to `serving.predict.Predictor.predict_lines` in this process (the
fp32 torch.export program of the same export; parsing and transforms included in both).
Both take ``--num_threads`` intra-op threads. Reports the median request and the mean
per-row latency of each, their ratio (Python over C++: above 1, C++ is faster) and the
load average when it ran (the figures are only as quiet as the machine), then a JSON line.

    python bench/serve_cpp_latency.py --model MODEL_DIR --input RAW_FILE
        [--program serving/cpp/build/dlrm_predict] [--batch_sizes 1,512] [--requests 200] [--num_threads 1]

MODEL_DIR holds fp32.aoti.pt2 (python -m serving.export --format aoti); build the
program with ``make serving-cpp``.
"""

import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from serving.predict import Predictor

DEFAULT_PROGRAM = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "serving", "cpp", "build", "dlrm_predict"
)
WARMUP_REQUESTS = 3


def _batches(lines: list[bytes], batch_size: int, count: int) -> list[bytes]:
    """``count`` requests of ``batch_size`` lines each, taken in turn from ``lines``."""
    return [b"".join(lines[(r * batch_size + i) % len(lines)] for i in range(batch_size)) for r in range(count)]


def _timed(requests: list[bytes], answer: Callable[[bytes], object]) -> np.ndarray:
    """Seconds of each request after the warm-up ones."""
    for body in requests[:WARMUP_REQUESTS]:
        answer(body)
    seconds = []
    for body in requests[WARMUP_REQUESTS:]:
        start = time.perf_counter()
        answer(body)
        seconds.append(time.perf_counter() - start)
    return np.asarray(seconds)


def cpp_latencies(program: str, model: str, requests: list[bytes], batch_size: int, num_threads: int) -> np.ndarray:
    """Request seconds through one running dlrm_predict (started, loaded, then timed)."""
    process = subprocess.Popen(
        [program, model, "--batch_size", str(batch_size), "--num_threads", str(num_threads)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout

    def answer(body: bytes) -> None:
        stdin.write(body)
        stdin.flush()
        for _ in range(batch_size):
            if not stdout.readline():
                raise RuntimeError(f"{program} stopped answering (exit code {process.wait()})")

    try:
        return _timed(requests, answer)
    finally:
        process.stdin.close()
        process.wait()


def python_latencies(predictor: Predictor, requests: list[bytes]) -> np.ndarray:
    return _timed(requests, lambda body: predictor.predict_lines(body, labelled=True))


def run(program: str, model: str, lines: list[bytes], batch_sizes: list[int], requests: int, num_threads: int) -> dict:
    """The figures of every batch size (the record the bench prints)."""
    torch.set_num_threads(num_threads)
    results = []
    for batch_size in batch_sizes:
        bodies = _batches(lines, batch_size, requests + WARMUP_REQUESTS)
        cpp = cpp_latencies(program, model, bodies, batch_size, num_threads)
        python = python_latencies(Predictor(model, batch_size=batch_size), bodies)
        cpp_row, python_row = cpp.mean() / batch_size * 1e3, python.mean() / batch_size * 1e3
        results.append(
            {
                "batch_size": batch_size,
                "requests": requests,
                "cpp_request_p50_ms": float(np.median(cpp) * 1e3),
                "python_request_p50_ms": float(np.median(python) * 1e3),
                "cpp_ms_per_row": float(cpp_row),
                "python_ms_per_row": float(python_row),
                "python_over_cpp": float(python_row / cpp_row),
            }
        )
    return {
        "benchmark": "serve_cpp_latency",
        "num_threads": num_threads,
        "load_average": os.getloadavg()[0],
        "results": results,
    }


@dataclass
class ServeCppLatencyFlags:
    """The flags of ``python bench/serve_cpp_latency.py``: what it measures and how."""

    model: str = flag(help="an export holding fp32.aoti.pt2")
    input: str = flag(help="labelled raw Criteo lines")
    program: str = flag(DEFAULT_PROGRAM, help="the built dlrm_predict")
    batch_sizes: str = flag("1,512", help="rows per request, comma-separated")
    requests: int = flag(200, help="timed requests per batch size and server")
    num_threads: int = flag(1, help="intra-op threads of both")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), ServeCppLatencyFlags, argv)
    with open(args.input, "rb") as f:
        lines = f.read().splitlines(keepends=True)[:100_000]
    record = run(
        args.program, args.model, lines, [int(b) for b in args.batch_sizes.split(",")], args.requests, args.num_threads
    )
    print(f"{args.num_threads} thread(s), load average {record['load_average']:.2f}:")
    for r in record["results"]:
        print(
            f"  batch {r['batch_size']:>4}: C++ {r['cpp_ms_per_row']:.4f} ms/row (request p50 "
            f"{r['cpp_request_p50_ms']:.3f} ms), Python {r['python_ms_per_row']:.4f} ms/row (request p50 "
            f"{r['python_request_p50_ms']:.3f} ms): Python/C++ {r['python_over_cpp']:.2f}x"
        )
    print(json.dumps(record))


if __name__ == "__main__":
    main()
