"""The registry of interactions: name -> `Interaction`.

An interaction is what a DLRM-family model does between its embeddings (and bottom
MLP) and its top MLP. Each lives in its own module of this package, which declares its
config dataclass (its flags, declared with `common.config_flags.flag`), its build
function, and registers them with one `register` call. ``--interaction_type``'s
choices, the parser's flags, the builder, the start-up report and the run charts all
read this registry.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol

from common.config_flags import flags_of

if TYPE_CHECKING:  # the build functions' types; this module loads without torch
    import torch
    from torch import nn

    from models.config import ModelConfig
    from models.interaction import PooledSparseArch


class InteractionConfig(Protocol):
    """What an interaction's config dataclass offers besides its flag fields."""

    def validate(self, model: "ModelConfig") -> None:
        """Raises FlagError (one line naming the flag) when the sizes cannot build ``model``."""

    def describe(self) -> str:
        """Its sizes in a few words, for the start-up report ("3 cross layers of rank 512")."""


class BuildInteractionModel(Protocol):
    def __call__(self, model: "ModelConfig", sparse_arch: "PooledSparseArch",
                 dense_device: Optional["torch.device"]) -> "nn.Module":
        """The model of ``model`` (validated; ``model.interaction`` is this interaction's
        config) over ``sparse_arch``, with a bottom MLP when the data has numerical
        features and without one otherwise, its MLPs made on ``dense_device`` (None:
        the default device). Its forward takes (dense features (B, N), KeyedJaggedTensor)
        and returns the logits (B, 1)."""


@dataclass(frozen=True)
class Interaction:
    """One interaction as the registry holds it.

    Args:
        name: its ``--interaction_type`` value.
        model_name: the model it makes, for reports and charts ("DCNv2").
        config: its config dataclass: its flags only, each with a default, and the
            methods of `InteractionConfig`.
        build: builds the model (`BuildInteractionModel`).
    """

    name: str
    model_name: str
    config: type[Any]
    build: BuildInteractionModel


INTERACTIONS: dict[str, Interaction] = {}


def register(interaction: Interaction) -> Interaction:
    """Adds ``interaction`` to the registry; refuses a name or a flag already taken (the
    parser holds every interaction's flags at once)."""
    if interaction.name in INTERACTIONS:
        raise ValueError(f"interaction {interaction.name!r} is already registered")
    taken = {item.name: other.name for other in INTERACTIONS.values() for item in flags_of(other.config)}
    for item in flags_of(interaction.config):
        if item.name in taken:
            raise ValueError(f"interaction {interaction.name!r}: flag {item.option} is already "
                             f"interaction {taken[item.name]!r}'s")
    INTERACTIONS[interaction.name] = interaction
    return interaction
