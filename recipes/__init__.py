"""Recipes: named sets of flag values that size a model for a situation.

Every command line with a ``--recipe`` reads the same recipes: the training entry
points and ``python -m sharding_plans``. A recipe is keyed by flag names (the
public interface both share), not by config classes, so this package imports
neither side; each command line types a recipe against its own config classes
(`Recipe.overrides`), and the flags it has no use for do not change what it does
(a plan does not depend on the learning rate). A recipe sizes a model, never
chooses its kind (its interaction type). Precedence: the command line, then
``--recipe``, then the entry point's own defaults.

Example::

    python dlrm_main.py --recipe small_data --dataset_path data/feature_spec.yaml
    python -m sharding_plans plan --recipe mlperf --world_size 8 --hbm_gb 40
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common.config_flags import Overrides, flags_of


@dataclass(frozen=True)
class Recipe:
    """A named set of flag values.

    Args:
        name: what ``--recipe`` calls it.
        summary: one line on when to use it.
        settings: {flag name without the dashes: value}.
    """

    name: str
    summary: str
    settings: Mapping[str, Any]

    def options(self) -> dict[str, Any]:
        """{``--flag``: value} of everything the recipe sets."""
        return {f"--{name}": value for name, value in self.settings.items()}

    def describe(self) -> str:
        """``name: summary (--flag value, ...)``, for --help and the docs."""
        settings = ", ".join(f"{name} {_text(value)}" for name, value in self.options().items())
        return f"{self.name}: {self.summary} ({settings})"

    def overrides(self, config_classes: Sequence[type], only_their_flags: bool = False) -> tuple[Overrides, ...]:
        """The recipe's values as one `Overrides` per config class that has some of its flags.

        Raises TypeError (a recipe written wrong) for a flag that two of the classes
        have, and, unless ``only_their_flags``, for one that none of them has.
        """
        owners: dict[str, list[tuple[type, str]]] = {}
        for config_class in dict.fromkeys(config_classes):
            for item in flags_of(config_class):
                owners.setdefault(item.name, []).append((config_class, item.field.name))
        values: dict[type, dict[str, Any]] = {}
        for name, value in self.settings.items():
            found = owners.get(name, [])
            if len(found) > 1:
                raise TypeError(
                    f"recipe {self.name}: --{name} is a flag of {found[0][0].__name__} and of {found[1][0].__name__}"
                )
            if not found:
                if only_their_flags:
                    continue
                raise TypeError(
                    f"recipe {self.name}: --{name} is not a flag of {', '.join(c.__name__ for c in config_classes)}"
                )
            config_class, field_name = found[0]
            values.setdefault(config_class, {})[field_name] = value
        return tuple(Overrides(config_class, **fields) for config_class, fields in values.items())


# Longer lists (the 26 table sizes) are shown by their first values and their length.
_SHOWN_ITEMS = 6


def _text(value: Any) -> str:
    if not isinstance(value, (list, tuple)):
        return str(value)
    if len(value) > _SHOWN_ITEMS:
        return ",".join(map(str, value[:3])) + f",... ({len(value)} values)"
    return ",".join(map(str, value))


# Measured on MovieLens 100K against a logistic-regression baseline (bench/quality.py;
# the runs tried are in docs/quality.md): batch 256 gave the best validation AUROC and
# NE; a higher rate, wider tables, dropout and weight decay did not help at that size.
SMALL_DATA = Recipe(
    "small_data",
    "for 10^4-10^6 training rows: a small model, Adagrad, early stopping",
    {
        "embedding_dim": 16,
        "dense_arch_layer_sizes": [64, 16],
        "over_arch_layer_sizes": [64, 32, 1],
        "dcn_num_layers": 2,
        "dcn_low_rank_dim": 16,
        "optimizer": "adagrad",
        "learning_rate": 0.05,
        "weight_decay": 0.0,
        "batch_size": 256,
        "dropout": 0.0,
        "epochs": 8,
        "early_stopping_patience": 2,
    },
)

# The published TorchRec DLRM configurations (the public example's results table,
# Criteo 1TB): their 26 table sizes, width 128 and batch per GPU. Their GPUs are the
# presets' part (`sharding_plans.presets`). The MLPs are dcnv2_main.py's (a 128-wide
# bottom MLP ends at the embedding width); a plan does not depend on them.
_PUBLISHED_MLPS = {"dense_arch_layer_sizes": [512, 256, 128], "over_arch_layer_sizes": [1024, 1024, 512, 256, 1]}
MLPERF = Recipe(
    "mlperf",
    "the published MLPerf tables (97.36 GiB), width 128, batch 8192 per GPU",
    {
        "num_embeddings_per_feature": [
            40000000,
            39060,
            17295,
            7424,
            20265,
            3,
            7122,
            1543,
            63,
            40000000,
            3067956,
            405282,
            10,
            2209,
            11938,
            155,
            4,
            976,
            14,
            40000000,
            40000000,
            40000000,
            590152,
            12973,
            108,
            36,
        ],
        "embedding_dim": 128,
        **_PUBLISHED_MLPS,
        "batch_size": 8192,
    },
)
MLPERF_X2 = Recipe(
    "mlperfx2",
    "the published MLPerfx2 tables (174.03 GiB), width 128, batch 4096 per GPU",
    {
        "num_embeddings_per_feature": [
            80000000,
            39060,
            17295,
            7424,
            20265,
            3,
            7122,
            1543,
            63,
            80000000,
            3067956,
            405282,
            10,
            2209,
            11938,
            155,
            4,
            976,
            14,
            80000000,
            40790948,
            80000000,
            590152,
            12973,
            108,
            36,
        ],
        "embedding_dim": 128,
        **_PUBLISHED_MLPS,
        "batch_size": 4096,
    },
)
FULL_SIZE = Recipe(
    "full_size",
    "the published Full Size tables (420.94 GiB), width 128, batch 819 per GPU",
    {
        "num_embeddings_per_feature": [
            227605432,
            39060,
            17295,
            7424,
            20265,
            3,
            7122,
            1543,
            63,
            130229467,
            3067956,
            405282,
            10,
            2209,
            11938,
            155,
            4,
            976,
            14,
            292775614,
            40790948,
            187188510,
            590152,
            12973,
            108,
            36,
        ],
        "embedding_dim": 128,
        **_PUBLISHED_MLPS,
        "batch_size": 819,
    },
)

# MLPerf Training's DLRMv2 benchmark (DLRM-DCNv2 on Criteo 1TB multi-hot): the mlperf
# tables, the bag size of each of the 26 features (214 ids a sample), DCNv2's 3 cross
# layers of rank 512, row-wise Adagrad at the reference's rate, fp16 tables and bf16
# dense arithmetic, and the reference's global batch of 65536 on one GPU. A recipe
# never chooses the interaction: the DCNv2 model is dcnv2_main.py's
# (``python dcnv2_main.py --recipe dlrmv2``).
DLRMV2_MULTI_HOT_SIZES = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
DLRMV2 = Recipe(
    "dlrmv2",
    "MLPerf DLRMv2 (dcnv2_main.py): the mlperf tables with multi-hot bags, "
    "fp16 tables, bf16 dense, row-wise Adagrad, batch 65536 on one GPU",
    {
        **{name: MLPERF.settings[name] for name in ("num_embeddings_per_feature", "embedding_dim")},
        **_PUBLISHED_MLPS,
        "dcn_num_layers": 3,
        "dcn_low_rank_dim": 512,
        "multi_hot_sizes": DLRMV2_MULTI_HOT_SIZES,
        "embedding_precision": "fp16",
        "dense_precision": "bf16",
        "optimizer": "rowwise_adagrad",
        "learning_rate": 0.004,
        "batch_size": 65536,
    },
)

# What --recipe offers, in every command line that has it.
RECIPES: dict[str, Recipe] = {recipe.name: recipe for recipe in (SMALL_DATA, MLPERF, MLPERF_X2, FULL_SIZE, DLRMV2)}
