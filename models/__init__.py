"""Model builders: DLRM (dot interaction), DCNv2 (low-rank cross net) and DLRM-projection;
without numerical features, the same three without a bottom MLP (models/categorical_only.py)."""

import importlib
from typing import Any

# Where each public name lives. Loaded on first use, so that importing models.config
# (the flags) does not load torch: the entry points answer --help before it.
_PUBLIC = {
    "INTERACTION_TYPES": "models.config",
    "ModelConfig": "models.config",
    "build_dlrm_train": "models.builder",
    "build_embedding_bag_configs": "models.builder",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
