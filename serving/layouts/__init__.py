"""The serving input layouts, one module each: how an exported model's input lines
become its features (docs/extending.md, "A serving input layout").

Each module holds its inputs.json record, its export description from meta.json
alone and its reader (serving/layouts/base.py says what each is). Every layout is
imported here, at the top: importing any one of them first works.

Example::

    layout = load_layout(inputs, "model_dir", manifest)
    lines = layout.parse(b"1\\t5\\t...\\n", "in.tsv", first_line=1, labelled=True)
    dense, ids = layout.transform(lines.dense, lines.sparse)  # ids before the modulo of the table sizes
"""

from typing import TYPE_CHECKING

from common.manifest import ManifestEntry
from serving.layouts.base import InputLayout
from serving.layouts.criteo_lines import CriteoLines
from serving.layouts.csv_rows import CsvRows
from serving.layouts.parquet_rows import ParquetRows

if TYPE_CHECKING:
    from serving.model_inputs import ModelInputs

# Every layout's reader by its name (inputs.json "layout"; a data source's serving_layout).
LAYOUTS: dict[str, type[InputLayout]] = {reader.record.LAYOUT: reader for reader in (CriteoLines, CsvRows, ParquetRows)}


def load_layout(inputs: "ModelInputs", model_dir: str, manifest: dict[str, ManifestEntry] | None) -> InputLayout:
    """The input layout an exported model directory names, ready to parse lines."""
    return LAYOUTS[inputs.layout].load(inputs, model_dir, manifest)
