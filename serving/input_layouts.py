"""Moved to serving/layouts/ (one module per input layout); this alias re-exports the
old names for one release."""

from serving.layouts import LAYOUTS, load_layout
from serving.layouts.base import Features, InputLayout, MalformedLineError, ParsedLines
from serving.layouts.criteo_lines import CriteoLines
from serving.layouts.csv_rows import CsvRows
from serving.layouts.parquet_rows import ParquetRows

__all__ = [
    "LAYOUTS",
    "CriteoLines",
    "CsvRows",
    "Features",
    "InputLayout",
    "MalformedLineError",
    "ParquetRows",
    "ParsedLines",
    "load_layout",
]
