# This repository and its dependencies, for Kubernetes / AWS Batch runs (README:
# "Launching anywhere"). Not built on the project's machines (no Docker daemon there),
# so neither build below has been run.
#   docker build -t REGISTRY/dlrm-torchrec:TAG .                      # CUDA torch + fbgemm-gpu + EFA
#   docker build --build-arg DEVICE=cpu -t REGISTRY/dlrm-torchrec:cpu .
#   docker build --build-arg STACK=torch2.14 ...                     # another stack of stacks/
FROM python:3.11-slim
ARG DEVICE=cuda
# Empty: the stack stacks/default names.
ARG STACK=
# EFA, the network of the aws_* presets (p4d, p5, ...): libfabric with its EFA provider
# and the aws-ofi-nccl plugin through which NCCL uses it, from AWS's EFA installer
# (user space only: the kernel module is the host's; no EFA device, and NCCL falls
# back to TCP sockets). CUDA images only.
# NCCL finds the plugin through LD_LIBRARY_PATH below. Installer 1.29.0 or newer is
# required: its aws-ofi-nccl (1.7+) and libfabric (1.18+) pick the EFA provider and
# GPUDirect RDMA by themselves, so FI_PROVIDER=efa, FI_EFA_USE_DEVICE_RDMA=1 and
# NCCL_PROTO=simple are not set (aws-ofi-nccl's doc/efa-env-var.md: needed only up to
# aws-ofi-nccl 1.6; NCCL_PROTO=simple would only slow the newer plugin), and older
# installers' libfabric fails with the NCCL 2.19+ that torch 2.13 brings. Runs whose
# data-loader workers fail to fork (OSError: Cannot allocate memory) set
# FI_EFA_USE_HUGE_PAGE=0 (the same page).
ARG EFA_INSTALLER_VERSION=latest
RUN if [ "$DEVICE" = cuda ]; then \
      if [ "$EFA_INSTALLER_VERSION" != latest ] \
         && [ "$(printf '%s\n' 1.29.0 "$EFA_INSTALLER_VERSION" | sort -V | head -n 1)" != 1.29.0 ]; then \
        echo "EFA_INSTALLER_VERSION must be latest or 1.29.0 or newer, not $EFA_INSTALLER_VERSION" >&2; exit 2; \
      fi \
      && apt-get update \
      && apt-get install -y --no-install-recommends ca-certificates curl \
      && curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
         | tar -xz -C /tmp \
      && (cd /tmp/aws-efa-installer && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify) \
      && rm -rf /tmp/aws-efa-installer /var/lib/apt/lists/*; \
    fi
# --compile: torch.compile's Inductor builds its CPU kernels, and Triton its CUDA
# launchers, with the system's C/C++ compiler (the slim image has none).
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*
ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib
WORKDIR /workspace/dlrm
COPY . .
RUN DEVICE=${DEVICE} STACK=${STACK} bash scripts/install.sh /opt/venv
ENV PATH=/opt/venv/bin:/opt/amazon/efa/bin:${PATH} PYTHONUNBUFFERED=1
