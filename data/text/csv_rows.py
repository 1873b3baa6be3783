"""Headerless comma-separated rows of numbers (the BYO CSV layout), parsed a block at a
time, and the checks of categorical ids; problems name the exact line.

Both the transcoder (``data/transcode.py``) and the predictor (``serving/predict.py``)
read such rows; each formats the line number into its own messages.

Example::

    block = parse_csv_rows(["1,0.5,3\\n", "0,1.5,7\\n"], first_line=1, columns=3)  # float64 (2, 3)
    find_bad_id("cat_0", block[:, 2:], cardinality=5)  # (1, "feature 'cat_0' has id 7, but ...")
"""

from collections.abc import Sequence

import numpy as np

from common.errors import BadInput

MAX_ID = np.iinfo(np.int32).max  # split_binary ids are at most int32


class CsvRowsError(BadInput):
    """A bad line: ``line`` is its 1-based number in the file, ``reason`` what is wrong."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line, self.reason = line, reason


def parse_csv_rows(lines: Sequence[str], first_line: int, columns: int, expected: str | None = None) -> np.ndarray:
    """float64 (len(lines), columns) from whole lines of comma-separated numbers.

    Args:
        lines: the lines, with or without their newlines.
        first_line: the 1-based number of ``lines[0]`` in its file, for errors.
        columns: the number of values every line must have.
        expected: how to name the expected columns in errors (default: the count).

    Raises:
        CsvRowsError: at the first line that is empty, has another number of values,
            or holds something that is not a number.
    """
    if not lines:
        return np.zeros((0, columns))
    try:
        # comments=None: a '#' is bad data here, not the start of a comment.
        block = np.loadtxt(lines, delimiter=",", dtype=np.float64, ndmin=2, comments=None)
    except ValueError:
        block = None
    # loadtxt skips blank lines silently: a short block means one was there.
    if block is not None and block.shape == (len(lines), columns):
        return block
    # Only on the error path: find the first bad line, one at a time.
    for i, line in enumerate(lines):
        fields = line.rstrip("\r\n").split(",")
        if fields == [""]:
            raise CsvRowsError(first_line + i, "empty line")
        if len(fields) != columns:
            raise CsvRowsError(first_line + i, f"has {len(fields)} columns, expected {expected or columns}")
        for column, text in enumerate(fields, start=1):
            try:
                float(text)
            except ValueError:
                raise CsvRowsError(first_line + i, f"column {column} is not a number: {text.strip()!r}") from None
    raise CsvRowsError(first_line, "cannot be read as comma-separated numbers")


def find_bad_id(name: str, values: np.ndarray, cardinality: int | None) -> tuple[int, str] | None:
    """(row, reason) of the first value of ``values`` (rows, hotness) that is not an id
    of feature ``name``: a non-negative integer, below ``cardinality`` when it is known."""
    limit = MAX_ID if cardinality is None else cardinality - 1
    wrong = (values < 0) | (values > limit) | (values != np.floor(values))
    bad_rows = np.flatnonzero(wrong.any(axis=1))
    if not bad_rows.size:
        return None
    row = int(bad_rows[0])
    value = values[row][wrong[row]][0]
    if cardinality is not None and value == np.floor(value) and value > limit:
        return row, (
            f"feature {name!r} has id {value:.0f}, but its declared cardinality is {cardinality} (ids 0..{limit})"
        )
    return row, f"feature {name!r} has id {value:g}; ids must be integers from 0 to 2^31 - 1"
