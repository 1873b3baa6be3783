import fcntl
import multiprocessing.process
import os
import shutil
import subprocess
import time

import pytest

from common.library_noise import quiet_benign_library_messages
from data.synthetic_criteo import generate_synthetic_criteo
from harness.small_data import SMALL_SPEC
from serving.export import export_model
from serving.model_files import AOTI_FORMAT
from tests.support.exported_model import exported, tiny_checkpoint, train_and_export


@pytest.fixture(autouse=True)
def quiet_as_the_entry_points_do():
    """The library messages the entry points silence (common/library_noise.py) are
    silenced in in-process tests too, inside pytest's per-test warning filters (so that
    they win over pytest.ini's, which turn every other deprecation into an error)."""
    quiet_benign_library_messages()


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("synthetic_criteo"))
    generate_synthetic_criteo(SMALL_SPEC, path, show_progress=False)
    return path


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> dict:
    """A model trained and exported once per pytest run for the inference and serving
    tests (tests/support/exported_model.py). Under pytest-xdist the workers share it:
    the first to need it builds it in the run's directory under a lock, the other
    waits for it instead of training the same model again. The tests only read it."""
    run_dir = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        run_dir = run_dir.parent  # the run's directory, above each worker's own
    root, built = run_dir / "trained_model", run_dir / "trained_model.built"
    with open(run_dir / "trained_model.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.exists():
            shutil.rmtree(root, ignore_errors=True)  # what a failed attempt left
            root.mkdir()
            train_and_export(root)
            built.touch()
    return exported(root)


@pytest.fixture(scope="session")
def aoti_exported(tmp_path_factory) -> dict:
    """A tiny model exported once per pytest run with --format aoti and every
    precision: three AOTInductor compilations (tests/serving/test_export_aoti.py). The tests
    only read it."""
    root = tmp_path_factory.mktemp("aoti")
    ckpt = tiny_checkpoint(root, "aoti")
    started = time.perf_counter()
    inputs = export_model(ckpt, str(root / "model"), ["fp16", "int8"], fmt=AOTI_FORMAT)
    return {
        "model": str(root / "model"),
        "inputs": inputs,
        "root": root,
        "export_seconds": time.perf_counter() - started,
    }


@pytest.fixture
def log_path(tmp_path) -> str:
    return os.path.join(str(tmp_path), "log.jsonl")


def pytest_collection_modifyitems(items):
    """Files run in the order of how many slow tests they hold, most first, the fast
    tier's files last (each file's tests keep their order). `make test`'s xdist workers
    take whole files in this order (--no-loadscope-reorder; xdist's own order puts the
    files with the most tests first, which are fast, and left a long file to start near
    the end while the other worker idled): the long files start early and the last ones
    are short."""
    slow_tests = {}
    for item in items:
        slow_tests[item.path] = slow_tests.get(item.path, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow_tests[item.path])


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
    """The ports the test reserved with harness.launch.free_port go back once
    its fixtures are torn down."""
    yield
    from harness import launch

    launch.release_test_ports()
