"""What the tests and the benchmarks both run: training launched on local ranks and its
log read back (`launch`), the correctness matrix (`matrix`, ``python -m harness.matrix``)
and the small synthetic data set they train on (`small_data`). Imports neither tests/
nor bench/."""
