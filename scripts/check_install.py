"""The install script's last step: the installed torch, FBGEMM and torchrec load, and on
a host with a GPU the CUDA build really runs on it.

    python scripts/check_install.py cpu|cuda [--gpu-visible]

Without this, a CUDA install whose torch cannot reach the GPU (a CPU wheel, a CUDA
version the driver does not support) would train on the CPU without a word under
``--device auto``. ``--gpu-visible`` (nvidia-smi lists a GPU) turns the CUDA check
on; a CUDA install without a GPU (a container image build) only loads the packages.
Exit 1 with one line when a check fails.
"""

import argparse
import sys


def check(device: str, gpu_visible: bool) -> str:
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
        if torch.version.cuda is not None:
            raise RuntimeError(f"DEVICE=cpu installed a CUDA build of torch ({torch.__version__}): "
                               "it should come from PyTorch's CPU index (TORCH_INDEX)")
        return f"{versions} (CPU build)"
    if torch.version.cuda is None:
        raise RuntimeError(f"DEVICE=cuda installed a CPU build of torch ({torch.__version__})")
    if not gpu_visible:
        return f"{versions} (CUDA {torch.version.cuda} build; no GPU visible here, CUDA not exercised)"
    if not torch.cuda.is_available():
        raise RuntimeError(f"torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use this host's GPU "
                           "(driver too old for this CUDA version?): --device auto would train on the CPU")
    # One FBGEMM kernel on the GPU: its CUDA build loads and matches torch's.
    cumsum = torch.ops.fbgemm.asynchronous_complete_cumsum(torch.tensor([1, 2, 3], device="cuda"))
    if cumsum.cpu().tolist() != [0, 1, 3, 6]:
        raise RuntimeError(f"FBGEMM's CUDA kernels give wrong results on {torch.cuda.get_device_name()}")
    return f"{versions} (CUDA {torch.version.cuda} on {torch.cuda.device_count()} x {torch.cuda.get_device_name()})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("device", choices=("cpu", "cuda"))
    parser.add_argument("--gpu-visible", action="store_true", help="nvidia-smi lists a GPU on this host")
    args = parser.parse_args(argv)
    try:
        print(f"install: {check(args.device, args.gpu_visible)}")
    except (RuntimeError, ImportError, OSError) as e:
        print(f"install: check failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
