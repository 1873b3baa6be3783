"""A package's public names, imported from their modules on first use.

The entry points answer ``--help`` and bad flags before torch loads; a package whose
``__init__`` imported its torch-heavy modules would load torch for any import of its
light ones (the flag dataclasses). PEP 562's module ``__getattr__`` defers them.

Example (in a package's ``__init__.py``)::

    __getattr__, __all__ = lazy_exports(__name__, {"build_dlrm_train": "models.builder"})
"""

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, homes: dict[str, str]) -> tuple[Callable[[str], Any], list[str]]:
    """The ``__getattr__`` and ``__all__`` of ``package``, whose public names live in
    the modules ``homes`` maps them to."""

    def module_getattr(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(homes[name]), name)

    return module_getattr, sorted(homes)
