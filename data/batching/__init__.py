"""Batches for the trainer: one rank's rows of a global batch (batches), the loaders
of the binary sources and random data (loaders), multi-hot bags (multi_hot), and the
checks of every value read (value_checks).

Imports no torch at import time (value_checks and multi_hot are read without it);
`BatchBuilder`, `RankBatchLayout` and the rest of the batches module are its names
too (``from data.batching import BatchBuilder``, their path before the package),
loaded when first asked for.
"""

import importlib
import importlib.util
from typing import Any


def __getattr__(name: str) -> Any:
    # A submodule not imported yet (``from data.batching import value_checks``) is
    # the import system's to load, without torch.
    if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is not None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    batches = importlib.import_module(f"{__name__}.batches")
    if not hasattr(batches, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(batches, name)
