"""The old path of data/batching/value_checks.py, kept as an alias for one release: importing
it gives that very module (CHANGELOG)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("data.batching.value_checks")
