#!/usr/bin/env bash
# Creates or updates the virtual environment given as $1 (default .venv) with one stack
# of torch, FBGEMM and torchrec. Picks the CUDA or CPU builds of torch/FBGEMM: CUDA when
# `nvidia-smi` finds a GPU, unless DEVICE=cpu or DEVICE=cuda says otherwise.
#
#   scripts/install.sh --wheelhouse DIR --system-torch [VENV]
# installs offline, with no package index, from a wheelhouse (`make wheelhouse`,
# scripts/wheelhouse.py) into an environment that already has the torch it was built
# for: VENV's (a venv made with --system-site-packages over an image's torch), else
# that of $PYTHON (default python3). The wheelhouse says the stack and the build.
#
# Settings (environment):
#   STACK         the stack: a folder of stacks/ holding its pins (requirements-cpu.txt,
#                 requirements-cuda.txt, requirements-torchrec.txt) and its CUDA builds
#                 (cuda-variants). Default: the one stacks/default names.
#   DEVICE        auto (default), cpu or cuda.
#   CUDA_VARIANT  the CUDA build of torch and FBGEMM together, one of the stack's
#                 cuda-variants (default: its first). Each needs an NVIDIA driver branch
#                 (listed beside it): with a GPU visible, an older driver is refused
#                 before anything is installed.
#   TORCH_INDEX   the package index torch and FBGEMM come from. Default: PyTorch's index
#                 for the build, https://download.pytorch.org/whl/cpu or .../$CUDA_VARIANT
#                 (PyPI's torch is a CUDA build, gigabytes on a CPU host; PyPI's
#                 fbgemm-gpu is the cu130 build only). Skipped when pip's own configuration
#                 already finds the pinned torch (a local wheel folder); TORCH_INDEX=
#                 (empty) never uses it.
#   ALLOW_CUDA_TORCH  1: a CPU install accepts a CUDA build of torch (PyPI's; it runs on
#                 the CPU, its NVIDIA libraries unused) where no CPU build can be reached.
#   DRY_RUN       1: print the stack, the build, the pins and the index, install nothing.
set -euo pipefail
wheelhouse=""
system_torch=0
positional=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheelhouse) [ $# -ge 2 ] || { echo "install: --wheelhouse needs a directory" >&2; exit 2; }
                  wheelhouse="$2"; shift 2 ;;
    --wheelhouse=*) wheelhouse="${1#--wheelhouse=}"; shift ;;
    --system-torch) system_torch=1; shift ;;
    -*) echo "install: unknown option '$1' (--wheelhouse DIR, --system-torch)" >&2; exit 2 ;;
    *) positional+=("$1"); shift ;;
  esac
done
if [ -n "$wheelhouse" ] || [ "$system_torch" = 1 ]; then
  if [ -z "$wheelhouse" ] || [ "$system_torch" = 0 ]; then
    echo "install: --wheelhouse and --system-torch go together: the wheelhouse holds everything but torch," \
         "which the environment must already have" >&2
    exit 2
  fi
  exec bash "$(dirname "$0")/install_wheelhouse.sh" "$wheelhouse" "${positional[@]}"
fi
venv="${positional[0]:-.venv}"
device="${DEVICE:-auto}"
stack="${STACK:-$(<stacks/default)}"
if [ ! -f "stacks/$stack/cuda-variants" ]; then
  echo "install: STACK must be one of the folders of stacks/ ($(cd stacks && ls -d -- */ | tr -d / | xargs)), not '$stack'" >&2
  exit 2
fi
stack_dir="stacks/$stack"
# The stack's CUDA builds, "VARIANT MIN_DRIVER" a line; the first is the default.
variants="$(grep -E '^cu[0-9]+ [0-9]+$' "$stack_dir/cuda-variants")"
: "${CUDA_VARIANT:=${variants%% *}}"
min_driver="$(awk -v v="$CUDA_VARIANT" '$1 == v {print $2}' <<<"$variants")"
if [ -z "$min_driver" ]; then
  # "torch 2.13.0 and fbgemm-gpu 1.8.0", from the pins
  releases="$(grep -E '^(torch|fbgemm-gpu)==' "$stack_dir/requirements-cuda.txt" | sed 's/==/ /; s/+.*//' | paste -sd '|')"
  echo "install: CUDA_VARIANT must be $(cut -d' ' -f1 <<<"$variants" | paste -sd '|' | sed 's/|/ or /g')" \
       "(the CUDA builds of ${releases/|/ and }), not '$CUDA_VARIANT'" >&2
  exit 2
