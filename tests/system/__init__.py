"""Tests of whole deployments: Slurm, several hosts, torchrun and torchx across processes."""
