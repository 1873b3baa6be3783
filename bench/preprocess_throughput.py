"""Preprocessing speed and memory against a plain read and torchrec's own script.

Writes raw Criteo day files of two sizes (default 1M and 2M lines) from the synthetic
generator, then, in the same run, measures on each:
- a plain chunked read of the file (the I/O ceiling),
- `python -m data.preprocess_criteo` with one worker (one pass: hex -> int, log
  transform, npy files) and with `--frequency_threshold 2` (two passes),
- on the smaller file, torchrec's `python -m torchrec.datasets.scripts.npy_preproc_criteo`,
and prints MB/s of input and the peak RSS of each process.

    python bench/preprocess_throughput.py [--lines 1000000,2000000] [--skip_torchrec]
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

from common.cli import OneLineParser
from common.config_flags import flag, parse_flags
from data.synthetic_criteo import SyntheticCriteoSpec, write_raw_day

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _peak_rss_kib(pid: int) -> int:
    """VmHWM of a live process (its peak RSS since exec), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_measured(cmd: list[str]) -> dict[str, float]:
    """Wall seconds and peak RSS (MiB) of a child process.

    The peak is the child's own VmHWM, polled until it exits (ru_maxrss of a child
    would also count the memory of the parent it was forked from)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _peak_rss_kib(proc.pid))
        time.sleep(0.02)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.communicate()[1].decode()[-2000:]}")
    return {"seconds": seconds, "peak_rss_mib": peak / 1024}


def plain_read_seconds(path: str, chunk: int = 8 << 20) -> float:
    start = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(chunk):
            pass
    return time.perf_counter() - start


@dataclass
class PreprocessThroughputFlags:
    """The flags of ``python bench/preprocess_throughput.py``: what it measures and how."""

    lines: str = flag("1000000,2000000", help="comma-separated file sizes in lines")
    skip_torchrec: bool = flag(False, help="do not also time torchrec's npy_preproc_criteo on the first size")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(OneLineParser(description=__doc__.split("\n\n")[0]), PreprocessThroughputFlags, argv)
    sizes = [int(v) for v in args.lines.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for lines in sizes:
            raw = os.path.join(tmp, f"raw_{lines}")
            os.makedirs(raw)
            spec = SyntheticCriteoSpec(num_days=2, rows_per_day=lines, seed=1)
            path = os.path.join(raw, "day_0")
            write_raw_day(spec, path, 0)
            mb = os.path.getsize(path) / 1e6
            read_s = min(plain_read_seconds(path) for _ in range(2))
            row: dict[str, object] = {
                "lines": lines,
                "input_mb": round(mb, 1),
                "plain_read_mb_s": round(mb / read_s, 1),
            }
            for name, extra in (("ours_one_pass", []), ("ours_threshold", ["--frequency_threshold", "2"])):
                if extra:  # counting needs a training day and a last day
                    shutil.copy(path, os.path.join(raw, "day_1"))
                out = os.path.join(tmp, f"out_{lines}_{name}")
                m = run_measured(
                    [
                        sys.executable,
                        "-m",
                        "data.preprocess_criteo",
                        "--input_dir",
                        raw,
                        "--output_dir",
                        out,
                        "--dataset_name",
                        "criteo_1t",
                        "--workers",
                        "1",
                        *extra,
                    ]
                )
                input_mb = mb * (2 if extra else 1)
                row[f"{name}_mb_s"] = round(input_mb / m["seconds"], 1)
                row[f"{name}_peak_rss_mib"] = round(m["peak_rss_mib"])
                shutil.rmtree(out)
                if extra:
                    os.remove(os.path.join(raw, "day_1"))
            if not args.skip_torchrec and lines == sizes[0]:
                out = os.path.join(tmp, "out_torchrec")
                os.makedirs(out)
                m = run_measured(
                    [
                        sys.executable,
                        "-m",
                        "torchrec.datasets.scripts.npy_preproc_criteo",
                        "--input_dir",
                        raw,
                        "--output_dir",
                        out,
                        "--dataset_name",
                        "criteo_1tb",
                    ]
                )
                row["torchrec_mb_s"] = round(mb / m["seconds"], 1)
                row["torchrec_peak_rss_mib"] = round(m["peak_rss_mib"])
                row["speedup_vs_torchrec"] = round(row["ours_one_pass_mb_s"] / row["torchrec_mb_s"], 1)  # type: ignore[operator]
                shutil.rmtree(out)
            shutil.rmtree(raw)
            results.append(row)
            print(json.dumps(row), flush=True)
    print(
        f"{'lines':>9} {'MB':>7} {'read MB/s':>10} {'ours MB/s':>10} {'RSS MiB':>8} "
        f"{'thresh MB/s':>12} {'RSS MiB':>8} {'torchrec MB/s':>14} {'RSS MiB':>8}"
    )
    for r in results:
        print(
            f"{r['lines']:>9} {r['input_mb']:>7} {r['plain_read_mb_s']:>10} {r['ours_one_pass_mb_s']:>10} "
            f"{r['ours_one_pass_peak_rss_mib']:>8} {r['ours_threshold_mb_s']:>12} "
            f"{r['ours_threshold_peak_rss_mib']:>8} {r.get('torchrec_mb_s', '-'):>14} "
            f"{r.get('torchrec_peak_rss_mib', '-'):>8}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
