"""The compiled column kernels (data/parquet/native/columns.c) behind `ParquetColumns.convert`.

One pass per column from the Arrow buffers (validity bitmap, offsets, data) to the
batch's arrays: a sparse column's keys, embedding rows and bag lengths, a dense
column's float32 values written straight into the batch's matrix. The library is a
plain C file built by ``make native-data`` (``make install`` and scripts/install.sh
build it when a C compiler exists) and called through ctypes, which releases the GIL
for every call, so several reader threads convert at once. The hash itself is
native/id_hash.h, the very header the C++ predictor includes.

The numpy implementation (data/parquet/columns.py, data/parquet/id_hashing.py) stays the
reference, tested bit for bit against the kernels, and is what runs when the library is
absent (one line on stderr says so, once) or when ``DLRM_PARQUET_KERNEL=numpy`` asks for it.
An array the kernels do not take (float16 dense values, a dictionary holding nulls) is
converted by the reference, column by column.
"""

import ctypes
import os
import sys
import threading
from collections import OrderedDict

import numpy as np
import pyarrow as pa

from data.parquet.id_hashing import salt

# The environment variable that picks the implementation: "numpy" the reference, anything
# else (or unset) the kernels when built.
ENVIRONMENT = "DLRM_PARQUET_KERNEL"
LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native", "libdlrm_columns.so")
# columns.c's DLRM_COLUMNS_VERSION: a library built from other sources is not used.
VERSION = 5

# columns.c's value kinds.
_INTEGER_KINDS = {
    pa.int8(): 0,
    pa.int16(): 1,
    pa.int32(): 2,
    pa.int64(): 3,
    pa.uint8(): 4,
    pa.uint16(): 5,
    pa.uint32(): 6,
    pa.uint64(): 7,
}
_FLOAT_KINDS = {pa.float32(): 8, pa.float64(): 9}
_STRING32, _STRING64 = 10, 11


class _Ids(ctypes.Structure):
    """columns.c's dlrm_ids: one chunk of a sparse column."""

    _fields_ = [
        ("length", ctypes.c_int64),
        ("list_validity", ctypes.c_void_p),
        ("list_offsets", ctypes.c_void_p),
        ("list_offset", ctypes.c_int64),
        ("list_offsets_64", ctypes.c_int32),
        ("kind", ctypes.c_int32),
        ("validity", ctypes.c_void_p),
        ("offset", ctypes.c_int64),
        ("value_offsets", ctypes.c_void_p),
        ("data", ctypes.c_void_p),
        ("entries", ctypes.c_void_p),
        ("marks", ctypes.c_void_p),
        ("distinct", ctypes.c_void_p),
        ("distinct_written", ctypes.c_int64),
        ("table_size", ctypes.c_uint64),
        ("lengths_at", ctypes.c_int64),
        ("written", ctypes.c_int64),
        ("first_negative", ctypes.c_int64),
    ]


class _DenseChunk(ctypes.Structure):
    """columns.c's dlrm_dense_chunk: one chunk of a dense column."""

    _fields_ = [
        ("validity", ctypes.c_void_p),
        ("offset", ctypes.c_int64),
        ("data", ctypes.c_void_p),
        ("length", ctypes.c_int64),
        ("kind", ctypes.c_int32),
        ("column", ctypes.c_int32),
    ]


