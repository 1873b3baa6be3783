"""Trains DLRM (or, with --interaction_type dcn|projection, its variants) with TorchRec.

    torchrun --nproc_per_node 2 dlrm_main.py --in_memory_binary_criteo_path DIR ...
    python dlrm_main.py ...            # one process

Flags follow the public TorchRec DLRM example; `python dlrm_main.py --help` lists them.
"""

import sys

from training.main import run_training


def main(argv: list[str] | None = None) -> int:
    """Runs training with DLRM's defaults; returns the exit code."""
    return run_training(argv, prog="dlrm_main.py", description="Train DLRM with TorchRec.")


if __name__ == "__main__":
    sys.exit(main())
