"""Vectorised parsing of raw Criteo click-log lines (no Python loop over lines or fields).

A line is: label, 13 integer features, 26 categorical features as hexadecimal hashes,
tab-separated, ending in a newline; any feature may be empty. A chunk of whole lines
is parsed with numpy on its bytes: field boundaries from the positions of tabs and
newlines; each field's 8 bytes are read as one 64-bit word (an overlapping view of
the chunk), decimal digits combined within the word, hex hashes decoded by
``binascii.unhexlify``. Rare fields (negative or longer than 8 digits, short hashes,
bad characters) take a slower path over their characters.

Example::

    chunk = parse_criteo_lines(b"1\\t5\\t\\t...\\n")
    chunk.dense_raw, chunk.sparse_hash, chunk.labels, chunk.bad_lines
"""

import binascii
from dataclasses import dataclass

import numpy as np

from data.binary.criteo_layout import NUM_DENSE_FEATURES, NUM_SPARSE_FEATURES

NUM_FIELDS = 1 + NUM_DENSE_FEATURES + NUM_SPARSE_FEATURES
MAX_INT_DIGITS = 18  # fits int64 (and three 8-digit groups)
MAX_HEX_DIGITS = 8  # 32-bit hashes


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
    bad_lines: list[tuple[int, str]]
    num_lines: int


_PAD = 32  # zero bytes around the chunk, so windows and words near its ends stay in bounds

_ASCII_ZEROS = np.uint64(0x3030_3030_3030_3030)  # "00000000"
_SIXES = np.uint64(0x0606_0606_0606_0606)
_HIGH_NIBBLES = np.uint64(0xF0F0_F0F0_F0F0_F0F0)
# _LAST_BYTES[n]: the last n bytes of a little-endian word (its n most significant)
_LAST_BYTES = np.array([0] + [(1 << 64) - (1 << (8 * (8 - n))) for n in range(1, 9)], dtype=np.uint64)


def _byte_words(padded: np.ndarray, offset: int) -> np.ndarray:
    """Element i is padded[offset + i : offset + i + 8] read as a little-endian uint64.

    An overlapping view (1-byte strides, no copy): one index per field gathers 8 bytes.
    """
    return np.ndarray((len(padded) - offset - 7,), dtype="<u8", buffer=padded, offset=offset, strides=(1,))


