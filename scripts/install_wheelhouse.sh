#!/usr/bin/env bash
# scripts/install.sh --wheelhouse DIR --system-torch [VENV]: installs a wheelhouse
# (scripts/wheelhouse.py) with no package index into an environment that already has
# the torch it was built for, then checks the install (scripts/check_install.py).
#   $1  the wheelhouse directory (wheelhouse.json and wheels.tar.xz)
#   $2  optional: a venv (made with --system-site-packages over the host's torch);
#       without it, the environment of $PYTHON (default python3)
# Settings: DEVICE=cpu checks a CUDA wheelhouse on the CPU; ALLOW_CUDA_TORCH=1 as in
# install.sh (a CPU wheelhouse over a CUDA build of torch).
set -euo pipefail
cd "$(dirname "$0")/.."
wheelhouse="$1"
if [ $# -ge 2 ]; then
  python="$2/bin/python"
  [ -x "$python" ] || { echo "install: $2 is not a venv (no bin/python): make it first, with --system-site-packages over the host's torch" >&2; exit 2; }
else
  python="${PYTHON:-python3}"
fi
show() { "$python" scripts/wheelhouse.py show "$wheelhouse" "$1"; }
built_for="$(show torch)"  # a bad manifest stops here, one line
stack="$(show stack)"
have="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$have" != "$(show python)" ]; then
  echo "install: $wheelhouse holds wheels for Python $(show python); $python is Python $have:" \
       "build one with PYTHON_VERSION=$have" >&2
  exit 2
fi
if ! torch_version="$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null)"; then
  echo "install: --system-torch: $python cannot import torch; the wheelhouse carries everything but torch" \
       "($built_for)" >&2
  exit 2
fi
if [ "$torch_version" != "$built_for" ]; then
  echo "install: $wheelhouse was built for torch $built_for ($stack stack); $python has torch $torch_version:" \
       "build a wheelhouse for it (make wheelhouse STACK=...)" >&2
  exit 2
fi
device="$(show device)"
[ "${DEVICE:-auto}" = cpu ] && device=cpu
gpu_visible=()
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu_visible=(--gpu-visible)
fi
unpacked="$(mktemp -d)"
trap 'rm -rf "$unpacked"' EXIT
start=$SECONDS
"$python" scripts/wheelhouse.py unpack "$wheelhouse" "$unpacked"
requirements="$unpacked/requirements.txt"
show requirements >"$requirements"
pip=("$python" -m pip --disable-pip-version-check -q)
offline=(--no-index --find-links "$unpacked")
echo "install: $stack stack from $wheelhouse over torch $torch_version ($python), no index"
# As install.sh does: FBGEMM and torchrec without their declared dependencies (torchrec
# declares the CUDA fbgemm-gpu, which a CPU wheelhouse replaces with fbgemm-gpu-cpu).
"${pip[@]}" install "${offline[@]}" --no-deps "$(show fbgemm)" "$(show torchrec)"
"${pip[@]}" install "${offline[@]}" -r "$requirements"
# The project itself, editable, built with the setuptools just installed (no index to
# fetch an isolated build environment from).
"${pip[@]}" install --no-index --no-build-isolation --no-deps -e .
# The Parquet loader's column kernels, when a C compiler is here (else numpy converts).
bash "$(dirname "$0")/build_native_data.sh"
allow_cuda_torch=()
if [ "${ALLOW_CUDA_TORCH:-0}" = 1 ]; then
  allow_cuda_torch=(--allow-cuda-torch)
fi
"$python" scripts/check_install.py "$device" "${gpu_visible[@]}" "${allow_cuda_torch[@]}"
echo "install: from the wheelhouse in $((SECONDS - start)) s"
