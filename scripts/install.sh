#!/usr/bin/env bash
# Creates or updates the virtual environment given as $1 (default .venv).
# Picks the CUDA or CPU builds of torch/FBGEMM: CUDA when `nvidia-smi` finds a GPU,
# unless DEVICE=cpu or DEVICE=cuda says otherwise.
set -euo pipefail
venv="${1:-.venv}"
device="${DEVICE:-auto}"
if [ "$device" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    device=cuda
  else
    device=cpu
  fi
fi
case "$device" in
  cpu|cuda) ;;
  *) echo "install: DEVICE must be auto, cpu or cuda, not '$device'" >&2; exit 2 ;;
esac
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
echo "install: $device build into $venv"
"${pip[@]}" install -r "requirements-$device.txt"
"${pip[@]}" install --no-deps -r requirements-torchrec.txt
"${pip[@]}" install -r requirements.txt -r requirements-dev.txt
# The torchx components, editable: registers `torchx run dlrm|dcnv2|preprocess_criteo`.
"${pip[@]}" install --no-deps -e .
"$venv/bin/python" -c "import torch, torchrec, fbgemm_gpu; print('install: torch', torch.__version__, '| torchrec', torchrec.__version__)"
if [ "$device" = cpu ]; then
  echo "install: (pip's complaint that torchrec requires fbgemm-gpu is expected: its CPU build, fbgemm-gpu-cpu, is installed)"
fi
