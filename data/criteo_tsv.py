"""The old path of data/text/criteo_tsv.py, kept as an alias for one release: importing
it gives that very module (CHANGELOG)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("data.text.criteo_tsv")
