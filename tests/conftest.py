import multiprocessing.process
import os
import subprocess

import pytest

from data.synthetic_criteo import SyntheticCriteoSpec, generate_synthetic_criteo
from tests.support.exported_model import train_and_export

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


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> dict:
    """A model trained and exported once for the inference and serving tests
    (tests/support/exported_model.py)."""
    return train_and_export(tmp_path_factory.mktemp("inference"))


@pytest.fixture
def log_path(tmp_path) -> str:
    return os.path.join(str(tmp_path), "log.jsonl")


def pytest_terminal_summary(terminalreporter):
    """The correctness matrix's table of cases, when it ran."""
    from tests.support import matrix
    for title, table in matrix.REPORTS:
        terminalreporter.write_sep("=", title)
        terminalreporter.write_line(table)


def pytest_sessionfinish(session):
    """Under pytest-xdist (`make test` runs two workers), a worker hands the matrix
    tables it made to the controller, which prints them."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        from tests.support import matrix
        workeroutput["matrix_reports"] = [list(report) for report in matrix.REPORTS]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    from tests.support import matrix
    matrix.REPORTS.extend(tuple(report) for report in getattr(node, "workeroutput", {}).get("matrix_reports", []))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """In a test not marked slow, starting a process (a subprocess, a torch elastic
    launch, a process pool) fails, in its fixtures and its body: the fast tier
    (`pytest -m "not slow"`) starts none."""
    def refuse(*args, **kwargs):
        raise RuntimeError(f"{item.nodeid} starts a process: mark it @pytest.mark.slow")

    patch = pytest.MonkeyPatch()
    if item.get_closest_marker("slow") is None:
        patch.setattr(subprocess.Popen, "_execute_child", refuse)
        patch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    yield
    patch.undo()


pytest_runtest_call = pytest_runtest_setup


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    """The ports the test reserved with tests.support.launch.free_port go back once
    its fixtures are torn down."""
    yield
    from tests.support import launch
    launch.release_test_ports()
