"""Helpers the tests and benchmarks share: launching the entry points, running the
torchx CLI, and the correctness matrix (`python -m tests.support.matrix`)."""
