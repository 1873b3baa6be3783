"""Moved: this alias of the old path stays for one release (CHANGELOG.md, Unreleased).

The shared blocks are in `models.arch`, the dot interaction's in
`models.interactions.dot` (one module per interaction, with both model shapes).
"""

from models.arch import PooledSparseArch, align_to_sharded_embeddings, compile_dense_part, torchrec_dlrm
from models.interactions import dot as _dot

_blocks = _dot.blocks()
DotInteraction = _blocks.DotInteraction
OverlappedDLRM = _blocks.OverlappedDLRM
dot_interaction = _blocks.dot_interaction
gram_pairs = _blocks.gram_pairs

__all__ = [
    "DotInteraction",
    "OverlappedDLRM",
    "PooledSparseArch",
    "align_to_sharded_embeddings",
    "compile_dense_part",
    "dot_interaction",
    "gram_pairs",
    "torchrec_dlrm",
]
