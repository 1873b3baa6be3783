# This repository and its dependencies, for Kubernetes / AWS Batch runs (README:
# "Launching anywhere"). Not built on the project's machines (no Docker daemon there).
#   docker build -t REGISTRY/dlrm-torchrec:TAG .                      # CUDA torch + fbgemm-gpu
#   docker build --build-arg DEVICE=cpu -t REGISTRY/dlrm-torchrec:cpu .
FROM python:3.11-slim
ARG DEVICE=cuda
WORKDIR /workspace/dlrm
COPY . .
RUN DEVICE=${DEVICE} bash scripts/install.sh /opt/venv
ENV PATH=/opt/venv/bin:${PATH} PYTHONUNBUFFERED=1
