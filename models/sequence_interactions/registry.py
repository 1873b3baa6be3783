"""The registry of sequence interactions: name -> `SequenceInteraction`. Below the
package's `__init__` and the modules that register themselves here; imports no torch.

A sequence interaction is a torch module that takes one history feature's embeddings
padded to ``max_history`` (B, L, D), its mask (B, L) (True where a position holds an
item; a row may hold none) and the candidate item's embedding (B, D), and returns one
vector a row (B, D), which the model's interaction (models/interactions/) reads beside
the pooled embeddings. Padding positions must not change its output.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol

from common.config_flags import flags_of
from models.model_sizes import ModelSizes

if TYPE_CHECKING:  # the build functions' types; this module loads without torch
    import torch
    from torch import nn


class SequenceInteractionConfig(Protocol):
    """What a sequence interaction's config dataclass offers besides its flag fields."""

    def validate(self, model: ModelSizes) -> None:
        """Raises FlagError (one line naming the flag) when the sizes cannot build it."""

    def describe(self) -> str:
        """Its sizes in a few words, for the start-up report."""


@dataclass(frozen=True)
class SequenceInteraction:
    """One sequence interaction as the registry holds it.

    Args:
        name: its ``--sequence_interaction`` value.
        config: its config dataclass (its flags, each with a default).
        build: (model sizes, its config, max_history, dense device) -> the module
            (see the module's docstring for its forward).
    """

    name: str
    config: type[Any]
    build: Callable[[ModelSizes, Any, int, Optional["torch.device"]], "nn.Module"]


SEQUENCE_INTERACTIONS: dict[str, SequenceInteraction] = {}


def register(interaction: SequenceInteraction) -> SequenceInteraction:
    """Adds ``interaction``; refuses a name or a flag already taken."""
    if interaction.name in SEQUENCE_INTERACTIONS:
        raise ValueError(f"sequence interaction {interaction.name!r} is already registered")
    taken = {item.name: other.name for other in SEQUENCE_INTERACTIONS.values() for item in flags_of(other.config)}
    for item in flags_of(interaction.config):
        if item.name in taken:
            raise ValueError(
                f"sequence interaction {interaction.name!r}: flag {item.option} is already {taken[item.name]!r}'s"
            )
    SEQUENCE_INTERACTIONS[interaction.name] = interaction
    return interaction
