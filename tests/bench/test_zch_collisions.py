"""bench/zch_collisions.py on a tiny two-day lake: a table with room for every id gives
zch no collision where the hash has some; a table of half the ids leaves half of them
on the default row."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench import zch_collisions


def test_zch_against_hash(tmp_path):
    generator = np.random.default_rng(0)
    for day in ("2026-11-01", "2026-11-02"):
        (tmp_path / f"date={day}").mkdir()
        ids = generator.integers(0, 200, size=2000)
        pq.write_table(pa.table({"label": np.zeros(2000, np.int8), "C1": ids}), str(tmp_path / f"date={day}/p.parquet"))
    roomy = zch_collisions.main(
        ["--parquet_path", str(tmp_path), "--table_fraction", "2", "--zch_eviction_interval", "1"]
    )
    assert roomy["zch_median_ids"] == 0.0 and roomy["zch_median_lookups"] == 0.0
    assert roomy["hash_median_ids"] > 0.2
    tight = zch_collisions.main(
        ["--parquet_path", str(tmp_path), "--table_fraction", "0.5", "--zch_eviction_interval", "1"]
    )
    assert abs(tight["zch_median_ids"] - 0.5) < 0.02
    assert tight["hash_median_ids"] > tight["zch_median_ids"]
