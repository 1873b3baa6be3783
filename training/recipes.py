"""Training's own recipes: the entry points' defaults and the optimizer that trains
where the public example's does not. The recipes ``--recipe`` offers are in the
`recipes` package (the plan CLI reads them too).

Precedence is command line > ``--recipe`` > the entry point's own recipe (`DCNV2`
for dcnv2_main.py) > the fields' defaults. A ``--recipe`` never changes the model's
kind (its interaction type): dcnv2_main.py --recipe small_data is still DCNv2.

Example::

    python dlrm_main.py --recipe small_data --dataset_path data/feature_spec.yaml
"""

from common.config_flags import Overrides
from recipes import Recipe
from training.config import OptimizerConfig

# dcnv2_main.py's defaults: the low-rank cross net over 128-wide embeddings.
DCNV2 = Recipe(
    "dcnv2",
    "DCNv2: a low-rank cross net over 128-wide embeddings",
    {
        "interaction_type": "dcn",
        "embedding_dim": 128,
        "dense_arch_layer_sizes": [512, 256, 128],
        "over_arch_layer_sizes": [1024, 1024, 512, 256, 1],
        "dcn_num_layers": 3,
        "dcn_low_rank_dim": 512,
    },
)

# The optimizer flags that train where the public example's defaults (fused SGD at
# 15) diverge: the Makefile's TRAIN_FLAGS have them (a test ties the two), and a
# diverging run with those defaults prints them.
STABLE_OPTIMIZER = Overrides(OptimizerConfig, learning_rate=0.05, optimizer="adagrad")
