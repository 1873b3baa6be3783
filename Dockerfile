# This repository and its dependencies, for Kubernetes / AWS Batch runs (README:
# "Launching anywhere"). Not built on the project's machines (no Docker daemon there),
# so neither build below has been run.
#   docker build -t REGISTRY/dlrm-torchrec:TAG .                      # CUDA torch + fbgemm-gpu + EFA
#   docker build --build-arg DEVICE=cpu -t REGISTRY/dlrm-torchrec:cpu .
FROM python:3.11-slim
ARG DEVICE=cuda
# EFA, the network of the aws_* presets (p4d, p5, ...): libfabric with its EFA provider
# and the aws-ofi-nccl plugin through which NCCL uses it, from AWS's EFA installer
# (user space only: the kernel module is the host's; no EFA device, and NCCL falls
# back to TCP sockets). CUDA images only.
ARG EFA_INSTALLER_VERSION=latest
RUN if [ "$DEVICE" = cuda ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends ca-certificates curl \
      && curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
         | tar -xz -C /tmp \
      && (cd /tmp/aws-efa-installer && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify) \
      && rm -rf /tmp/aws-efa-installer /var/lib/apt/lists/*; \
    fi
ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib
WORKDIR /workspace/dlrm
COPY . .
RUN DEVICE=${DEVICE} bash scripts/install.sh /opt/venv
ENV PATH=/opt/venv/bin:/opt/amazon/efa/bin:${PATH} PYTHONUNBUFFERED=1
