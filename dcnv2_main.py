"""Trains DCNv2: DLRM's trainer with DCNv2's defaults (`training.recipes.DCNV2`; every
one can be overridden, and ``--recipe`` resizes the model, still DCNv2).

    torchrun --nproc_per_node 2 dcnv2_main.py --in_memory_binary_criteo_path DIR ...
"""

import sys

from training.main import run_training
from training.recipes import DCNV2


def main(argv: list[str] | None = None) -> int:
    """Runs training with DCNv2's defaults; returns the exit code."""
    return run_training(argv, prog="dcnv2_main.py", description="Train DCNv2 with TorchRec.", entry_recipe=DCNV2)


if __name__ == "__main__":
    sys.exit(main())
