"""Moved: this alias of the old path stays for one release (CHANGELOG.md, Unreleased).

The model shape without numerical features is in `models.arch`; each interaction's
block for it is in its module of `models/interactions/`.
"""

from models.arch import CategoricalOnlyDLRM, categorical_only_dlrm
from models.interactions import dcn as _dcn
from models.interactions import dot as _dot
from models.interactions import projection as _projection

EmbeddingDotInteraction = _dot.blocks().EmbeddingDotInteraction
EmbeddingCrossInteraction = _dcn.blocks().EmbeddingCrossInteraction
EmbeddingProjectionInteraction = _projection.blocks().EmbeddingProjectionInteraction

__all__ = [
    "CategoricalOnlyDLRM",
    "EmbeddingCrossInteraction",
    "EmbeddingDotInteraction",
    "EmbeddingProjectionInteraction",
    "categorical_only_dlrm",
]
