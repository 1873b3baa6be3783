"""The small synthetic Criteo data set the tests, the correctness matrix and the GPU
check train on."""

from data.synthetic_criteo import SyntheticCriteoSpec

# Small enough to train in seconds, large enough to learn from.
SMALL_SPEC = SyntheticCriteoSpec(
    num_days=3,
    rows_per_day=24_576,
    cardinalities=[min(c, 2000) for c in SyntheticCriteoSpec().cardinalities],
    seed=7,
)
