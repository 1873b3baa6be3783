"""Model builders: DLRM (dot interaction), DCNv2 (low-rank cross net) and DLRM-projection."""

from models.builder import build_dlrm_train, build_embedding_bag_configs
from models.config import INTERACTION_TYPES, ModelConfig

__all__ = [
    "INTERACTION_TYPES",
    "ModelConfig",
    "build_dlrm_train",
    "build_embedding_bag_configs",
]
