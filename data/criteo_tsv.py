"""Vectorised parsing of raw Criteo click-log lines (no Python loop over lines or fields).

A line is: label, 13 integer features, 26 categorical features as hexadecimal hashes,
tab-separated, ending in a newline; any feature may be empty. A chunk of whole lines
is parsed with numpy on its bytes: field boundaries from the positions of tabs and
newlines, digits and hex digits gathered into small matrices and combined.

Example::

    chunk = parse_criteo_lines(b"1\\t5\\t\\t...\\n")
    chunk.dense_raw, chunk.sparse_hash, chunk.labels, chunk.bad_lines
"""

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

NUM_INT = 13
NUM_CAT = 26
NUM_FIELDS = 1 + NUM_INT + NUM_CAT
MAX_INT_DIGITS = 18  # fits int64 (and three 8-digit groups)
MAX_HEX_DIGITS = 8  # 32-bit hashes

_HEX_VALUE = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_VALUE[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX_VALUE[_c] = 10 + _i


@dataclass
class ParsedChunk:
    """The good lines of a chunk, and where the bad ones are.

    Attributes:
        dense_raw: int64 (N, 13), missing values as 0.
        sparse_hash: uint32 (N, 26), missing values as 0.
        labels: int32 (N,).
        bad_lines: (index of the line in the chunk, reason) for every rejected line.
        num_lines: lines in the chunk, good and bad.
    """

    dense_raw: np.ndarray
    sparse_hash: np.ndarray
    labels: np.ndarray
    bad_lines: List[Tuple[int, str]]
    num_lines: int


_PAD = 32  # zero bytes around the chunk, so windows near its ends stay in bounds


def _windows(padded: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """padded[at + _PAD : at + _PAD + width] for every index in ``at`` (a copy).

    Indexes rows of a sliding-window view, so the index array has one entry per field
    rather than one per character.
    """
    return np.lib.stride_tricks.sliding_window_view(padded, width)[at + _PAD]


def _right_aligned(padded: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int) -> Tuple[np.ndarray, np.ndarray]:
    """Characters of each field right-aligned in ``width`` columns, and which are real."""
    chars = _windows(padded, starts + lengths - width, width)
    valid = np.arange(-width, 0) >= -lengths[..., None]
    return chars, valid


def _hex_nibbles(chars: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Nibble values of hex characters and whether each is a hex digit (uint8 arithmetic)."""
    digit = chars - np.uint8(48)  # '0'..'9' -> 0..9, everything else wraps above 9
    lower = chars | np.uint8(0x20)
    letter = (lower - np.uint8(97)) <= 5  # 'a'..'f' or 'A'..'F'
    is_digit = digit <= 9
    return np.where(is_digit, digit, lower - np.uint8(87)), is_digit | letter


def _digits_to_int(digits: np.ndarray) -> np.ndarray:
    """Values of right-aligned decimal digits (..., 8k) by pairwise combination: 2-digit
    numbers in uint8, 4-digit in uint16, 8-digit in uint32, then 8-digit groups in int64."""
    pairs = digits[..., 0::2] * np.uint8(10) + digits[..., 1::2]
    quads = pairs[..., 0::2].astype(np.uint16) * np.uint16(100) + pairs[..., 1::2]
    octs = quads[..., 0::2].astype(np.uint32) * np.uint32(10_000) + quads[..., 1::2]
    value = octs[..., 0].astype(np.int64)
    for g in range(1, octs.shape[-1]):
        value = value * 100_000_000 + octs[..., g]
    return value


def _parse_ints(padded: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(values int64, ok bool) for decimal integers with an optional leading '-'."""
    lengths = ends - starts
    negative = (lengths > 0) & (padded[starts + _PAD] == ord("-"))
    digit_lengths = lengths - negative
    ok = (digit_lengths <= MAX_INT_DIGITS) & ~(negative & (digit_lengths == 0))
    longest = int(min(max(int(digit_lengths.max(initial=0)), 1), MAX_INT_DIGITS))
    width = 8 * ((longest + 7) // 8)
    chars, valid = _right_aligned(padded, starts + negative, np.minimum(digit_lengths, width), width)
    digits = chars - np.uint8(48)  # non-digits wrap above 9
    digits *= valid
    ok &= digits.max(axis=-1) <= 9
    values = _digits_to_int(digits)
    return np.where(negative, -values, values), ok


def _parse_hex(padded: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(values uint32, ok bool) for hexadecimal hashes of up to 8 digits.

    Criteo's hashes have exactly 8 digits: those are gathered into one string that
    ``bytes.fromhex`` decodes, read as big-endian 32-bit words. Shorter ones, and a
    chunk with a bad digit, take the vectorised nibble path.
    """
    lengths = ends - starts
    full = lengths == MAX_HEX_DIGITS
    chars = _windows(padded, starts, MAX_HEX_DIGITS)
    chars[~full] = ord("0")
    try:
        values = np.frombuffer(bytes.fromhex(chars.tobytes().decode("latin1")), dtype=">u4")
        values = values.reshape(lengths.shape).astype(np.uint32)
        ok = np.ones(lengths.shape, dtype=bool)
    except ValueError:  # a non-hex character somewhere in the chunk: find it
        nibbles, is_hex = _hex_nibbles(chars)
        ok = is_hex.all(axis=-1)
        packed = np.ascontiguousarray((nibbles[..., 0::2] << 4) | nibbles[..., 1::2])
        values = packed.view(">u4")[..., 0].astype(np.uint32)
    values[~full] = 0
    short = (lengths > 0) & ~full
    if short.any():
        ok[lengths > MAX_HEX_DIGITS] = False
        rows, cols = np.nonzero(short & (lengths < MAX_HEX_DIGITS))
        chars, valid = _right_aligned(padded, starts[rows, cols], lengths[rows, cols], MAX_HEX_DIGITS)
        part, part_ok = _hex_nibbles(chars)
        ok[rows, cols] = np.all(part_ok | ~valid, axis=-1)
        shifts = np.arange(4 * (MAX_HEX_DIGITS - 1), -1, -4, dtype=np.uint32)
        values[rows, cols] = np.bitwise_or.reduce(np.where(valid, part, 0).astype(np.uint32) << shifts, axis=-1)
    return values, ok


def parse_criteo_lines(data: bytes) -> ParsedChunk:
    """Parses whole lines (a missing final newline is allowed).

    A line is rejected, with a reason, when it does not have 40 fields, its label is
    not 0 or 1, an integer feature is not a decimal integer, or a categorical feature
    is not a hexadecimal hash of at most 8 digits.
    """
    if data and not data.endswith(b"\n"):
        data += b"\n"
    buf = np.frombuffer(data, dtype=np.uint8)
    separators = np.flatnonzero((buf == 9) | (buf == 10))  # tabs and newlines, in order
    newline_at = np.flatnonzero(buf[separators] == 10)
    line_ends = separators[newline_at]
    num_lines = len(line_ends)
    empty = ParsedChunk(np.zeros((0, NUM_INT), np.int64), np.zeros((0, NUM_CAT), np.uint32),
                        np.zeros(0, np.int32), [], num_lines)
    if num_lines == 0:
        return empty
    line_starts = np.concatenate([[0], line_ends[:-1] + 1])
    # A carriage return before the newline belongs to no field.
    content_ends = line_ends - (buf[np.maximum(line_ends - 1, 0)] == 13) * (line_ends > line_starts)
    fields_per_line = np.diff(newline_at, prepend=-1)
    bad: List[Tuple[int, str]] = [
        (int(i), f"expected {NUM_FIELDS} tab-separated fields, found {int(fields_per_line[i])}")
        for i in np.flatnonzero(fields_per_line != NUM_FIELDS)
    ]
    good = np.flatnonzero(fields_per_line == NUM_FIELDS)
    if len(good) == 0:
        empty.bad_lines = bad
        return empty
    if len(good) == num_lines:
        line_separators = separators.reshape(num_lines, NUM_FIELDS)
    else:
        keep_separator = np.repeat(fields_per_line == NUM_FIELDS, fields_per_line)
        line_separators = separators[keep_separator].reshape(len(good), NUM_FIELDS)
    line_tabs = line_separators[:, :-1]
    starts = np.concatenate([line_starts[good, None], line_tabs + 1], axis=1)
    ends = np.concatenate([line_tabs, content_ends[good, None]], axis=1)

    label_char = buf[starts[:, 0]] - np.uint8(48)
    label_ok = (ends[:, 0] - starts[:, 0] == 1) & (label_char <= 1)
    labels = label_char.astype(np.int32)
    padded = np.zeros(len(buf) + 2 * _PAD, dtype=np.uint8)
    padded[_PAD:-_PAD] = buf
    dense, dense_ok = _parse_ints(padded, starts[:, 1 : 1 + NUM_INT], ends[:, 1 : 1 + NUM_INT])
    sparse, sparse_ok = _parse_hex(padded, starts[:, 1 + NUM_INT :], ends[:, 1 + NUM_INT :])

    reasons = [
        (~label_ok, lambda i: "label must be 0 or 1"),
        (~dense_ok.all(axis=1), lambda i: f"integer feature {int(np.argmin(dense_ok[i]))} is not a decimal integer"),
        (~sparse_ok.all(axis=1), lambda i: f"categorical feature {int(np.argmin(sparse_ok[i]))} is not a hexadecimal hash"),
    ]
    rejected = np.zeros(len(good), dtype=bool)
    for mask, reason in reasons:
        for i in np.flatnonzero(mask & ~rejected):
            bad.append((int(good[i]), reason(i)))
        rejected |= mask
    bad.sort()
    if rejected.any():
        keep = ~rejected
        dense, sparse, labels = dense[keep], sparse[keep], labels[keep]
    return ParsedChunk(dense, sparse, labels, bad, num_lines)
