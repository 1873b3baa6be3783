"""The model's configuration: architecture sizes and table sizes, checked by `validate()`."""

import argparse
from dataclasses import dataclass, field
from typing import Any

from common.config_flags import FlagError, check_choices, check_layer_sizes, flag, option, variants
from common.sequence_columns import parse_sequence_columns
from models.interactions import INTERACTIONS, InteractionConfig
from models.sequence_interactions import SEQUENCE_INTERACTIONS

INTERACTION_TYPES = tuple(INTERACTIONS)
SEQUENCE_INTERACTION_TYPES = tuple(SEQUENCE_INTERACTIONS)
EMBEDDING_PRECISIONS = ("fp32", "fp16")
# Rows of every table when neither the flags nor the data size them.
DEFAULT_NUM_EMBEDDINGS = 100_000


# --num_embeddings auto: each table sized from the training split (training/table_sizing.py).
AUTO = "auto"


def rows_or_auto(text: str) -> int | str:
    """``--num_embeddings``: an integer (`TableSizes.validate` wants it positive), or ``auto``."""
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or auto, got {text!r}") from None


@dataclass
class TableSizes:
    """How many rows each table gets: the flags', else the data's, capped.

    Example::

        TableSizes(max_table_rows=100).resolve(2, data_sizes=[5, 500])  # [5, 100]
    """

    num_embeddings_per_feature: list[int] | None = flag(
        None, help="rows of each table, comma-separated (one value per categorical feature)"
    )
    num_embeddings: int | str | None = flag(
        None,
        parse=rows_or_auto,
        metavar="N|auto",
        help="rows of every table when --num_embeddings_per_feature is not given; auto: each table sized from "
        "the Parquet training split's distinct ids for --target_collision_share within --memory_gb (default "
        f"{DEFAULT_NUM_EMBEDDINGS}, or the data's metadata.json cardinalities)",
    )
    max_table_rows: int | None = flag(
        None, help="cap every table at N rows; ids at or above a table's size are taken modulo it (default: no cap)"
    )

    def validate(self) -> None:
        """Raises FlagError naming the flag."""
        for name in ("num_embeddings", "max_table_rows"):
            value = getattr(self, name)
            if value is not None and value != AUTO and value <= 0:
                raise FlagError(f"{option(self, name)} must be positive, got {value}")

    def resolve(self, num_tables: int, data_sizes: list[int] | None) -> list[int]:
        """Rows of each of ``num_tables`` tables; ``data_sizes``: the data's own (or None;
        with ``--num_embeddings auto``, the sizes the training split's profile gives)."""
        if self.num_embeddings_per_feature is not None:
            sizes = list(self.num_embeddings_per_feature)
        elif self.num_embeddings == AUTO:
            if data_sizes is None:
                raise FlagError(f"{option(self, 'num_embeddings')} auto sizes the tables from Parquet training data")
            sizes = list(data_sizes)
        elif isinstance(self.num_embeddings, int):
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
    """Architecture of a DLRM-family model: the embedding tables, the bottom and top
    MLPs, and the interaction between them, whose own sizes are in ``interaction``: the
    config of the interaction ``interaction_type`` names (models/interactions/).

    The features (names, numerical count) are the data's: its source describes them
    (``data.sources``); the model knows no data set.

    Example::

        config = ModelConfig(num_embeddings_per_feature=[100, 200], sparse_feature_names=["user", "item"],
                             dense_in_features=13, interaction_type="dcn", interaction=DCNConfig(dcn_num_layers=2))
        config.validate()
    """

    # Rows of each categorical feature's table, in the order of the names; table i is
    # named t_<name>; 0 numerical features: no bottom MLP (models/arch.py, CategoricalOnlyDLRM).
    num_embeddings_per_feature: list[int]
    sparse_feature_names: list[str]
    dense_in_features: int
    embedding_dim: int = flag(64, help="width of every embedding table")
    embedding_precision: str = flag(
        "fp32", choices=EMBEDDING_PRECISIONS, help="table weights in fp32 or fp16 (fp16 halves table memory)"
    )
    interaction_type: str = flag(
        "original", choices=INTERACTION_TYPES, help="original (DLRM dot products), dcn (DCNv2 cross net) or projection"
    )
    dense_arch_layer_sizes: list[int] = flag(
        [512, 256, 64], help="bottom MLP sizes (not used for data without numerical features)"
    )
    over_arch_layer_sizes: list[int] = flag([512, 512, 256, 1], help="top MLP sizes (end in 1)")
    interaction: InteractionConfig = variants(
        "interaction_type", {name: entry.config for name, entry in INTERACTIONS.items()}
    )
    sequence_interaction: str = flag(
        "din",
        choices=SEQUENCE_INTERACTION_TYPES,
        help="how each --sequence_columns history is pooled given the candidate item: din (DIN's target "
        "attention) or transformer (self-attention layers, then target attention)",
    )
    sequence: Any = variants(
        "sequence_interaction", {name: entry.config for name, entry in SEQUENCE_INTERACTIONS.items()}
    )
    # The data's history features, "HIST:ITEM" each, and their longest length (its
    # source describes them, `data.sources.FeatureDescription`): HIST is looked up in
    # ITEM's table, pooled by the sequence interaction, and the interaction reads the
    # result as one more feature after the categorical ones. None: a model without.
    sequence_columns: list[str] = field(default_factory=list)
    max_history: int = 0
    # --id_hashing zch (the data's flags, not the model's): "lfu" or "lru" puts torchrec's
    # managed-collision modules in front of the tables (models/zch.py), admitting and
    # evicting every ``zch_eviction_interval`` training steps. None: plain tables.
    zch_eviction_policy: str | None = None
    zch_eviction_interval: int = 100

    def __post_init__(self) -> None:
        sequence_entry = SEQUENCE_INTERACTIONS.get(self.sequence_interaction)
        if sequence_entry is not None and self.sequence is None:
            self.sequence = sequence_entry.config()
        entry = INTERACTIONS.get(self.interaction_type)  # None: validate() names the flag
        if entry is None:
            return
        if self.interaction is None:
            self.interaction = entry.config()
        elif not isinstance(self.interaction, entry.config):
            raise TypeError(
                f"interaction_type {self.interaction_type!r} takes a {entry.config.__name__}, "
                f"got a {type(self.interaction).__name__}"
            )

    @property
    def embedding_bytes_per_element(self) -> int:
        return 2 if self.embedding_precision == "fp16" else 4

    @property
    def has_dense_arch(self) -> bool:
        """Whether the model has a bottom MLP: the data has numerical features."""
        return self.dense_in_features > 0

    @property
    def sequences(self) -> list[tuple[str, str]]:
        """[(history feature, item feature)] of ``sequence_columns``."""
        return parse_sequence_columns(self.sequence_columns)

    @property
    def interaction_feature_names(self) -> list[str]:
        """The vectors the interaction reads besides the bottom MLP's: the categorical
        features' pooled embeddings, then each history's pooled one."""
        return [*self.sparse_feature_names, *(history for history, _ in self.sequences)]

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
        if len(self.num_embeddings_per_feature) != len(self.sparse_feature_names):
            raise FlagError(
                f"{option(TableSizes, 'num_embeddings_per_feature')} has {len(self.num_embeddings_per_feature)} "
                f"values but the data has {len(self.sparse_feature_names)} categorical features"
            )
        for i, rows in enumerate(self.num_embeddings_per_feature):
            if rows <= 0:
                raise FlagError(
                    f"{option(TableSizes, 'num_embeddings_per_feature')} value {i} ({self.sparse_feature_names[i]}) "
                    f"must be positive, got {rows}"
                )
        # Without numerical features there is no bottom MLP: its sizes are not used.
        if self.has_dense_arch:
            check_layer_sizes(self, "dense_arch_layer_sizes", self.dense_arch_layer_sizes)
        check_layer_sizes(self, "over_arch_layer_sizes", self.over_arch_layer_sizes)
        if self.over_arch_layer_sizes[-1] != 1:
            raise FlagError(
                f"{option(self, 'over_arch_layer_sizes')} must end in 1 (one logit per example), "
                f"got {self.over_arch_layer_sizes}"
            )
        if self.has_dense_arch and self.dense_arch_layer_sizes[-1] != self.embedding_dim:
            raise FlagError(
                f"the last {option(self, 'dense_arch_layer_sizes')} value "
                f"({self.dense_arch_layer_sizes[-1]}) must equal {option(self, 'embedding_dim')} "
                f"({self.embedding_dim})"
            )
        self.interaction.validate(self)
        if self.sequence_columns:
            self._validate_sequences()

    def _validate_sequences(self) -> None:
        items = {item for _, item in self.sequences}
        for item in items:
            if item not in self.sparse_feature_names:
                raise FlagError(f"--sequence_columns: {item!r} is not a categorical feature of the data")
        if not set(self.sparse_feature_names) - items:
            raise FlagError(
                "--sequence_columns: every categorical feature is a history's item; the model needs one more"
            )
        if self.max_history <= 0:
            raise FlagError(f"--max_history must be positive, got {self.max_history}")
        self.sequence.validate(self)
