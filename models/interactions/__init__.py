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

# Other sys.path entries' models/interactions/ folders join this package.
__path__ = pkgutil.extend_path(__path__, __name__)

from models.interactions.registry import INTERACTIONS, Interaction, InteractionConfig, register  # noqa: E402
# --interaction_type's first choices, in this order; each module registers itself.
from models.interactions import dot  # noqa: E402,F401
from models.interactions import dcn  # noqa: E402,F401
from models.interactions import projection  # noqa: E402,F401

# Then every other module, by name (the shared registry and private modules aside).
for _module in sorted({info.name for info in pkgutil.iter_modules(__path__)}):
    if _module != "registry" and not _module.startswith("_"):
        importlib.import_module(f"{__name__}.{_module}")
del _module

__all__ = ["INTERACTIONS", "Interaction", "InteractionConfig", "register"]