def _windows(padded: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """padded[at + _PAD : at + _PAD + width] for every index in ``at`` (a copy).

    Indexes rows of a sliding-window view, so the index array has one entry per field
    rather than one per character.
    """
    return np.lib.stride_tricks.sliding_window_view(padded, width)[at + _PAD]


def _right_aligned(
    padded: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """Characters of each field right-aligned in ``width`` columns, and which are real."""
    chars = _windows(padded, starts + lengths - width, width)
    valid = np.arange(-width, 0) >= -lengths[..., None]
    return chars, valid


def _hex_nibbles(chars: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def _eight_digits(digits: np.ndarray) -> np.ndarray:
    """Values of uint64 words holding 8 decimal digits, one per byte, the most significant
    in the lowest byte: neighbouring bytes, then 16-bit and 32-bit lanes are combined
    (each sum fits its lane; what spills above is masked off)."""
    pairs = (digits * np.uint64(10) + (digits >> np.uint64(8))) & np.uint64(0x00FF_00FF_00FF_00FF)
    quads = (pairs * np.uint64(100) + (pairs >> np.uint64(16))) & np.uint64(0x0000_FFFF_0000_FFFF)
    return (quads * np.uint64(10_000) + (quads >> np.uint64(32))) & np.uint64(0xFFFF_FFFF)


def _parse_ints(
    padded: np.ndarray, words_before: np.ndarray, ends: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(values int64, ok bool) for decimal integers with an optional leading '-'.

    ``words_before[e]`` holds the 8 bytes before position e: fields of up to 8 digits
    are parsed within that word; the rest (signs, longer or bad fields) by
    ``_parse_ints_by_chars``.
    """
    digits = (words_before[ends] ^ _ASCII_ZEROS) & _LAST_BYTES.take(lengths, mode="clip")  # longer fields: redone below
    # A byte is a digit iff it is below 16 and stays so when 6 is added.
    ok = ((digits | (digits + _SIXES)) & _HIGH_NIBBLES) == 0
    ok &= lengths <= 8
    values = _eight_digits(digits).view(np.int64)
    if not ok.all():
        rows, cols = np.nonzero(~ok)
        rare_ends = ends[rows, cols]
        values[rows, cols], ok[rows, cols] = _parse_ints_by_chars(padded, rare_ends - lengths[rows, cols], rare_ends)
    return values, ok


def _parse_ints_by_chars(padded: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values int64, ok bool) for decimal integers with an optional leading '-', from
    their characters gathered into rows (any length)."""
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


def _parse_hex(
    padded: np.ndarray, words_after: np.ndarray, tabs: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(values uint32, ok bool) for hexadecimal hashes of up to 8 digits, each after the
    tab at position ``tabs``.

    Criteo's hashes have exactly 8 digits: their words (``words_after[t]``: the 8 bytes
    after position t) are decoded together by ``binascii.unhexlify`` and read as
    big-endian 32-bit words. Shorter ones, and a chunk with a bad digit, take the
    vectorised nibble path.
    """
    full = lengths == MAX_HEX_DIGITS
    words = words_after[tabs]
    all_full = bool(full.all())
    if not all_full:
        words[~full] = _ASCII_ZEROS
    try:
        values = np.frombuffer(binascii.unhexlify(words), dtype=">u4").reshape(lengths.shape).astype(np.uint32)
        ok = np.ones(lengths.shape, dtype=bool)
    except binascii.Error:  # a non-hex character somewhere in the chunk: find it
        nibbles, is_hex = _hex_nibbles(words.view(np.uint8).reshape(*lengths.shape, MAX_HEX_DIGITS))
        ok = is_hex.all(axis=-1)
        packed = np.ascontiguousarray((nibbles[..., 0::2] << 4) | nibbles[..., 1::2])
        values = packed.view(">u4")[..., 0].astype(np.uint32)
    if all_full:
        return values, ok
    values[~full] = 0
    short = (lengths > 0) & ~full
    if short.any():
        ok[lengths > MAX_HEX_DIGITS] = False
        rows, cols = np.nonzero(short & (lengths < MAX_HEX_DIGITS))
        chars, valid = _right_aligned(padded, tabs[rows, cols] + 1, lengths[rows, cols], MAX_HEX_DIGITS)
        part, part_ok = _hex_nibbles(chars)
        ok[rows, cols] = np.all(part_ok | ~valid, axis=-1)
        shifts = np.arange(4 * (MAX_HEX_DIGITS - 1), -1, -4, dtype=np.uint32)
        values[rows, cols] = np.bitwise_or.reduce(np.where(valid, part, 0).astype(np.uint32) << shifts, axis=-1)
    return values, ok


def _int_reason(buf: np.ndarray, separators: np.ndarray, lengths: np.ndarray, feature: int) -> str:
    """Why integer feature ``feature`` of a line (its separators and field lengths) was
    rejected: too many digits for int64, or not a decimal integer at all."""
    end = int(separators[1 + feature])
    digits = buf[end - int(lengths[feature]) : end].tobytes().removeprefix(b"-")
    if len(digits) > MAX_INT_DIGITS and digits.isdigit():
        return f"integer feature {feature} is out of range: {len(digits)} digits (at most {MAX_INT_DIGITS})"
    return f"integer feature {feature} is not a decimal integer"


def parse_criteo_lines(data: bytes) -> ParsedChunk:
    """Parses whole lines (a missing final newline is allowed).

    A line is rejected, with a reason, when it does not have 40 fields, its label is
    not 0 or 1, an integer feature is not a decimal integer or has more than 18 digits
    (out of the int64 range), or a categorical feature is not a hexadecimal hash of at
    most 8 digits.
    """
    if data and not data.endswith(b"\n"):
        data += b"\n"
    padded = np.zeros(len(data) + 2 * _PAD, dtype=np.uint8)
    buf = padded[_PAD:-_PAD]
    buf[:] = np.frombuffer(data, dtype=np.uint8)
    # Tabs (9) and newlines (10) in order: one comparison finds them with the other
    # control bytes below 9, which are dropped only when there are any.
    separators = np.flatnonzero(buf < 11)
    kinds = buf[separators]
    if len(kinds) and kinds.min() < 9:
        separators = separators[kinds >= 9]
        kinds = buf[separators]
    is_newline = kinds == 10
    num_lines = int(np.count_nonzero(is_newline))
    empty = ParsedChunk(
        np.zeros((0, NUM_DENSE_FEATURES), np.int64),
        np.zeros((0, NUM_SPARSE_FEATURES), np.uint32),
        np.zeros(0, np.int32),
        [],
        num_lines,
    )
    if num_lines == 0:
        return empty
    bad: list[tuple[int, str]] = []
    if len(separators) == NUM_FIELDS * num_lines and is_newline[NUM_FIELDS - 1 :: NUM_FIELDS].all():
        # Every line has 40 fields (the usual chunk): no per-line bookkeeping.
        good = np.arange(num_lines)
        line_separators = separators.reshape(num_lines, NUM_FIELDS)
        line_starts = np.concatenate([[0], line_separators[:-1, -1] + 1])
    else:
        newline_at = np.flatnonzero(is_newline)
        fields_per_line = np.diff(newline_at, prepend=-1)
        bad = [
            (int(i), f"expected {NUM_FIELDS} tab-separated fields, found {int(fields_per_line[i])}")
            for i in np.flatnonzero(fields_per_line != NUM_FIELDS)
        ]
        good = np.flatnonzero(fields_per_line == NUM_FIELDS)
        if len(good) == 0:
            empty.bad_lines = bad
            return empty
        keep_separator = np.repeat(fields_per_line == NUM_FIELDS, fields_per_line)
        line_separators = separators[keep_separator].reshape(len(good), NUM_FIELDS)
        line_starts = np.concatenate([[0], separators[newline_at[:-1]] + 1])[good]
    # Field lengths from the gaps between consecutive separators, over the flat array
    # (contiguous, unlike a difference along rows); column k holds field k + 1.
    flat = line_separators.ravel()
    gaps = np.empty_like(flat)
    np.subtract(flat[1:], flat[:-1], out=gaps[:-1])
    gaps -= 1
    lengths = gaps.reshape(len(good), NUM_FIELDS)[:, :-1]  # the last column spans two lines
    # A carriage return before the newline belongs to no field.
    lengths[:, -1] -= buf[line_separators[:, -1] - 1] == 13

    label_char = buf[line_starts] - np.uint8(48)
    label_ok = (line_separators[:, 0] - line_starts == 1) & (label_char <= 1)
    labels = label_char.astype(np.int32)
    dense, dense_ok = _parse_ints(
        padded,
        _byte_words(padded, _PAD - 8),
        line_separators[:, 1 : 1 + NUM_DENSE_FEATURES],
        lengths[:, :NUM_DENSE_FEATURES],
    )
    sparse, sparse_ok = _parse_hex(
        padded,
        _byte_words(padded, _PAD + 1),
        line_separators[:, NUM_DENSE_FEATURES:-1],
        lengths[:, NUM_DENSE_FEATURES:],
    )

    if label_ok.all() and dense_ok.all() and sparse_ok.all():  # the usual chunk: nothing to reject
        return ParsedChunk(dense, sparse, labels, bad, num_lines)
    reasons = [
        (~label_ok, lambda i: "label must be 0 or 1"),
        (
            ~dense_ok.all(axis=1),
            lambda i: _int_reason(buf, line_separators[i], lengths[i], int(np.argmin(dense_ok[i]))),
        ),
        (
            ~sparse_ok.all(axis=1),
            lambda i: f"categorical feature {int(np.argmin(sparse_ok[i]))} is not a hexadecimal hash",
        ),
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
