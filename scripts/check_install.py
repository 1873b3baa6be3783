"""The install script's last step: the installed torch, FBGEMM and torchrec load, and
FBGEMM's table-batched embedding (the kernel training uses) looks rows up and applies
its fused SGD update correctly: on the GPU on a host with one, else on the CPU.

    python scripts/check_install.py cpu|cuda [--gpu-visible] [--allow-cuda-torch] [--pip-check]

Without this, a CUDA install whose torch cannot reach the GPU (a CPU wheel, a CUDA
version the driver does not support) would train on the CPU without a word under
``--device auto``. ``--gpu-visible`` (nvidia-smi lists a GPU) turns the CUDA check
on; a CUDA install without a GPU (a container image build) only loads the packages.
A CPU install refuses a CUDA build of torch (gigabytes of NVIDIA libraries it cannot
use) unless ``--allow-cuda-torch`` says no CPU build could be reached (the torch 2.14
stack on the project's machines: PyPI serves only the CUDA build, and the CUDA build
does not import without its NVIDIA libraries).
Exit 1 with one line when a check fails.

``--pip-check`` also runs ``pip check`` and prints its conflicts as warnings, less the
one a CPU install always has: torchrec's wheel declares the CUDA ``fbgemm-gpu`` (the
install script installs torchrec ``--no-deps`` and ``fbgemm-gpu-cpu``, which provides
the same module), so ``torchrec X requires fbgemm-gpu, which is not installed.`` is
expected there. The script's other pip calls pass ``--no-warn-conflicts`` so that pip
does not print it as an ``ERROR`` mid-install.
"""

import os
import re
import subprocess
import sys

# Run as a script (scripts/install.sh): the repository, where common/ is, goes on the path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.cli import OneLineParser

# pip check's line for torchrec's declared CUDA FBGEMM, which a CPU install replaces.
_CPU_FBGEMM_CONFLICT = re.compile(r"torchrec \S+ requires fbgemm-gpu, which is not installed\.")

# The check's table: 10 rows of width 8; two bags, {1} and {3, 3, 7}; SGD at this rate.
_ROWS, _DIM, _LEARNING_RATE = 10, 8, 0.5
_INDICES, _OFFSETS = [1, 3, 3, 7], [0, 1, 4]


def table_batched_lookup_and_update(device) -> None:
    """One FBGEMM table-batched embedding lookup (sum pooling) forward and backward with
    its fused exact SGD on ``device``, checked against the same arithmetic in torch;
    raises RuntimeError (one line) on a wrong result.

    Example::

        table_batched_lookup_and_update(torch.device("cpu"))
    """
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    on_gpu = device.type == "cuda"
    table = SplitTableBatchedEmbeddingBagsCodegen(
        [
            (
                _ROWS,
                _DIM,
                EmbeddingLocation.DEVICE if on_gpu else EmbeddingLocation.HOST,
                ComputeDevice.CUDA if on_gpu else ComputeDevice.CPU,
            )
        ],
        optimizer=EmbOptimType.EXACT_SGD,
        learning_rate=_LEARNING_RATE,
        device=device,
    )
    initial = torch.arange(_ROWS * _DIM, dtype=torch.float32).reshape(_ROWS, _DIM) / (_ROWS * _DIM)
    with torch.no_grad():
        table.split_embedding_weights()[0].copy_(initial)
    pooled = table(torch.tensor(_INDICES, device=device), torch.tensor(_OFFSETS, device=device))
    expected = torch.stack([initial[1], 2 * initial[3] + initial[7]])
    where = f"on {torch.cuda.get_device_name(device) if on_gpu else 'the CPU'}"
    if not torch.allclose(pooled.detach().cpu(), expected, rtol=0, atol=1e-6):
        raise RuntimeError(f"FBGEMM's table-batched embedding lookup gives wrong sums {where}")
    pooled.sum().backward()  # each row's gradient is how often its bags used it
    updated = initial.clone()
    for row, uses in ((1, 1), (3, 2), (7, 1)):
        updated[row] -= _LEARNING_RATE * uses
    if not torch.allclose(table.split_embedding_weights()[0].detach().cpu(), updated, rtol=0, atol=1e-6):
        raise RuntimeError(f"FBGEMM's table-batched embedding backward (fused SGD) gives wrong rows {where}")


