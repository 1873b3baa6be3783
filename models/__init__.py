"""Model builders: DLRM (dot interaction), DCNv2 (low-rank cross net) and DLRM-projection;
without numerical features, the same three without a bottom MLP. Each interaction,
both model shapes included, is one module of models/interactions/; the blocks they
share are models/arch.py's."""

from common.lazy_exports import lazy_exports

# Where each public name lives. Loaded on first use, so that importing models.config
# (the flags) does not load torch: the entry points answer --help before it.
__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "INTERACTION_TYPES": "models.config",
        "ModelConfig": "models.config",
        "build_dlrm_train": "models.builder",
        "build_embedding_bag_configs": "models.builder",
    },
)
