"""Model builders: DLRM (dot interaction), DCNv2 (low-rank cross net) and DLRM-projection;
without numerical features, the same three without a bottom MLP (models/categorical_only.py)."""

from models.builder import build_dlrm_train, build_embedding_bag_configs
from models.config import INTERACTION_TYPES, ModelConfig

__all__ = [
    "INTERACTION_TYPES",
    "ModelConfig",
    "build_dlrm_train",
    "build_embedding_bag_configs",
]
