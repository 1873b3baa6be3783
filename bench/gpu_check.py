"""Verifies a GPU host in one command: the correctness matrix on the CUDA-only choices.

    python -m bench.gpu_check [--strength 2] [--only TEXT] [--list]

On a CUDA host it generates cases covering every pair (or, with ``--strength 3``,
every triple) of: pipeline (sparse_dist, base, semi_sync, prefetch), compute kernel
(fused, fused_uvm, fused_uvm_caching), sharding type, fused optimizer, bf16 autocast,
TF32, and world size (1, and 2 when the host has two GPUs), over NCCL. Each case runs
the checks of `tests/support/matrix.py` against the sparse_dist / fused run of the same
choices: (a) equal to it, (b) resume bit-exact, (c) the exported fp32 program equal to
the trained model; combinations the application refuses (semi_sync with cached
tables) must be refused with one line. It prints one table with pass/fail and
records/s per case, and exits 1 when a case fails.

On a host without CUDA it says so and exits 0: there is nothing to check.

semi_sync runs its synchronous phase here (its start batch, 900 by default, lies
beyond the few steps of a case): from its start batch it trains a different,
one-step-stale algorithm that no reference run reproduces.
"""

import sys
from typing import Optional, Sequence

import torch

from sharding_plans.constraints import CUDA_ONLY_KERNELS
from tests.support import matrix
from training.config import OPTIMIZERS, PIPELINES


def gpu_matrix(num_gpus: int) -> matrix.MatrixSpec:
    """The GPU kinds, compared with the sparse_dist pipeline on the fused kernel."""
    return matrix.MatrixSpec(
        dimensions={
            "pipeline": PIPELINES,
            "compute_kernel": ("fused",) + CUDA_ONLY_KERNELS,
            "sharding": ("table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise"),
            "optimizer": OPTIMIZERS,
            "amp": (False, True),
            "allow_tf32": (False, True),
            "world_size": (1, 2) if num_gpus >= 2 else (1,),
        },
        reference={"pipeline": "sparse_dist", "compute_kernel": "fused"},
        refusals=(matrix.Refusal((("pipeline", "semi_sync"), ("compute_kernel", "fused_uvm_caching")),
                                 "--pipeline semi_sync"),),
        device="cuda",
        defaults={"dense_optimizer": "sgd", "precision": "fp32", "interaction": "original", "multi_hot": False},
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = matrix.matrix_parser("python -m bench.gpu_check", __doc__.split("\n\n")[0], strength=2).parse_args(argv)
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device on this host (torch {torch.__version__}): nothing to check")
        return 0
    spec = gpu_matrix(torch.cuda.device_count())
    print(f"gpu_check: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    return matrix.run(spec, args.strength, args.only, args.list)


if __name__ == "__main__":
    sys.exit(main())
