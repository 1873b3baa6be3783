"""Raw ids to rows as a trained ``--id_hashing zch`` model maps them, outside torch: what an
exported zch model serves with (``python -m serving.export`` writes it, the Parquet
layout reads it; docs/zch.md).

Training hands the managed-collision modules the id `data.parquet.id_hashing.zch_ids`
(the hash's 63 top bits); each module keeps the sorted ids it admitted and the row of
each. Row-wise sharded, the input range is cut into ``buckets`` equal buckets (the last
one shorter), handed out in order, the same number to each shard, and a shard's last
row is its default row: an id its shard has not admitted reads it. `ZchIdMap` holds,
per feature, the admitted ids, their rows and the table's shard boundaries
(``segments``: 0, the first shard's end, ..., the table's rows), and maps an id exactly
so: the admitted one to its row, any other to the default row of its shard, counted as
unseen (never admitted, or evicted).

`ZCH_MAP_FILE` holds per feature the admitted ids then their rows, int64 little-endian;
inputs.json's ``preprocessing.zch_ids`` records what it holds (`facts`): ``version``,
``hash_seed``, ``buckets``, per feature ``live`` (the admitted ids) and ``segments``,
and the ``sha256`` of the file's bytes, which the reader checks.
"""

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.errors import BadInput
from common.json_fields import INTEGER, SHA256, feature_keys_error
from data.parquet.id_hashing import ZCH_ID_RANGE, zch_ids

ZCH_MAP_VERSION = 1
ZCH_MAP_FILE = "zch_ids.bin"


class ZchMapError(BadInput):
    """An id map whose facts or bytes are not what this code wrote for the model."""


