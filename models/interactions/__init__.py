"""The interactions of the DLRM family, one module each, registered by name
(`registry.INTERACTIONS`); importing this package registers them all.

A new interaction is one module (its config dataclass, its torch blocks, its build
function, one `register` call: docs/extending.md) and nothing else: every module of
this package is imported here, and so is every module of a ``models/interactions/``
folder under another ``sys.path`` entry (an interaction kept outside this
repository). The modules load without torch, since the flags list every
interaction's and answer --help before torch loads.
"""

import importlib
import pkgutil

from common.plugin_folders import plugin_folders

# After this package's own folder, whose modules win a name both have.
__path__ += plugin_folders(__path__, "models", "interactions")

# Imported after __path__ grows (E402): a plugin folder's modules are found with ours.
from models.interactions.registry import INTERACTIONS, Interaction, InteractionConfig, register  # noqa: E402

# --interaction_type's first choices, in this order (not isort's): each module registers itself.
# isort: off
from models.interactions import dot  # noqa: E402,F401
from models.interactions import dcn  # noqa: E402,F401
from models.interactions import projection  # noqa: E402,F401
# isort: on


def _import_the_others() -> None:
    """Every other module, by name (the shared registry and private modules aside)."""
    for name in sorted({info.name for info in pkgutil.iter_modules(__path__)}):
        if name != "registry" and not name.startswith("_"):
            importlib.import_module(f"{__name__}.{name}")


_import_the_others()

__all__ = ["INTERACTIONS", "Interaction", "InteractionConfig", "register"]
