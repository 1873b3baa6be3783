"""models/ as a package: the modules the flags read load without torch. (That every
module imports first and that no import circle is inside the package are
tests/test_architecture.py's checks, for every package; what models/ must not import
at all is the layering rule's there too.)"""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What the flags import to answer --help before torch loads (tests/training/test_flags.py).
TORCH_FREE = [
    "models",
    "models.config",
    "models.embedding_optimizer_config",
    "models.model_sizes",
    "models.interactions",
    "models.interactions.registry",
    "models.interactions.dot",
    "models.interactions.dcn",
    "models.interactions.projection",
]


@pytest.mark.slow
def test_the_modules_the_flags_read_load_without_torch():
    probe = f"import sys\nimport {', '.join(TORCH_FREE)}\nprint('torch loaded:', 'torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("torch loaded: False")


@pytest.mark.slow
def test_a_module_that_loads_torch_is_seen():
    """Positive control: the same probe over a module that imports torch says so."""
    probe = "import sys\nimport models.arch\nprint('torch loaded:', 'torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("torch loaded: True")
