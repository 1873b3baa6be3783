"""Raw categorical values to embedding rows: a stable, seeded 64-bit hash (``--id_hashing hash``).

Training, export, the predictor and the HTTP endpoint all map a raw value through
`embedding_rows`, so a value lands on the same row everywhere, on every machine and in
every release. The function is small enough to reproduce in a user's own pipeline (SQL,
Spark, C++); docs/data.md gives it step by step:

- integers (any width, signed or not) are read as their 64-bit two's complement
  pattern ``x``; strings (and binary) as their UTF-8 bytes, folded by 64-bit FNV-1a
  (offset basis 0xcbf29ce484222325, prime 0x100000001b3) into ``x``;
- the seed is mixed in as ``x ^ mix(seed)`` and the result mixed once more:
  ``h = mix(x ^ mix(seed))``, where ``mix`` is the splitmix64 finalizer
  (``z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27; z *= 0x94d049bb133111eb;
  z ^= z >> 31``, all modulo 2**64);
- the row is ``h % table_size``.

So the integer 17 and the string "17" are different values: a column keeps one type
(the Parquet reader refuses a column whose type changes between files).
"""

import numpy as np

FNV_OFFSET_BASIS = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)


def mix(values: np.ndarray, in_place: bool = False) -> np.ndarray:
    """The splitmix64 finalizer of every element (uint64 in, uint64 out); with
    ``in_place`` it overwrites ``values`` (uint64) instead of copying them."""
    with np.errstate(over="ignore"):
        z = values if in_place else values.astype(np.uint64, copy=True)
        z ^= z >> np.uint64(30)
        z *= _MIX_1
        z ^= z >> np.uint64(27)
        z *= _MIX_2
        z ^= z >> np.uint64(31)
    return z


def integer_keys(values: np.ndarray) -> np.ndarray:
    """The 64-bit pattern of integers of any width (int8 ... uint64) as uint64."""
    if values.dtype.kind not in "iu":
        raise TypeError(f"integer_keys takes integers, not {values.dtype}")
    return values.astype(np.int64 if values.dtype.kind == "i" else np.uint64).view(np.uint64)


def string_keys(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """64-bit FNV-1a of each string: value i is ``data[offsets[i]:offsets[i + 1]]``
    (an Arrow string array's buffers). Strings of one length are folded together as
    the columns of a (rows, length) byte matrix: a pass per byte position over every
    string of that length (one group for fixed-width ids such as Criteo's hex strings)."""
    offsets = offsets.astype(np.int64)
    starts, lengths = offsets[:-1], np.diff(offsets)
    keys = np.full(len(lengths), FNV_OFFSET_BASIS, dtype=np.uint64)
    if len(lengths) == 0:
        return keys
    first, last = int(lengths.min()), int(lengths.max())
    if first == last:  # one length: the strings lie back to back
        groups = [(slice(None), data[offsets[0] : offsets[0] + len(lengths) * first].reshape(len(lengths), first))]
    else:
        groups = []
        for length in np.unique(lengths):
            rows = np.flatnonzero(lengths == length)
            groups.append((rows, data[starts[rows, None] + np.arange(length)]))
    with np.errstate(over="ignore"):
        for rows, matrix in groups:
            folded = keys[rows]
            for position in range(matrix.shape[1]):
                folded ^= matrix[:, position]
                folded *= FNV_PRIME
            keys[rows] = folded
    return keys


def salt(seed: int) -> int:
    """``mix(seed)``: what the seed adds to every key (the compiled kernels take it so)."""
    return int(mix(np.array([seed], dtype=np.uint64))[0])


def hashed(keys: np.ndarray, seed: int) -> np.ndarray:
    """``mix(keys ^ mix(seed))``: the 64-bit hash of each key (uint64)."""
    return mix(keys ^ np.uint64(salt(seed)), in_place=True)


def embedding_rows(keys: np.ndarray, seed: int, table_size: int) -> np.ndarray:
    """The embedding row (int64, below ``table_size``) of each key of `integer_keys`
    or `string_keys`.

    Example::

        embedding_rows(integer_keys(np.array([17, 2**40])), seed=0, table_size=1000)
    """
    if not 0 < table_size < 2**63:
        raise ValueError(f"table_size must be positive and below 2**63, got {table_size}")
    rows = hashed(keys, seed)
    rows %= np.uint64(table_size)
    return rows.view(np.int64)  # below 2**63: the same values


# ``--id_hashing zch``: the managed-collision modules take non-negative int64 ids below
# int64's maximum, which they use to mark an empty slot (models/zch.py).
ZCH_ID_RANGE = 2**63 - 1


def zch_ids(keys: np.ndarray, seed: int) -> np.ndarray:
    """The input id (int64 in [0, 2**63 - 1)) of each key for ``--id_hashing zch``: the
    hash's top 63 bits, not reduced to a table row (the module gives each admitted id a
    row of its own): ``(hashed(keys, seed) >> 1) % (2**63 - 1)``.

    Example::

        zch_ids(integer_keys(np.array([17, 2**40])), seed=0)
    """
    ids = hashed(keys, seed)
    ids >>= np.uint64(1)
    ids %= np.uint64(ZCH_ID_RANGE)
    return ids.view(np.int64)
