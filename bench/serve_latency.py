"""Latency of the HTTP endpoint under load from local clients, with and without batching.

Serves an exported model with `serving.serve` on a free local port and runs
``--clients`` threads that each send ``--requests`` POSTs of ``--rows`` lines (drawn
from ``--input``: raw Criteo lines, or BYO CSV rows for a feature-spec model) back to
back. Prints request latency p50/p90/p99, records/s and the mean number of requests per forward, for
--max_batch_delay_ms 0 (no waiting) and the given delay, plus a JSON line.

    python bench/serve_latency.py --model model_dir --input day_2 [--clients 16] [--rows 1] [--num_threads 1]
"""

import json
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from serving.predict import Predictor
from serving.serve import serving_in_background


def run_load(
    predictor: Predictor, lines: list[bytes], clients: int, requests: int, rows: int, delay_ms: float
) -> dict[str, float]:
    """Serves, loads, stops; returns the figures of one configuration."""
    latencies: list[float] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        mine = []
        for r in range(requests):
            start_line = ((index * requests + r) * rows) % max(1, len(lines) - rows)
            body = b"".join(lines[start_line : start_line + rows])
            start = time.perf_counter()
            with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST")) as response:
                response.read()
            mine.append(time.perf_counter() - start)
        with lock:
            latencies.extend(mine)

    with serving_in_background(predictor, max_batch_delay_ms=delay_ms) as (base_url, batcher):
        url = base_url + "/predict"
        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - start
    p50, p90, p99 = np.percentile(np.asarray(latencies) * 1e3, (50, 90, 99))
    return {
        "max_batch_delay_ms": delay_ms,
        "latency_p50_ms": float(p50),
        "latency_p90_ms": float(p90),
        "latency_p99_ms": float(p99),
        "records_per_sec": clients * requests * rows / seconds,
        "requests_per_forward": float(np.mean(batcher.batch_requests)),
    }


@dataclass
class ServeLatencyFlags:
    """The flags of ``python bench/serve_latency.py``: what it measures and how."""

    model: str = flag(help="the export directory to serve")
    input: str = flag(help="lines to send: raw Criteo lines, or BYO CSV rows for a feature-spec model")
    variant: str = flag("fp32", help="which of the export's programs serves")
    clients: int = flag(16, help="clients sending requests at once")
    requests: int = flag(50, help="requests per client")
    rows: int = flag(1, help="lines per request")
    max_batch_delay_ms: float = flag(2.0, help="how long the server waits to batch requests (also measured at 0)")
    num_threads: int = flag(1, help="torch intra-op threads")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), ServeLatencyFlags, argv)
    torch.set_num_threads(args.num_threads)
    with open(args.input, "rb") as f:
        lines = f.read().splitlines(keepends=True)[:100_000]
    predictor = Predictor(args.model, args.variant)
    results = [
        run_load(predictor, lines, args.clients, args.requests, args.rows, delay)
        for delay in (0.0, args.max_batch_delay_ms)
    ]
    print(
        f"{args.clients} clients x {args.requests} requests of {args.rows} line(s), {args.variant}, "
        f"{args.num_threads} torch thread(s):"
    )
    for r in results:
        print(
            f"  delay {r['max_batch_delay_ms']:>4g} ms: p50 {r['latency_p50_ms']:.2f} ms, p90 "
            f"{r['latency_p90_ms']:.2f} ms, p99 {r['latency_p99_ms']:.2f} ms, {r['records_per_sec']:,.0f} "
            f"records/s, {r['requests_per_forward']:.1f} requests per forward"
        )
    print(
        json.dumps(
            {
                "benchmark": "serve_latency",
                "clients": args.clients,
                "rows": args.rows,
                "variant": args.variant,
                "num_threads": args.num_threads,
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
