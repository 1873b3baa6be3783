"""data/parquet/zch_map.py: an exported zch model's ids to rows (admitted: their row; any
other: its shard's default row, counted unseen), and facts that lie refused in one line."""

import numpy as np
import pytest

from data.parquet.id_hashing import ZCH_ID_RANGE, integer_keys, zch_ids
from data.parquet.zch_map import ZchIdMap, ZchMapError, check_facts

KEYS = integer_keys(np.arange(40))


def _map(segments=(0, 5, 10)) -> ZchIdMap:
    ids = np.sort(zch_ids(KEYS[:4], seed=1))
    return ZchIdMap(["C1"], [ids], [np.array([3, 1, 7, 6])], [np.array(segments)], 1, 1024)


def test_admitted_ids_read_their_rows_and_others_their_shards_default_row():
    zmap = _map()
    ids = zch_ids(KEYS, seed=1)
    rows = zmap.rows(0, KEYS)
    order = np.argsort(zch_ids(KEYS[:4], seed=1))
    assert rows[:4][order].tolist() == [3, 1, 7, 6]
    lower = ids[4:] < ZCH_ID_RANGE // 2  # the first 512 of 1024 buckets: shard 0
    assert lower.any() and (~lower).any()
    assert (rows[4:][lower] == 4).all() and (rows[4:][~lower] == 9).all()
    assert zmap.unseen([KEYS]) == [36]
    assert _map((0, 10)).rows(0, KEYS[4:]).tolist() == [9] * 36  # one shard: one default row


def test_bytes_round_trip_and_facts_that_lie_are_refused():
    zmap = _map()
    facts = zmap.facts()
    again = ZchIdMap.from_bytes(zmap.to_bytes(), ["C1"], facts, [10])
    assert np.array_equal(again.rows(0, KEYS), zmap.rows(0, KEYS))
    with pytest.raises(ZchMapError, match="^zch_ids.segments.C1 is .* a table of 12 rows"):
        check_facts(facts, ["C1"], [12])
    with pytest.raises(ZchMapError, match="not the model's"):
        ZchIdMap.from_bytes(zmap.to_bytes()[8:] + zmap.to_bytes()[:8], ["C1"], facts, [10])
    with pytest.raises(ZchMapError, match="zch_ids.live is of features C2"):
        check_facts({**facts, "live": {"C2": 4}}, ["C1"])
