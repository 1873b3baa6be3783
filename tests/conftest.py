import os

import pytest

from data.synthetic_criteo import SyntheticCriteoSpec, generate_synthetic_criteo

# Small enough to train in seconds, large enough to learn from.
SMALL_SPEC = SyntheticCriteoSpec(
    num_days=3,
    rows_per_day=24_576,
    cardinalities=[min(c, 2000) for c in SyntheticCriteoSpec().cardinalities],
    seed=7,
)


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("synthetic_criteo"))
    generate_synthetic_criteo(SMALL_SPEC, path, show_progress=False)
    return path


@pytest.fixture
def log_path(tmp_path) -> str:
    return os.path.join(str(tmp_path), "log.jsonl")


def pytest_terminal_summary(terminalreporter):
    """The correctness matrix's table of cases, when it ran."""
    from tests.support import matrix
    for title, table in matrix.REPORTS:
        terminalreporter.write_sep("=", title)
        terminalreporter.write_line(table)
