"""Recipes: named sets of flag defaults, typed by the config classes they set.

A recipe sizes a model for a situation; precedence is command line > ``--recipe`` >
the entry point's own recipe (`DCNV2` for dcnv2_main.py) > the fields' defaults. A
``--recipe`` never changes the model's kind (its interaction type): dcnv2_main.py
--recipe small_data is still DCNv2.

Example::

    python dlrm_main.py --recipe small_data --dataset_path data/feature_spec.yaml
"""

from dataclasses import dataclass
from typing import Any

from common.config_flags import Overrides
from data.config import DataConfig
from models.config import ModelConfig
from training.config import EarlyStoppingConfig, OptimizerConfig, TrainConfig


@dataclass(frozen=True)
class Recipe:
    """A named set of defaults.

    Args:
        name: what ``--recipe`` calls it.
        summary: one line on when to use it.
        overrides: the values it sets, one `Overrides` per config class.
    """

    name: str
    summary: str
    overrides: tuple[Overrides, ...]

    def options(self) -> dict[str, Any]:
        """{``--flag``: value} of everything the recipe sets."""
        return {name: value for layer in self.overrides for name, value in layer.options().items()}

    def describe(self) -> str:
        """``name: summary (--flag value, ...)``, for --help and the docs."""
        settings = ", ".join(f"{name} {_text(value)}" for name, value in self.options().items())
        return f"{self.name}: {self.summary} ({settings})"


def _text(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


# dcnv2_main.py's defaults: the low-rank cross net over 128-wide embeddings.
DCNV2 = Recipe("dcnv2", "DCNv2: a low-rank cross net over 128-wide embeddings", (
    Overrides(ModelConfig, interaction_type="dcn", embedding_dim=128, dense_arch_layer_sizes=[512, 256, 128],
              over_arch_layer_sizes=[1024, 1024, 512, 256, 1], dcn_num_layers=3, dcn_low_rank_dim=512),
))

# Measured on MovieLens 100K against a logistic-regression baseline (bench/quality.py;
# the runs tried are in docs/quality.md): batch 256 gave the best validation AUROC and
# NE; a higher rate, wider tables, dropout and weight decay did not help at that size.
SMALL_DATA = Recipe("small_data", "for 10^4-10^6 training rows: a small model, Adagrad, early stopping", (
    Overrides(ModelConfig, embedding_dim=16, dense_arch_layer_sizes=[64, 16], over_arch_layer_sizes=[64, 32, 1],
              dcn_num_layers=2, dcn_low_rank_dim=16),
    Overrides(OptimizerConfig, optimizer="adagrad", learning_rate=0.05, weight_decay=0.0),
    Overrides(DataConfig, batch_size=256),
    Overrides(TrainConfig, dropout=0.0, epochs=8),
    Overrides(EarlyStoppingConfig, patience=2),
))

# The optimizer flags that train where the public example's defaults (fused SGD at
# 15) diverge: the Makefile's TRAIN_FLAGS have them (a test ties the two), and a
# diverging run with those defaults prints them.
STABLE_OPTIMIZER = Overrides(OptimizerConfig, learning_rate=0.05, optimizer="adagrad")

# What --recipe offers. They size a model, never choose its kind.
RECIPES: dict[str, Recipe] = {recipe.name: recipe for recipe in (SMALL_DATA,)}
