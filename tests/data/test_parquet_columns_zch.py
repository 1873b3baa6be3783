"""``--id_hashing zch`` in data/parquet/columns.py: the ids handed to the model are the
hash's 63 top bits (data.parquet.id_hashing.zch_ids), never reduced to a row, with or
without the compiled kernels."""

import numpy as np
import pyarrow as pa

from data.parquet import kernel
from data.parquet.columns import ParquetColumns
from data.parquet.id_hashing import hashed, integer_keys, string_keys


def test_zch_ids_are_the_unreduced_hash(monkeypatch):
    rows = pa.table({"label": [0, 1, 1], "user": ["a", "bc", None], "ad": [[5, 6], [], [2**62]]})
    columns = ParquetColumns("label", (), ("user", "ad"), (10, 10), id_hashing="zch", hash_seed=7)
    users = string_keys(np.frombuffer(b"abc", dtype=np.uint8), np.array([0, 1, 3]))
    ads = integer_keys(np.array([5, 6, 2**62]))
    expected = [[int(h) >> 1 for h in hashed(keys, 7)] for keys in (users, ads)]
    converted = [columns.convert(rows)]
    monkeypatch.setattr(kernel, "library", lambda: None)  # the numpy reference alone
    converted.append(columns.convert(rows))
    for result in converted:
        assert [ids.tolist() for ids in result.ids] == expected
        assert result.lengths.tolist() == [[1, 1, 0], [2, 0, 1]]
        assert max(int(i) for ids in result.ids for i in ids) >= 10  # not taken modulo the table
