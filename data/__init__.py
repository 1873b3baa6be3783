"""Data: dataset formats, generators and the per-rank batch loaders."""
