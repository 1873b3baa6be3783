"""What the tests and the benchmarks both run: training launched on local ranks and its
log read back (`launch`), the correctness matrix (`matrix`, ``python -m harness.matrix``),
the small synthetic data set they train on (`small_data`) and what the id-mode
benchmarks share (`id_benches`: their small model and the raw-id keys of a table).
Imports neither tests/ nor bench/."""
