"""Command-line helpers shared by every CLI of the project (data, training, plans).

Bad flags are one line on stderr and exit code 2, never a usage dump:

    parser = OneLineParser(prog="python -m data.transcode")
    parser.add_argument("--chunk_size", type=positive_int, default=65536)
    parser.add_argument("--sizes", type=int_list)
    # --chunk_size 0 -> "python -m data.transcode: error: argument --chunk_size: must be positive, got 0"
"""

import argparse
from typing import List, NoReturn


class OneLineParser(argparse.ArgumentParser):
    """Reports bad flags as one line (no usage dump) and exits with 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def int_list(text: str) -> List[int]:
    """Parses "512,256,64"; rejects empty items and non-integers."""
    items = text.split(",")
    if any(not item.strip() for item in items):
        raise argparse.ArgumentTypeError(f"malformed list {text!r}: empty item")
    try:
        return [int(item) for item in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"malformed list {text!r}: expected comma-separated integers")


def positive_int(text: str) -> int:
    """An integer above 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value
