"""The model's configuration: architecture sizes and table sizes, checked by `validate()`."""

from dataclasses import dataclass
from typing import Optional

from common.config_flags import FlagError, check_choices, flag, option


INTERACTION_TYPES = ("original", "dcn", "projection")
EMBEDDING_PRECISIONS = ("fp32", "fp16")
# Rows of every table when neither the flags nor the data size them.
DEFAULT_NUM_EMBEDDINGS = 100_000


def _check_layer_sizes(config: object, name: str, sizes: list[int]) -> None:
    if not sizes:
        raise FlagError(f"{option(config, name)} must list at least one layer size")
    bad = [s for s in sizes if s <= 0]
    if bad:
        raise FlagError(f"{option(config, name)} sizes must be positive, got {bad[0]} in {sizes}")


@dataclass
class TableSizes:
    """How many rows each table gets: the flags', else the data's, capped.

    Args:
        num_embeddings_per_feature: rows of each table.
        num_embeddings: rows of every table (when the sizes per feature are not given).
        max_table_rows: cap of every table, however it was sized (ids at or above a
            table's size are taken modulo it).

    Example::

        TableSizes(max_table_rows=100).resolve(2, data_sizes=[5, 500])  # [5, 100]
    """

    num_embeddings_per_feature: Optional[list[int]] = flag(
        None, help="rows of each table, comma-separated (one value per categorical feature)")
    num_embeddings: Optional[int] = flag(
        None, help=f"rows of every table when --num_embeddings_per_feature is not given (default "
                   f"{DEFAULT_NUM_EMBEDDINGS}, or the data's metadata.json cardinalities)")
    max_table_rows: Optional[int] = flag(
        None, help="cap every table at N rows; ids at or above a table's size are taken modulo it (default: no cap)")

    def validate(self) -> None:
        """Raises FlagError naming the flag."""
        for name in ("num_embeddings", "max_table_rows"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise FlagError(f"{option(self, name)} must be positive, got {value}")

    def resolve(self, num_tables: int, data_sizes: Optional[list[int]]) -> list[int]:
        """Rows of each of ``num_tables`` tables; ``data_sizes``: the data's own (or None)."""
        if self.num_embeddings_per_feature is not None:
            sizes = list(self.num_embeddings_per_feature)
        elif self.num_embeddings is not None:
            sizes = [self.num_embeddings] * num_tables
        elif data_sizes is not None:
            sizes = list(data_sizes)
        else:
            sizes = [DEFAULT_NUM_EMBEDDINGS] * num_tables
        if self.max_table_rows is None:
            return sizes
        return [min(rows, self.max_table_rows) for rows in sizes]


@dataclass
class ModelConfig:
    """Architecture of a DLRM-family model.

    The features (names, numerical count) are the data's: its source describes them
    (``data.sources``); the model knows no data set.

    Args:
        num_embeddings_per_feature: rows of each categorical feature's table, in the
            order of `sparse_feature_names`.
        sparse_feature_names: names of the categorical features (KJT keys); table i is
            named ``t_<name>``.
        dense_in_features: number of numerical features; 0 for data with categorical
            features only, whose models have no bottom MLP (models/categorical_only.py).
        embedding_dim: width of every embedding table.
        embedding_precision: data type of the table weights, "fp32" or "fp16".
        interaction_type: "original" (DLRM dot products), "dcn" (DCNv2 low-rank cross
            net) or "projection" (DLRM with two projection MLPs).
        dense_arch_layer_sizes: bottom MLP; its last size must equal embedding_dim. Not
            used (nor checked) without numerical features.
        over_arch_layer_sizes: top MLP; its last size must be 1 (one logit).
        dcn_num_layers: cross layers (interaction_type "dcn").
        dcn_low_rank_dim: rank of each cross layer's weight (interaction_type "dcn").
        interaction_branch1_layer_sizes: projection branch 1 (interaction_type
            "projection"); its last size must be a multiple of embedding_dim.
        interaction_branch2_layer_sizes: projection branch 2, likewise.

    Example::

        config = ModelConfig(num_embeddings_per_feature=[100, 200], sparse_feature_names=["user", "item"],
                             dense_in_features=13)
        config.validate()
    """

    num_embeddings_per_feature: list[int]
    sparse_feature_names: list[str]
    dense_in_features: int
    embedding_dim: int = flag(64, help="width of every embedding table")
    embedding_precision: str = flag("fp32", choices=EMBEDDING_PRECISIONS,
                                    help="table weights in fp32 or fp16 (fp16 halves table memory)")
    interaction_type: str = flag("original", choices=INTERACTION_TYPES,
                                 help="original (DLRM dot products), dcn (DCNv2 cross net) or projection")
    dense_arch_layer_sizes: list[int] = flag([512, 256, 64],
                                             help="bottom MLP sizes (not used for data without numerical features)")
    over_arch_layer_sizes: list[int] = flag([512, 512, 256, 1], help="top MLP sizes (end in 1)")
    dcn_num_layers: int = flag(3, help="DCN cross layers")
    dcn_low_rank_dim: int = flag(512, help="rank of each DCN cross layer")
    interaction_branch1_layer_sizes: list[int] = flag([2048, 2048], help="projection branch 1 sizes")
    interaction_branch2_layer_sizes: list[int] = flag([2048, 2048], help="projection branch 2 sizes")

    @property
    def embedding_bytes_per_element(self) -> int:
        return 2 if self.embedding_precision == "fp16" else 4

    @property
    def has_dense_arch(self) -> bool:
        """Whether the model has a bottom MLP: the data has numerical features."""
        return self.dense_in_features > 0

    @property
    def table_names(self) -> list[str]:
        return [f"t_{name}" for name in self.sparse_feature_names]

    def validate(self) -> None:
        """Raises FlagError with one line naming the offending flag."""
        check_choices(self)
        if self.embedding_dim <= 0:
            raise FlagError(f"{option(self, 'embedding_dim')} must be positive, got {self.embedding_dim}")
        if self.dense_in_features < 0:
            raise FlagError(f"the number of numerical features cannot be negative, got {self.dense_in_features}")
        if not self.has_dense_arch and self.interaction_type == "original" and len(self.sparse_feature_names) < 2:
            raise FlagError(f"{option(self, 'interaction_type')} original on data without numerical features "
                            f"multiplies pairs of embeddings and needs at least two categorical features, the data "
                            f"has {len(self.sparse_feature_names)}: use dcn or projection")
        if len(self.num_embeddings_per_feature) != len(self.sparse_feature_names):
            raise FlagError(f"{option(TableSizes, 'num_embeddings_per_feature')} has {len(self.num_embeddings_per_feature)} "
                            f"values but the data has {len(self.sparse_feature_names)} categorical features")
        for i, rows in enumerate(self.num_embeddings_per_feature):
            if rows <= 0:
                raise FlagError(f"{option(TableSizes, 'num_embeddings_per_feature')} value {i} ({self.sparse_feature_names[i]}) "
                                f"must be positive, got {rows}")
        # Without numerical features there is no bottom MLP: its sizes are not used.
        if self.has_dense_arch:
            _check_layer_sizes(self, "dense_arch_layer_sizes", self.dense_arch_layer_sizes)
        _check_layer_sizes(self, "over_arch_layer_sizes", self.over_arch_layer_sizes)
        if self.over_arch_layer_sizes[-1] != 1:
            raise FlagError(f"{option(self, 'over_arch_layer_sizes')} must end in 1 (one logit per example), "
                            f"got {self.over_arch_layer_sizes}")
        if self.has_dense_arch and self.dense_arch_layer_sizes[-1] != self.embedding_dim:
            raise FlagError(f"the last {option(self, 'dense_arch_layer_sizes')} value "
                            f"({self.dense_arch_layer_sizes[-1]}) must equal {option(self, 'embedding_dim')} "
                            f"({self.embedding_dim})")
        if self.interaction_type == "dcn":
            for name in ("dcn_num_layers", "dcn_low_rank_dim"):
                if getattr(self, name) <= 0:
                    raise FlagError(f"{option(self, name)} must be positive, got {getattr(self, name)}")
        if self.interaction_type == "projection":
            for name in ("interaction_branch1_layer_sizes", "interaction_branch2_layer_sizes"):
                sizes = getattr(self, name)
                _check_layer_sizes(self, name, sizes)
                if sizes[-1] % self.embedding_dim != 0:
                    raise FlagError(f"the last {option(self, name)} value ({sizes[-1]}) must be a multiple of "
                                    f"{option(self, 'embedding_dim')} ({self.embedding_dim})")