def check(device: str, gpu_visible: bool, allow_cuda_torch: bool = False) -> str:
    """What was verified, as one line; raises RuntimeError (one line) when the install
    cannot work as asked.

    Example::

        check("cpu", gpu_visible=False)  # 'torch 2.13.0+cpu | fbgemm_gpu ... | torchrec 1.8.0 (CPU build)'
    """
    import fbgemm_gpu
    import torch
    import torchrec

    versions = f"torch {torch.__version__} | fbgemm_gpu {fbgemm_gpu.__version__} | torchrec {torchrec.__version__}"
    if device == "cpu":
        build = "CPU build"
        if torch.version.cuda is not None:
            if not allow_cuda_torch:
                raise RuntimeError(
                    f"DEVICE=cpu installed a CUDA build of torch ({torch.__version__}): "
                    "it should come from PyTorch's CPU index (TORCH_INDEX), or set ALLOW_CUDA_TORCH=1 "
                    "to run it on the CPU"
                )
            build = f"CUDA {torch.version.cuda} build of torch on the CPU, ALLOW_CUDA_TORCH"
        table_batched_lookup_and_update(torch.device("cpu"))
        return f"{versions} ({build}; FBGEMM lookup and update checked)"
    if torch.version.cuda is None:
        raise RuntimeError(f"DEVICE=cuda installed a CPU build of torch ({torch.__version__})")
    if not gpu_visible:
        return f"{versions} (CUDA {torch.version.cuda} build; no GPU visible here, CUDA not exercised)"
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use this host's GPU "
            "(driver too old for this CUDA version?): --device auto would train on the CPU"
        )
    # FBGEMM's CUDA build loads, matches torch's, and its training kernels run here.
    table_batched_lookup_and_update(torch.device("cuda", 0))
    return (
        f"{versions} (CUDA {torch.version.cuda} on {torch.cuda.device_count()} x {torch.cuda.get_device_name()}; "
        "FBGEMM lookup and update checked)"
    )


def unexpected_conflicts(pip_check_output: str, device: str) -> list[str]:
    """The lines of ``pip check``'s output that say something is wrong: not its all-clear
    line, and on a CPU install not torchrec's declared fbgemm-gpu (see the module).

    Example::

        unexpected_conflicts("torchrec 1.8.0 requires fbgemm-gpu, which is not installed.\n", "cpu")  # []
    """
    lines = [
        line
        for line in pip_check_output.splitlines()
        if line.strip() and line.strip() != "No broken requirements found."
    ]
    if device == "cpu":
        lines = [line for line in lines if not _CPU_FBGEMM_CONFLICT.fullmatch(line.strip())]
    return lines


def main(argv=None) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("device", choices=("cpu", "cuda"))
    parser.add_argument("--gpu-visible", action="store_true", help="nvidia-smi lists a GPU on this host")
    parser.add_argument(
        "--allow-cuda-torch",
        action="store_true",
        help="cpu: accept a CUDA build of torch (no CPU build of the stack's torch reachable)",
    )
    parser.add_argument(
        "--pip-check",
        action="store_true",
        help="also run pip check and print its conflicts but the CPU build's expected one",
    )
    args = parser.parse_args(argv)
    if args.pip_check:
        checked = subprocess.run(
            [sys.executable, "-m", "pip", "--disable-pip-version-check", "check"], capture_output=True, text=True
        )
        for line in unexpected_conflicts(checked.stdout + checked.stderr, args.device):
            print(f"install: warning: pip check: {line}", file=sys.stderr)
    try:
        print(f"install: {check(args.device, args.gpu_visible, args.allow_cuda_torch)}")
    except (RuntimeError, ImportError, OSError) as e:
        print(f"install: check failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
