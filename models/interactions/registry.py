"""The registry of interactions: name -> `Interaction`, and the nouns every interaction
module shares. It sits below both the package's `__init__` (which imports every
interaction module) and the interaction modules (which register themselves here), and
imports neither, nor `models.config` (`ModelSizes` names what it offers): models/
has no import circle.

An interaction is what a DLRM-family model does between its embeddings (and bottom
MLP) and its top MLP. Each lives in one module of this package: its config dataclass
(its flags, declared with `common.config_flags.flag`), its torch blocks, its build
function, and one `register` call. ``--interaction_type``'s choices, the parser's
flags, the builder, the start-up report and the run charts all read this registry.
"""

import functools
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol

from common.config_flags import flags_of
from models.model_sizes import ModelSizes

if TYPE_CHECKING:  # the build functions' types; this module loads without torch
    import torch
    from torch import nn

    from models.arch import PooledSparseArch


class InteractionConfig(Protocol):
    """What an interaction's config dataclass offers besides its flag fields."""

    def validate(self, model: ModelSizes) -> None:
        """Raises FlagError (one line naming the flag) when the sizes cannot build ``model``."""

    def describe(self) -> str:
        """Its sizes in a few words, for the start-up report ("3 cross layers of rank 512")."""


class BuildInteractionModel(Protocol):
    def __call__(
        self, model: ModelSizes, sparse_arch: "PooledSparseArch", dense_device: Optional["torch.device"]
    ) -> "nn.Module":
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
            raise ValueError(
                f"interaction {interaction.name!r}: flag {item.option} is already interaction {taken[item.name]!r}'s"
            )
    INTERACTIONS[interaction.name] = interaction
    return interaction


class TorchBlocks:
    """An interaction module's torch blocks, defined on first use.

    The flags import every interaction module and answer ``--help`` before torch
    loads, so a module's nn.Module classes cannot be defined when it loads: its
    ``define()`` imports torch and returns them (its locals). The first call of the
    `TorchBlocks` runs it once and makes each block a global of the module (so that
    ``from models.interactions.dot import DotInteraction`` works, through the module's
    ``__getattr__``), and returns them as a namespace.

    Args:
        module: the interaction module's ``__name__``.
        define: returns the blocks by name (``return locals()`` is the usual end; what
            it imports is left out).
        fx_leaves: names of functions among them that fx tracing (torchrec's train
            pipeline, the quantized export) keeps as calls instead of tracing through
            (an autograd.Function inside, say); ``define`` declares them ``global`` so
            that the blocks calling them look them up where fx patches them.

    Example (at the end of an interaction module)::

        def define_blocks() -> dict[str, Any]:
            import torch
            from torch import nn

            class ConcatInteraction(nn.Module):
                ...

            return locals()

        blocks = TorchBlocks(__name__, define_blocks)
        __getattr__ = blocks.module_getattr
    """

    def __init__(self, module: str, define: Callable[[], dict[str, Any]], fx_leaves: tuple[str, ...] = ()) -> None:
        self.module = module
        self.define = define
        self.fx_leaves = fx_leaves

    @functools.cached_property
    def _namespace(self) -> types.SimpleNamespace:
        # What ``define`` made, not what it imported (torch, torchrec's classes).
        made = {
            name: value for name, value in self.define().items() if getattr(value, "__module__", None) == self.module
        }
        namespace = sys.modules[self.module].__dict__
        namespace.update(made)
        for name in self.fx_leaves:
            # torch.fx.wrap accepts only a module's top-level frame (it patches the
            # name in that frame's globals while tracing); exec gives it one over the
            # module's globals. The string is this constant line: nothing from outside runs.
            exec(f"import torch.fx as _fx\n_fx.wrap({name!r})\ndel _fx", namespace)
            made[name] = namespace[name]
        return types.SimpleNamespace(**made)

    def __call__(self) -> types.SimpleNamespace:
        return self._namespace

    def module_getattr(self, name: str) -> Any:
        """The module's ``__getattr__`` (PEP 562): a block by name, defined on first use."""
        if name.startswith("__"):  # copy, pickle and inspect probe dunders: never define for them
            raise AttributeError(f"module {self.module!r} has no attribute {name!r}")
        try:
            return getattr(self._namespace, name)
        except AttributeError:
            raise AttributeError(f"module {self.module!r} has no attribute {name!r}") from None
