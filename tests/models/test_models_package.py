"""models/ as a package: every module loads first in a fresh interpreter, its modules
import each other without a circle (lazy and type-checking imports counted), and the
modules the flags read load without torch. (What models/ must not import at all is
the layering rule's: tests/common/test_config_flags.py, FORBIDDEN.)"""

import ast
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(REPO, "models")

# What the flags import to answer --help before torch loads (tests/training/test_flags.py).
TORCH_FREE = {
    "models",
    "models.config",
    "models.embedding_optimizer_config",
    "models.model_sizes",
    "models.interactions",
    "models.interactions.registry",
    "models.interactions.dot",
    "models.interactions.dcn",
    "models.interactions.projection",
}


def module_files(root: str, package: str = "models") -> dict[str, str]:
    """Dotted name -> file of every module of ``package`` under ``root``."""
    found = {}
    for folder, _, files in os.walk(os.path.join(root, package)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def internal_imports(path: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that the file imports, anywhere in it (inside functions
    and ``if TYPE_CHECKING:`` too): ``from a.b import c`` counts a.b.c when it is a module."""
    imported = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module)
            imported.update(f"{node.module}.{alias.name}" for alias in node.names)
    return imported & modules


def import_circles(root: str, package: str = "models") -> list[list[str]]:
    """Every circle of imports among the package's modules, each from its first module
    back to it (a package's own import of its parent, Python's doing, is not counted)."""
    files = module_files(root, package)
    graph = {name: sorted(internal_imports(path, set(files)) - {name}) for name, path in files.items()}
    circles, state = [], {}

    def visit(name: str, stack: list[str]) -> None:
        state[name] = "open"
        for target in graph[name]:
            if state.get(target) == "open":
                circles.append(stack[stack.index(target) :] + [name, target] if target in stack else [name, target])
            elif target not in state:
                visit(target, stack + [name])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    return circles


def test_models_has_no_import_circle():
    assert import_circles(REPO) == []


def test_an_import_circle_is_found(tmp_path):
    """The check above finds a circle through a lazy and a type-checking import."""
    (tmp_path / "models" / "interactions").mkdir(parents=True)
    (tmp_path / "models" / "__init__.py").write_text("")
    (tmp_path / "models" / "config.py").write_text("from models.interactions import INTERACTIONS\n")
    (tmp_path / "models" / "interactions" / "__init__.py").write_text("from models.interactions import dot\n")
    (tmp_path / "models" / "interactions" / "dot.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from models.config import ModelConfig\n"
    )
    (tmp_path / "models" / "builder.py").write_text("def build():\n    from models import config\n")
    assert import_circles(str(tmp_path)) == [
        ["models.config", "models.interactions", "models.interactions.dot", "models.config"]
    ]


def test_every_torch_free_module_is_found():
    assert set(module_files(REPO)) >= TORCH_FREE


@pytest.mark.slow
@pytest.mark.parametrize("module", sorted(module_files(REPO)))
def test_every_module_imports_first_in_a_fresh_interpreter(module):
    probe = f"import sys, {module}\nprint('torch loaded:', 'torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    if module in TORCH_FREE:
        assert proc.stdout.strip().endswith("torch loaded: False")