_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_missing: str | None = None  # why the library cannot be used, once found out


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None: the reference then converts (``DLRM_PARQUET_KERNEL=numpy``,
    or the library is not built or stale, which one line on stderr says, once per process)."""
    global _library, _missing
    if os.environ.get(ENVIRONMENT, "").strip().lower() == "numpy":
        return None
    if _library is not None or _missing is not None:
        return _library
    with _lock:
        if _library is None and _missing is None:
            try:
                _library = _load(LIBRARY)
            except OSError as e:
                _missing = str(e)
                print(
                    f"note: the Parquet column kernels are not built ({_missing}): converting with numpy, "
                    "about twice as slow; `make native-data` builds them (needs a C compiler)",
                    file=sys.stderr,
                )
    return _library


def _load(path: str) -> ctypes.CDLL:
    if not os.path.isfile(path):
        raise OSError(f"no {os.path.relpath(path)}")
    lib = ctypes.CDLL(path)
    lib.dlrm_columns_version.restype = ctypes.c_int32
    if lib.dlrm_columns_version() != VERSION:
        raise OSError(f"{os.path.relpath(path)} was built from other sources")
    lib.dlrm_id_bags.restype = ctypes.c_int64
    lib.dlrm_id_bags.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int32,
        ctypes.c_uint64,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    lib.dlrm_dense.restype = ctypes.c_int64
    lib.dlrm_dense.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int32,
        ctypes.c_void_p,
        ctypes.c_int32,
        ctypes.c_int64,
        ctypes.POINTER(ctypes.c_int64),
    ]
    lib.dlrm_bloom_add.restype = None
    lib.dlrm_bloom_add.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint64,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_uint64,
        ctypes.c_int32,
    ]
    lib.dlrm_sample_keys.restype = ctypes.c_int64
    lib.dlrm_sample_keys.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64, ctypes.c_int32, ctypes.c_void_p]
    lib.dlrm_set_add.restype = ctypes.c_int64
    lib.dlrm_set_add.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_uint64,
        ctypes.POINTER(ctypes.c_int32),
        ctypes.POINTER(ctypes.c_int64),
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_uint64,
        ctypes.c_int32,
        ctypes.c_int64,
    ]
    return lib


def _address(buffer: pa.Buffer | None) -> int | None:
    return None if buffer is None else buffer.address


def _chunks(column: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return list(column.chunks) if isinstance(column, pa.ChunkedArray) else [column]


def _values_kind(array: pa.Array) -> tuple[int, list[pa.Buffer | None]] | None:
    """(kind, buffers) of a flat array of ids, or None for a type the kernel does not take."""
    t = array.type
    if t in _INTEGER_KINDS:
        return _INTEGER_KINDS[t], array.buffers()
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return _STRING32, array.buffers()
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return _STRING64, array.buffers()
    return None


def _address_of(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def _ids_chunk(
    lib: ctypes.CDLL, array: pa.Array, table_size: int, modulo: bool, salt_value: int, keep: list[object]
) -> tuple[_Ids, int, int] | None:
    """(the dlrm_ids of a chunk of a sparse column, room for its ids, the entries of its
    dictionary or -1: the caller gives a dictionary-encoded chunk its marks and distinct),
    or None for a type the kernels do not take. ``keep`` receives what must outlive the call."""
    ids, capacity = _Ids(length=len(array), table_size=table_size), len(array)
    values = array
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        validity, offsets = array.buffers()[:2]
        wide = pa.types.is_large_list(array.type)
        if len(array):
            bounds = np.frombuffer(offsets, dtype=np.int64 if wide else np.int32)
            capacity = int(bounds[array.offset + len(array)]) - int(bounds[array.offset])
        ids.list_validity = _address(validity) if array.null_count else None
        ids.list_offsets, ids.list_offset, ids.list_offsets_64 = offsets.address, array.offset, wide
        values = array.values
    entries = -1
    if pa.types.is_dictionary(values.type):
        found = _dictionary_lookup(lib, values.dictionary, table_size, modulo, salt_value)
        if found is None:
            return None
        keep.append(found[0])
        ids.entries, entries = found[1], len(found[0])
        values = values.indices
    found_kind = _values_kind(values)
    if found_kind is None:
        return None
    kind, buffers = found_kind
    keep.append(values)
    ids.kind, ids.offset = kind, values.offset
    ids.validity = _address(buffers[0]) if values.null_count else None
    if kind in (_STRING32, _STRING64):
        ids.value_offsets = _address(buffers[1])
        # An array of empty strings may have no data buffer: no byte is read then.
        ids.data = _address(buffers[2]) if buffers[2] is not None and buffers[2].size else None
    else:
        ids.data = _address(buffers[1])
    return ids, capacity, entries


# A dictionary's (keys, embedding rows) by entry, per (dictionary, table size, modulo,
# salt): the batches cut from one row group share its dictionary, computed once. An entry
# holds its dictionary, so that the buffers' addresses (the cache's key) are not reused
# while it is cached. The least recently used go first, past a count and a size (entries
# and dictionaries together: the row groups the workers convert, several times over).
_LOOKUPS: "OrderedDict[tuple[object, ...], tuple[pa.Array, np.ndarray, int]]" = OrderedDict()
_LOOKUPS_HELD = 512
_LOOKUPS_BYTES = 64 << 20
_lookups_size = 0
_lookups_lock = threading.Lock()


def _dictionary_lookup(
    lib: ctypes.CDLL, dictionary: pa.Array, table_size: int, modulo: bool, salt_value: int
) -> tuple[np.ndarray, int] | None:
    """(columns.c's dlrm_entry of every entry of a dictionary ((entries, 2) uint64: key,
    embedding row), its address), or None where the kernels leave it to the reference
    (nulls in it, a type they do not take)."""
    if dictionary.null_count:
        return None
    addresses = tuple(b.address if b is not None else 0 for b in dictionary.buffers())
    key = (*addresses, dictionary.offset, len(dictionary), str(dictionary.type), table_size, int(modulo), salt_value)
    with _lookups_lock:
        if key in _LOOKUPS:
            _LOOKUPS.move_to_end(key)
            held = _LOOKUPS[key]
            return held[1], held[2]
    found = _bags(lib, [dictionary], [table_size], modulo, salt_value)[1][0]
    if found is None:
        return None
    # Negative ids (modulo) have row 0 here; the bags' loop still flags the first one read.
    entries = np.empty((len(dictionary), 2), dtype=np.uint64)
    entries[:, 0], entries[:, 1] = found[0], found[1].view(np.uint64)
    global _lookups_size
    with _lookups_lock:
        if key not in _LOOKUPS:
            _LOOKUPS[key] = (dictionary, entries, _address_of(entries))
            _lookups_size += _held_bytes(_LOOKUPS[key])
        while len(_LOOKUPS) > 1 and (len(_LOOKUPS) > _LOOKUPS_HELD or _lookups_size > _LOOKUPS_BYTES):
            _lookups_size -= _held_bytes(_LOOKUPS.popitem(last=False)[1])
    return entries, _address_of(entries)


def _held_bytes(held: tuple[pa.Array, np.ndarray, int]) -> int:
    return int(held[0].nbytes) + int(held[1].nbytes)


def clear_lookups() -> None:
    """Drops every cached dictionary (tests)."""
    global _lookups_size
    with _lookups_lock:
        _LOOKUPS.clear()
        _lookups_size = 0


# Per feature: (keys uint64, embedding rows int64, index of the first negative id or -1,
# its keys each at least once: the same set as the keys, fewer where dictionaries list them).
FeatureIds = tuple[np.ndarray, np.ndarray, int, np.ndarray]


def _bags(
    lib: ctypes.CDLL,
    columns: "list[pa.Array | pa.ChunkedArray]",
    table_sizes: "list[int]",
    modulo: bool,
    salt_value: int,
) -> tuple[np.ndarray, "list[FeatureIds | None]", np.ndarray]:
    keep: list[object] = list(columns)
    structs: list[_Ids] = []
    spans: list[tuple[int, int] | None] = []
    listed: list[list[tuple[int, int] | None]] = []  # per chunk: its distinct keys' (start, room)
    capacity = marks_size = distinct_size = 0
    num_rows = len(columns[0]) if columns else 0
    for f, (column, size) in enumerate(zip(columns, table_sizes)):
        found = [_ids_chunk(lib, array, size, modulo, salt_value, keep) for array in _chunks(column)]
        if any(c is None for c in found):
            spans.append(None)
            listed.append([])
            continue
        spans.append((len(structs), len(structs) + len(found)))
        listed.append([])
        row = 0
        for ids, room, entries in found:  # type: ignore[misc]
            ids.lengths_at = f * num_rows + row
            row += ids.length
            capacity += room
            structs.append(ids)
            if entries < 0:
                listed[-1].append(None)
                continue
            # Marked in one zeroed buffer for every chunk, listed in one array: a bit an
            # entry, a key each entry read (at most one a value).
            ids.marks, ids.distinct = marks_size, distinct_size
            listed[-1].append((distinct_size, min(entries, room)))
            marks_size += (entries + 7) // 8
            distinct_size += min(entries, room)
    marks, distinct = np.zeros(marks_size, dtype=np.uint8), np.empty(distinct_size, dtype=np.uint64)
    marks_at, distinct_at = _address_of(marks), _address_of(distinct)
    for ids in structs:
        if ids.entries:
            ids.marks, ids.distinct = marks_at + (ids.marks or 0), distinct_at + 8 * (ids.distinct or 0)
    lengths = np.empty((len(columns), num_rows), dtype=np.int32)
    keys, rows = np.empty(capacity, dtype=np.uint64), np.empty(capacity, dtype=np.int64)
    array = (_Ids * len(structs))(*structs)
    lib.dlrm_id_bags(
        array, len(structs), int(modulo), salt_value, _address_of(lengths), _address_of(keys), _address_of(rows)
    )
    features: list[FeatureIds | None] = []
    start = 0
    for span, places in zip(spans, listed):
        if span is None:
            features.append(None)
            continue
        first_negative, count = -1, 0
        for chunk in array[span[0] : span[1]]:
            if first_negative < 0 <= chunk.first_negative:
                first_negative = count + chunk.first_negative
            count += chunk.written
        feature_keys = keys[start : start + count]
        if places and all(p is not None for p in places):  # every chunk a dictionary's
            chunks = array[span[0] : span[1]]
            parts = [distinct[p[0] : p[0] + c.distinct_written] for p, c in zip(places, chunks)]  # type: ignore[index]
            unique = parts[0] if len(parts) == 1 else np.concatenate(parts)
        else:
            unique = feature_keys
        features.append((feature_keys, rows[start : start + count], first_negative, unique))
        start += count
    return lengths, features, rows[:start]


def sparse_bags(
    lib: ctypes.CDLL,
    columns: "list[pa.Array | pa.ChunkedArray]",
    table_sizes: "list[int]",
    modulo: bool,
    seed: int,
) -> tuple[np.ndarray, "list[FeatureIds | None]", np.ndarray]:
    """The bags of sparse columns of equal length, in one call (the GIL released):
    (bag lengths (features, rows) int32, per feature (keys uint64, embedding rows int64,
    index of its first negative id or -1, its keys each at least once: a dictionary-
    encoded chunk lists each entry it reads once, its key and row computed once per
    dictionary), or None where the kernels do not take the column's type and the
    reference must convert it (its lengths row then unset); the embedding rows of the
    features converted, back to back, as one array).
    ``modulo``: rows are the ids modulo the table size (a negative one's index returned
    for the caller's message), else the hash seeded with ``seed``."""
    return _bags(lib, columns, table_sizes, modulo, 0 if modulo else _salt(seed))


def _salt(seed: int) -> int:
    if seed not in _SALTS:
        _SALTS[seed] = salt(seed)
    return _SALTS[seed]


_SALTS: dict[int, int] = {}


def dense(
    lib: ctypes.CDLL, columns: "list[pa.Array | pa.ChunkedArray]", clamp: bool, out: np.ndarray
) -> tuple[list[int], tuple[int, int] | None]:
    """Writes dense columns into ``out[:, j]`` (a C-contiguous float32 or float64 matrix),
    nulls as 0, with ``clamp`` max(x, 0), in one call. Returns (the columns it left to the
    reference: types the kernels do not take, such as float16; (column, row) of the first
    NaN or infinite value, nothing written after it, or None)."""
    assert out.dtype in (np.float32, np.float64) and out.flags.c_contiguous and out.ndim == 2
    structs, owners, left = [], [], []
    for j, column in enumerate(columns):
        chunks = _chunks(column)
        if not all(c.type in _INTEGER_KINDS or c.type in _FLOAT_KINDS for c in chunks):
            left.append(j)
            continue
        for array in chunks:
            validity, data = array.buffers()[:2]
            kind = _INTEGER_KINDS.get(array.type, _FLOAT_KINDS.get(array.type))
            structs.append(
                _DenseChunk(
                    _address(validity) if array.null_count else None, array.offset, _address(data), len(array), kind, j
                )
            )
            owners.append(j)
    bad_chunk = ctypes.c_int64(-1)
    array = (_DenseChunk * len(structs))(*structs)
    wide = out.dtype == np.float64
    bad = lib.dlrm_dense(
        array, len(structs), int(clamp), _address_of(out), int(wide), out.shape[1], ctypes.byref(bad_chunk)
    )
    return left, ((owners[bad_chunk.value], bad) if bad >= 0 else None)


def bloom_add(packed: np.ndarray, keys: np.ndarray, salt_value: int, hashes: int) -> bool:
    """Sets the Bloom filter bits of ``keys`` (uint64) in ``packed`` (uint8, a power of 2
    of bits) as data/parquet/id_sketch.py's `_positions` places them, in one pass with the
    GIL released; False without the kernels (the caller then sets them with numpy)."""
    lib = library()
    if lib is None:
        return False
    assert packed.dtype == np.uint8 and packed.flags.c_contiguous
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    lib.dlrm_bloom_add(_address_of(packed), len(packed) * 8, _address_of(keys), len(keys), salt_value, hashes)
    return True


def sample_keys(keys: np.ndarray, salt_value: int, level: int) -> np.ndarray | None:
    """The keys (uint64) whose hash salted with ``salt_value`` has its top ``level`` bits 0,
    in order (data/parquet/id_collisions.py's sample); None without the kernels."""
    lib = library()
    if lib is None:
        return None
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    out = np.empty(len(keys), dtype=np.uint64)
    kept = lib.dlrm_sample_keys(_address_of(keys), len(keys), salt_value, level, _address_of(out))
    return out[:kept]


class KeySet:
    """A set of distinct 64-bit keys filled by columns.c's dlrm_set_add (a hash table,
    GIL released): what data/parquet/id_collisions.py keeps per feature, without sorting
    on every merge. Not thread-safe (the counter holds its lock).

    Args:
        lib: the loaded kernels (`library`).
    """

    _EMPTY = 2**64 - 1  # the slot value of an empty slot; the key itself is kept aside

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        self._slots = np.full(1024, self._EMPTY, dtype=np.uint64)
        self._has_empty, self._count = ctypes.c_int32(0), ctypes.c_int64(0)

    def __len__(self) -> int:
        return int(self._count.value)

    def add(self, keys: np.ndarray, salt_value: int, level: int, limit: int) -> int:
        """Adds the keys whose hash salted with ``salt_value`` has its top ``level`` bits 0,
        until the set holds ``limit`` keys (growing its table as needed). Returns how many
        of ``keys`` it went through: fewer than all when the limit stopped it."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        address, done = _address_of(keys), 0
        while done < len(keys) and len(self) < limit:
            room = min(limit, len(self._slots) // 2)  # at most half full
            if len(self) >= room:
                self._rebuild(len(self._slots) * 2)
                continue
            done += self._lib.dlrm_set_add(
                _address_of(self._slots),
                len(self._slots),
                self._EMPTY,
                ctypes.byref(self._has_empty),
                ctypes.byref(self._count),
                address + 8 * done,
                len(keys) - done,
                salt_value,
                level,
                room,
            )
        return done

    def keys(self) -> np.ndarray:
        """The keys held (uint64), in no order."""
        held = self._slots[self._slots != self._EMPTY]
        return np.append(held, np.uint64(self._EMPTY)) if self._has_empty.value else held

    def replace(self, keys: np.ndarray) -> None:
        """Holds exactly ``keys`` (distinct) instead."""
        self._slots = np.full(1024, self._EMPTY, dtype=np.uint64)
        self._has_empty.value, self._count.value = 0, 0
        self.add(keys, 0, 0, len(keys))

    def _rebuild(self, capacity: int) -> None:
        held = self.keys()
        self._slots = np.full(capacity, self._EMPTY, dtype=np.uint64)
        self._has_empty.value, self._count.value = 0, 0
        self.add(held, 0, 0, len(held))
