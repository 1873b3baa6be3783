"""Helpers only the tests use: the torchx CLI, the session's exported model, the cluster
fixtures' helpers and the docs' command lines. What the benchmarks share with the tests
(launching training, the correctness matrix, the small data set) is the `harness` package."""
