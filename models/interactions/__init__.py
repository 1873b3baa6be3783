"""The interactions of the DLRM family, one module each, registered by name
(`registry.INTERACTIONS`); importing this package registers them all.

A new interaction is a module here (its config dataclass, its build function, one
`register` call: docs/extending.md) and its import below. The modules load without
torch, since the flags list every interaction's and answer --help before torch loads.
"""

from models.interactions.registry import INTERACTIONS, Interaction, InteractionConfig, register
# Each registers itself; in the order of --interaction_type's choices.
from models.interactions import dot  # noqa: E402,F401
from models.interactions import dcn  # noqa: E402,F401
from models.interactions import projection  # noqa: E402,F401

__all__ = ["INTERACTIONS", "Interaction", "InteractionConfig", "register"]