@dataclass
class ZchIdMap:
    """Per feature the admitted ids (int64, increasing), the row of each, and the table's
    shard boundaries (``segments``).

    Example::

        zmap = ZchIdMap(["C1"], [np.array([5, 9])], [np.array([2, 0])], [np.array([0, 4])], 0, 1024)
        zmap.rows(0, keys)  # each key's row: 2 or 0 when admitted, else 3 (the default row)
    """

    names: list[str]
    admitted: list[np.ndarray]
    admitted_rows: list[np.ndarray]
    segments: list[np.ndarray]
    hash_seed: int
    buckets: int

    def _places(self, f: int, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(each key's zch id, its place among the admitted ids, whether it is admitted)."""
        ids = zch_ids(keys, self.hash_seed)
        admitted = self.admitted[f]
        if not len(admitted):
            return ids, np.zeros(len(ids), np.int64), np.zeros(len(ids), bool)
        place = np.searchsorted(admitted, ids)
        found = admitted[np.minimum(place, len(admitted) - 1)] == ids
        return ids, place, found

    def default_rows(self, f: int, ids: np.ndarray) -> np.ndarray:
        """The default row of each zch id's shard: the last row of the shard whose block of
        buckets holds it."""
        segments = self.segments[f]
        shards = len(segments) - 1
        bucket_size = -(-ZCH_ID_RANGE // self.buckets)
        shard = (ids // bucket_size) // (self.buckets // shards)
        return segments[1:][np.minimum(shard, shards - 1)] - 1

    def rows(self, f: int, keys: np.ndarray) -> np.ndarray:
        """The row (int64) of each key (uint64, `data.parquet.id_hashing` keys) of feature ``f``."""
        ids, place, found = self._places(f, keys)
        rows = self.admitted_rows[f]
        admitted = rows[np.minimum(place, len(rows) - 1)] if len(rows) else np.zeros(len(ids), np.int64)
        return np.where(found, admitted, self.default_rows(f, ids)).astype(np.int64)

    def unseen(self, keys: Sequence[np.ndarray], features: Sequence[int] | None = None) -> list[int]:
        """Per array of keys, how many the tables have no row of (never admitted, or evicted)."""
        order = range(len(keys)) if features is None else features
        return [int((~self._places(f, k)[2]).sum()) for f, k in zip(order, keys)]

    def holds_any(self) -> bool:
        return any(len(a) for a in self.admitted)

    def to_bytes(self) -> bytes:
        """`ZCH_MAP_FILE`'s content: per feature its admitted ids then their rows."""
        return b"".join(
            np.concatenate([a, r]).astype("<i8").tobytes() for a, r in zip(self.admitted, self.admitted_rows)
        )

    def facts(self) -> dict[str, Any]:
        """What inputs.json's ``preprocessing.zch_ids`` records."""
        return {
            "version": ZCH_MAP_VERSION,
            "hash_seed": self.hash_seed,
            "buckets": self.buckets,
            "live": {n: len(a) for n, a in zip(self.names, self.admitted)},
            "segments": {n: [int(s) for s in seg] for n, seg in zip(self.names, self.segments)},
            "sha256": hashlib.sha256(self.to_bytes()).hexdigest(),
        }

    @classmethod
    def from_bytes(
        cls, data: bytes, names: Sequence[str], facts: dict[str, Any], table_sizes: Sequence[int]
    ) -> "ZchIdMap":
        """The map of `to_bytes` given its ``facts`` (`check_facts`), for tables of ``table_sizes``.

        Raises:
            ZchMapError: bytes of another map (length, digest), ids out of order, rows outside the tables.
        """
        check_facts(facts, names, table_sizes)
        sizes = [facts["live"][n] for n in names]
        if len(data) != 16 * sum(sizes):
            raise ZchMapError(
                f"{len(data)} bytes, not the {16 * sum(sizes)} of the {sum(sizes)} admitted ids it records"
            )
        digest = hashlib.sha256(data).hexdigest()
        if digest != facts["sha256"]:
            raise ZchMapError(f"sha256 {digest[:12]}..., not the model's {str(facts['sha256'])[:12]}...")
        values = np.frombuffer(data, "<i8").astype(np.int64)
        admitted, rows, start = [], [], 0
        for n, size, table_rows in zip(names, sizes, table_sizes):
            admitted.append(values[start : start + size])
            rows.append(values[start + size : start + 2 * size])
            start += 2 * size
            if len(admitted[-1]) > 1 and not (admitted[-1][1:] > admitted[-1][:-1]).all():
                raise ZchMapError(f"feature {n}: its admitted ids are not in increasing order")
            if len(rows[-1]) and not ((rows[-1] >= 0) & (rows[-1] < table_rows)).all():
                raise ZchMapError(f"feature {n}: a row outside its table of {table_rows} rows")
        segments = [np.array(facts["segments"][n], np.int64) for n in names]
        return cls(list(names), admitted, rows, segments, int(facts["hash_seed"]), int(facts["buckets"]))


def check_facts(facts: Any, names: Sequence[str], table_sizes: Sequence[int] | None = None) -> None:
    """Refuses id-map facts this code did not write for these features (and, given
    ``table_sizes``, for tables of other sizes).

    Raises:
        ZchMapError: one line naming the field.
    """
    if not isinstance(facts, dict):
        raise ZchMapError("zch_ids is not an object")
    if facts.get("version") != ZCH_MAP_VERSION:
        raise ZchMapError(f"zch_ids.version is {facts.get('version')!r}, not {ZCH_MAP_VERSION}")
    for field in ("hash_seed", "buckets"):
        if not INTEGER.accepts(facts.get(field)):
            raise ZchMapError(f"zch_ids.{field} is {facts.get(field)!r}, not a count")
    if facts["buckets"] < 1:
        raise ZchMapError("zch_ids.buckets must be at least 1")
    digest = facts.get("sha256")
    if not SHA256.accepts(digest):
        raise ZchMapError("zch_ids.sha256 is not a sha256 hex digest")
    for field in ("live", "segments"):
        error = feature_keys_error(facts, field, names, "zch_ids")
        if error:
            raise ZchMapError(error)
    for i, n in enumerate(names):
        if not INTEGER.accepts(facts["live"][n]):
            raise ZchMapError(f"zch_ids.live.{n} is {facts['live'][n]!r}, not a count")
        segments = facts["segments"][n]
        rows = table_sizes[i] if table_sizes is not None else None
        if not (
            isinstance(segments, list)
            and len(segments) >= 2
            and all(INTEGER.accepts(s) for s in segments)
            and segments[0] == 0
            and all(b > a for a, b in zip(segments, segments[1:]))
            and (rows is None or segments[-1] == rows)
            and facts["buckets"] % (len(segments) - 1) == 0
        ):
            raise ZchMapError(
                f"zch_ids.segments.{n} is {segments!r}, not the shard boundaries of a table of "
                f"{rows if rows is not None else 'its'} rows over a number of shards dividing the buckets"
            )
