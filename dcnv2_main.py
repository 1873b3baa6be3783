"""Trains DCNv2: DLRM's trainer with DCNv2 defaults (every one can be overridden).

    torchrun --nproc_per_node 2 dcnv2_main.py --in_memory_binary_criteo_path DIR ...
"""

import sys
from typing import Any, Dict, List, Optional

from training.main import run_training

# The DCNv2 recipe: low-rank cross net over 128-wide embeddings.
DCNV2_DEFAULTS: Dict[str, Any] = {
    "interaction_type": "dcn",
    "embedding_dim": 128,
    "dense_arch_layer_sizes": [512, 256, 128],
    "over_arch_layer_sizes": [1024, 1024, 512, 256, 1],
    "dcn_num_layers": 3,
    "dcn_low_rank_dim": 512,
}


def main(argv: Optional[List[str]] = None) -> int:
    """Runs training with DCNv2's defaults; returns the exit code."""
    return run_training(
        argv, prog="dcnv2_main.py", description="Train DCNv2 with TorchRec.", defaults=DCNV2_DEFAULTS
    )


if __name__ == "__main__":
    sys.exit(main())
