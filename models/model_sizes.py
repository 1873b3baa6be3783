"""`ModelSizes`: what the model's blocks and interactions read of its config.

`models.config.ModelConfig` is what they get; it imports the interaction registry
for its flags (``--interaction_type``'s choices, each interaction's sizes), so the
registry, the interactions and the shared blocks (`models.arch`) name it by this
protocol instead of importing it: models/ has no import circle.
"""

from typing import Any, Protocol


class ModelSizes(Protocol):
    """The sizes of a DLRM-family model (`models.config.ModelConfig` is one)."""

    sparse_feature_names: list[str]
    dense_in_features: int
    embedding_dim: int
    dense_arch_layer_sizes: list[int]
    over_arch_layer_sizes: list[int]
    interaction_type: str
    interaction: Any  # the config of the interaction ``interaction_type`` names

    @property
    def has_dense_arch(self) -> bool:
        """Whether the data has numerical features (and so the model a bottom MLP)."""
