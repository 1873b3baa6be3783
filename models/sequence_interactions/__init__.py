"""The sequence interactions, one module each, registered by name
(`registry.SEQUENCE_INTERACTIONS`); importing this package registers them all.

A sequence interaction pools one history feature (``--sequence_columns HIST:ITEM``)
into one vector given the row's candidate item: target attention. That vector joins
the pooled embeddings as one more feature of the model's interaction (dot, DCN or
projection: models/interactions/), so the two registries combine freely. A new kind
is one module here (or in a ``models/sequence_interactions/`` folder under another
``sys.path`` entry), as for the interactions. The modules load without torch.
"""

import importlib
import pkgutil

from common.plugin_folders import plugin_folders

__path__ += plugin_folders(__path__, "models", "sequence_interactions")

from models.sequence_interactions.registry import (  # noqa: E402
    SEQUENCE_INTERACTIONS,
    SequenceInteraction,
    register,
)

# --sequence_interaction's first choices, in this order (not isort's): each module registers itself.
# isort: off
from models.sequence_interactions import din  # noqa: E402,F401
from models.sequence_interactions import transformer  # noqa: E402,F401
# isort: on


def _import_the_others() -> None:
    """Every other module, by name (the registry and private modules aside)."""
    for name in sorted({info.name for info in pkgutil.iter_modules(__path__)}):
        if name != "registry" and not name.startswith("_"):
            importlib.import_module(f"{__name__}.{name}")


_import_the_others()

__all__ = ["SEQUENCE_INTERACTIONS", "SequenceInteraction", "register"]