fi
# The build for the oldest drivers, offered when this host's driver is too old.
oldest="$(tail -n 1 <<<"$variants")"
older_variant=""
if [ "${oldest%% *}" != "$CUDA_VARIANT" ]; then
  older_variant=" or install with CUDA_VARIANT=${oldest%% *} (R${oldest##* } or newer)"
fi
export CUDA_VARIANT  # requirements-cuda.txt pins torch and fbgemm-gpu with it
gpu_visible=()
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu_visible=(--gpu-visible)
fi
if [ "$device" = auto ]; then
  device=$([ ${#gpu_visible[@]} -gt 0 ] && echo cuda || echo cpu)
fi
case "$device" in
  cpu) other=cuda; default_index=https://download.pytorch.org/whl/cpu ;;
  cuda) other=cpu; default_index=https://download.pytorch.org/whl/$CUDA_VARIANT ;;
  *) echo "install: DEVICE must be auto, cpu or cuda, not '$device'" >&2; exit 2 ;;
esac

# The build a venv holds, from its installed packages' metadata (cpu, cuda or none).
venv_build() {
  local site
  for site in "$1"/lib/python3*/site-packages; do
    if compgen -G "$site/fbgemm_gpu_cpu-*.dist-info" >/dev/null || compgen -G "$site/torch-*+cpu.dist-info" >/dev/null; then
      echo cpu; return
    fi
    if compgen -G "$site/fbgemm_gpu-[0-9]*.dist-info" >/dev/null || compgen -G "$site/torch-[0-9]*.dist-info" >/dev/null; then
      echo cuda; return
    fi
  done
  echo none
}
# fbgemm-gpu and fbgemm-gpu-cpu install the same module: one over the other leaves a
# mix of both builds' files. A venv changes build only by being made anew.
if [ "$(venv_build "$venv")" = "$other" ]; then
  echo "install: $venv holds the $other build of torch/FBGEMM; installing the $device build over it" \
       "would mix the two: remove it first (rm -r $venv) or give another venv directory" >&2
  exit 2
fi

if [ "$device" = cuda ] && [ ${#gpu_visible[@]} -gt 0 ]; then
  driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)"
  if [[ "$driver" =~ ^[0-9]+ ]] && [ "${BASH_REMATCH[0]}" -lt "$min_driver" ]; then
    echo "install: PyTorch's +$CUDA_VARIANT builds need an NVIDIA driver R$min_driver or newer; this host's is" \
         "$driver: upgrade the driver$older_variant" >&2
    exit 2
  fi
fi
# The build's pins, with CUDA_VARIANT in place (pip expands it in the file the same way).
pins=$(grep -E '^[a-z]' "$stack_dir/requirements-$device.txt" | sed "s/\${CUDA_VARIANT}/$CUDA_VARIANT/g")
torch_pin="$(grep -E '^torch==' <<<"$pins")"
if [ "${DRY_RUN:-0}" = 1 ]; then
  echo "install: dry run: $stack stack, $device build${gpu_visible:+ (GPU visible)}:" $pins "from ${TORCH_INDEX-$default_index}"
  exit 0
fi

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
index=("--extra-index-url" "${TORCH_INDEX-$default_index}")
if [ -z "${TORCH_INDEX-$default_index}" ] \
   || "${pip[@]}" install --dry-run --no-index --no-deps --ignore-installed "$torch_pin" >/dev/null 2>&1; then
  index=()  # pip's configuration serves torch (this project's machines: a local CPU wheel)
fi
echo "install: $stack stack, $device build into $venv${index:+ (torch from ${index[1]})}"
"${pip[@]}" install "${index[@]}" -r "$stack_dir/requirements-$device.txt"
"${pip[@]}" install --no-deps -r "$stack_dir/requirements-torchrec.txt"
# --no-warn-conflicts: pip would print torchrec's declared fbgemm-gpu as an ERROR once this
# call installs one of torchrec's dependencies; check_install.py --pip-check reports the
# conflicts instead, less that expected one (fbgemm-gpu-cpu provides the module on CPU).
"${pip[@]}" install --no-warn-conflicts -r requirements.txt -r requirements-dev.txt
# The torchx components, editable: registers `torchx run dlrm|dcnv2|preprocess_criteo`.
"${pip[@]}" install --no-deps -e .
# The Parquet loader's column kernels, when a C compiler is here (else numpy converts).
bash "$(dirname "$0")/build_native_data.sh"
allow_cuda_torch=()
if [ "${ALLOW_CUDA_TORCH:-0}" = 1 ]; then
  allow_cuda_torch=(--allow-cuda-torch)
fi
"$venv/bin/python" scripts/check_install.py "$device" "${gpu_visible[@]}" "${allow_cuda_torch[@]}" --pip-check
