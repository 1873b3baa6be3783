"""The model's configuration: architecture sizes and table sizes, checked by `validate()`."""

from dataclasses import dataclass, field
from typing import List

from common.errors import BadInput

INTERACTION_TYPES = ("original", "dcn", "projection")
EMBEDDING_PRECISIONS = ("fp32", "fp16")


def _check_layer_sizes(name: str, sizes: List[int]) -> None:
    if not sizes:
        raise BadInput(f"--{name} must list at least one layer size")
    bad = [s for s in sizes if s <= 0]
    if bad:
        raise BadInput(f"--{name} sizes must be positive, got {bad[0]} in {sizes}")


@dataclass
class ModelConfig:
    """Architecture of a DLRM-family model.

    Args:
        num_embeddings_per_feature: rows of each categorical feature's table, in the
            order of `sparse_feature_names`.
        sparse_feature_names: names of the categorical features (KJT keys); table i is
            named ``t_<name>``.
        dense_in_features: number of numerical features.
        embedding_dim: width of every embedding table.
        embedding_precision: data type of the table weights, "fp32" or "fp16".
        interaction_type: "original" (DLRM dot products), "dcn" (DCNv2 low-rank cross
            net) or "projection" (DLRM with two projection MLPs).
        dense_arch_layer_sizes: bottom MLP; its last size must equal embedding_dim.
        over_arch_layer_sizes: top MLP; its last size must be 1 (one logit).
        dcn_num_layers: cross layers (interaction_type "dcn").
        dcn_low_rank_dim: rank of each cross layer's weight (interaction_type "dcn").
        interaction_branch1_layer_sizes: projection branch 1 (interaction_type
            "projection"); its last size must be a multiple of embedding_dim.
        interaction_branch2_layer_sizes: projection branch 2, likewise.
        embedding_precision: "fp32" or "fp16" table weights (fp16 halves table memory).

    Example::

        config = ModelConfig(num_embeddings_per_feature=[100] * 26)
        config.validate()
    """

    num_embeddings_per_feature: List[int]
    sparse_feature_names: List[str] = field(
        default_factory=lambda: [f"cat_{i}" for i in range(26)]
    )
    dense_in_features: int = 13
    embedding_dim: int = 64
    embedding_precision: str = "fp32"
    interaction_type: str = "original"
    dense_arch_layer_sizes: List[int] = field(default_factory=lambda: [512, 256, 64])
    over_arch_layer_sizes: List[int] = field(default_factory=lambda: [512, 512, 256, 1])
    dcn_num_layers: int = 3
    dcn_low_rank_dim: int = 512
    interaction_branch1_layer_sizes: List[int] = field(default_factory=lambda: [2048, 2048])
    interaction_branch2_layer_sizes: List[int] = field(default_factory=lambda: [2048, 2048])
    embedding_precision: str = "fp32"

    @property
    def embedding_bytes_per_element(self) -> int:
        return 2 if self.embedding_precision == "fp16" else 4

    @property
    def table_names(self) -> List[str]:
        return [f"t_{name}" for name in self.sparse_feature_names]

    def validate(self) -> None:
        """Raises BadInput with one line naming the offending flag."""
        if self.interaction_type not in INTERACTION_TYPES:
            raise BadInput(
                f"--interaction_type must be one of {', '.join(INTERACTION_TYPES)}, "
                f"got {self.interaction_type!r}"
            )
        if self.embedding_precision not in EMBEDDING_PRECISIONS:
            raise BadInput(
                f"--embedding_precision must be one of {', '.join(EMBEDDING_PRECISIONS)}, "
                f"got {self.embedding_precision!r}"
            )
        if self.embedding_dim <= 0:
            raise BadInput(f"--embedding_dim must be positive, got {self.embedding_dim}")
        if self.dense_in_features <= 0:
            raise BadInput(
                f"the data must have at least one numerical feature, got {self.dense_in_features}"
            )
        if len(self.num_embeddings_per_feature) != len(self.sparse_feature_names):
            raise BadInput(
                f"--num_embeddings_per_feature has {len(self.num_embeddings_per_feature)} "
                f"values but the data has {len(self.sparse_feature_names)} categorical features"
            )
        for i, rows in enumerate(self.num_embeddings_per_feature):
            if rows <= 0:
                raise BadInput(
                    f"--num_embeddings_per_feature value {i} ({self.sparse_feature_names[i]}) "
                    f"must be positive, got {rows}"
                )
        _check_layer_sizes("dense_arch_layer_sizes", self.dense_arch_layer_sizes)
        _check_layer_sizes("over_arch_layer_sizes", self.over_arch_layer_sizes)
        if self.over_arch_layer_sizes[-1] != 1:
            raise BadInput(
                "--over_arch_layer_sizes must end in 1 (one logit per example), "
                f"got {self.over_arch_layer_sizes}"
            )
        if self.dense_arch_layer_sizes[-1] != self.embedding_dim:
            raise BadInput(
                f"the last --dense_arch_layer_sizes value ({self.dense_arch_layer_sizes[-1]}) "
                f"must equal --embedding_dim ({self.embedding_dim})"
            )
        if self.interaction_type == "dcn":
            if self.dcn_num_layers <= 0:
                raise BadInput(f"--dcn_num_layers must be positive, got {self.dcn_num_layers}")
            if self.dcn_low_rank_dim <= 0:
                raise BadInput(
                    f"--dcn_low_rank_dim must be positive, got {self.dcn_low_rank_dim}"
                )
        if self.interaction_type == "projection":
            for name, sizes in (
                ("interaction_branch1_layer_sizes", self.interaction_branch1_layer_sizes),
                ("interaction_branch2_layer_sizes", self.interaction_branch2_layer_sizes),
            ):
                _check_layer_sizes(name, sizes)
                if sizes[-1] % self.embedding_dim != 0:
                    raise BadInput(
                        f"the last --{name} value ({sizes[-1]}) must be a multiple of "
                        f"--embedding_dim ({self.embedding_dim})"
                    )
