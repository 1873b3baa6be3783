"""The Parquet source's old home: it is data/sources/parquet.py now (this alias goes in
the release after next)."""

from data.sources.parquet import ParquetOptions, ParquetSource, statistics_lines  # noqa: F401
