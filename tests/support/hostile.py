"""Settings shared by the generated hostile-input suites (tests/checkpoints/test_checkpoints_hostile.py tests/serving/test_model_files_hostile.py).

`make test` draws HOSTILE_EXAMPLES (default 10) cases per property, the same ones every
run (derandomized: a failure in CI reproduces); `make test-hostile` draws 200.
"""

import os

from hypothesis import HealthCheck, settings

HOSTILE_EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", "10"))
# Fixtures are function-scoped copies of a real checkpoint or model; each case is slow
# by hypothesis' measure (it loads a model), which is the point.
HOSTILE_SETTINGS = settings(
    max_examples=HOSTILE_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def rewrite_row_group_rows(path: str, row_group: int, rows: int) -> None:
    """Rewrites, in place, the row count the footer of Parquet file ``path`` gives row
    group ``row_group`` (to ``rows``, whose encoding must be as long as the old one's):
    a footer that lies about its pages, as a buggy writer or a hostile one leaves it.

    The footer is Thrift (compact protocol): each candidate encoding of the old count
    (an i64 field header, then the zigzag varint) is tried until pyarrow reads the new
    count for that row group and the same everything else."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def varint(value: int) -> bytes:
        zigzag, out = value << 1, bytearray()  # counts are never negative
        while zigzag >= 0x80:
            out.append(zigzag & 0x7F | 0x80)
            zigzag >>= 7
        return bytes(out + bytes([zigzag]))

    def summary(meta) -> list:
        return [meta.num_rows] + [
            (
                meta.row_group(g).num_rows if g != row_group else None,
                [meta.row_group(g).column(c).num_values for c in range(meta.num_columns)],
            )
            for g in range(meta.num_row_groups)
        ]

    with open(path, "rb") as f:
        data = f.read()
    meta = pq.ParquetFile(pa.BufferReader(data)).metadata
    old, new = varint(meta.row_group(row_group).num_rows), varint(rows)
    assert len(old) == len(new), "the new count must encode in as many bytes as the old one"
    footer_start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    at = data.find(b"\x16" + old, footer_start)
    while at >= 0:
        patched = data[: at + 1] + new + data[at + 1 + len(old) :]
        changed = pq.ParquetFile(pa.BufferReader(patched)).metadata
        if changed.row_group(row_group).num_rows == rows and summary(changed) == summary(meta):
            with open(path, "wb") as f:
                f.write(patched)
            return
        at = data.find(b"\x16" + old, at + 1)
    raise AssertionError(f"{path}: no row count of row group {row_group} found in the footer")
