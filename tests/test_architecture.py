"""The structure of the code, read from the tree: the packages' layers (no import points
up or sideways), no import circle inside a package, every module importable first in a
fresh interpreter, and every test file in the folder of what it tests."""

import ast
import os
import subprocess
import sys

import pytest

from harness.launch import REPO

# Packages and the packages they must not import, lowest first: the layers of
# docs/extending.md (whose table `test_docs_extending_md_states_the_layers` checks).
# Training and serving both stand on the checkpoint format and never on each other.
FORBIDDEN = {
    "common": ("recipes", "data", "models", "checkpoints", "sharding_plans", "training", "serving", "sweeps"),
    "recipes": ("data", "models", "checkpoints", "sharding_plans", "training", "serving", "sweeps"),
    "data": ("models", "checkpoints", "sharding_plans", "training", "serving", "sweeps"),
    "models": ("checkpoints", "sharding_plans", "training", "serving", "sweeps"),
    "sharding_plans": ("checkpoints", "training", "serving", "sweeps"),
    "checkpoints": ("sharding_plans", "training", "serving", "sweeps"),
    "training": ("serving", "sweeps"),
    "serving": ("training", "sweeps"),
    "bench": ("tests",),
    "harness": ("tests", "bench"),
    "torchx_components": ("torch",),
    "aws_component.py": ("torch",),
}

# The import circles the tree had when this check came (issue 39): each helper that
# breaks one leaves its entry to the lead, who deletes it after merging. The check fails
# on a circle not listed here and on a listed one that is gone, so this list only shrinks.
KNOWN_CIRCLES: dict[str, list[list[str]]] = {}

# The modules that fail when imported first, because of the circles above (issue 39:
# `python -c "import data.parquet_source"`). Emptied like KNOWN_CIRCLES, by the lead.
KNOWN_FIRST_IMPORT_FAILURES: list[str] = []


def _imports(path: str):
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def _upward_imports(root: str, package: str) -> list[tuple[str, str]]:
    """(file, module) of every import in ``package`` (under ``root``), at any depth of
    a file (lazy imports inside functions included), of a package it must not import."""
    top = os.path.join(root, package)
    files = (
        [top]
        if top.endswith(".py")
        else [os.path.join(d, f) for d, _, fs in os.walk(top) for f in fs if f.endswith(".py")]
    )
    assert files
    return [
        (os.path.relpath(path, root), name)
        for path in files
        for name in _imports(path)
        if name.split(".")[0] in FORBIDDEN[package]
    ]


@pytest.mark.parametrize("package", list(FORBIDDEN))
def test_no_package_imports_upward(package):
    assert _upward_imports(REPO, package) == []


def test_an_upward_import_is_found(tmp_path):
    """The check above finds a lazy import of training inside serving, and of serving
    inside the checkpoint format, and lets the downward ones be."""
    (tmp_path / "serving").mkdir()
    (tmp_path / "serving" / "export.py").write_text(
        "from checkpoints.opened import read_meta\n\ndef main():\n    import training.trainer\n"
    )
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "store.py").write_text("from common.errors import BadInput\nfrom serving import cli\n")
    assert _upward_imports(str(tmp_path), "serving") == [(os.path.join("serving", "export.py"), "training.trainer")]
    assert _upward_imports(str(tmp_path), "checkpoints") == [(os.path.join("checkpoints", "store.py"), "serving")]


def test_docs_extending_md_states_the_layers():
    table = "\n".join(
        ["| package | must not import |", "| --- | --- |"]
        + [
            f"| `{package}` | {', '.join(f'`{name}`' for name in forbidden)} |"
            for package, forbidden in FORBIDDEN.items()
        ]
    )
    with open(os.path.join(REPO, "docs", "extending.md")) as f:
        assert table in f.read(), f"docs/extending.md's table of the layers is out of date; it is:\n{table}"


# --- import circles -------------------------------------------------------------------


def project_modules(root: str) -> dict[str, str]:
    """Module name -> file of every module of the project under ``root``: the top-level
    .py files and every package's modules, subpackages included (tests/ aside)."""
    found = {}
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name.endswith(".py") and os.path.isfile(path):
            found[name[:-3]] = path
        elif name != "tests" and os.path.isfile(os.path.join(path, "__init__.py")):
            for folder, subfolders, files in os.walk(path):
                subfolders[:] = sorted(s for s in subfolders if os.path.isfile(os.path.join(folder, s, "__init__.py")))
                for file in sorted(files):
                    if file.endswith(".py"):
                        parts = os.path.relpath(os.path.join(folder, file), root)[:-3].split(os.sep)
                        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = os.path.join(folder, file)
    return found


def _executed_imports(node: ast.AST):
    """The import statements under ``node``, lazy ones inside functions included (a
    circle closed by a lazy import is still a circle, only deferred), and not those under
    ``if TYPE_CHECKING:``, which never run."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for statement in child.orelse:
                yield from _executed_imports(ast.Module(body=[statement], type_ignores=[]))
        else:
            yield from _executed_imports(child)


def import_graph(root: str) -> dict[str, set[str]]:
    """Module -> the project modules it imports. ``from package import name`` is an edge to
    the submodule when ``name`` is one and to the package's __init__ otherwise; an import of
    a.b.c is an edge to a.b.c only (its parents run first but do not depend on it)."""
    modules = project_modules(root)

    def nearest(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for module, path in modules.items():
        edges = set()
        for node in _executed_imports(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.Import):
                edges.update(nearest(alias.name) for alias in node.names)
                continue
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per extra dot
                package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            edges.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else nearest(base) for a in node.names)
        graph[module] = {edge for edge in edges if edge and edge != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm),
    each sorted, in the order of their first module."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph.get(module, ())):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


GRAPH = import_graph(REPO)
PACKAGES = sorted(
    {module.split(".")[0] for module, path in project_modules(REPO).items() if path.endswith("__init__.py")}
)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle_inside_a_package(package):
    inside = {
        module: {m for m in edges if m.split(".")[0] == package}
        for module, edges in GRAPH.items()
        if module.split(".")[0] == package
    }
    found, known = circles(inside), KNOWN_CIRCLES.get(package, [])
    assert [c for c in found if c not in known] == [], f"new import circles in {package}/"
    assert [c for c in known if c not in found] == [], f"gone from {package}/: delete it from KNOWN_CIRCLES"


def test_no_import_circle_across_packages():
    """The layers forbid most of these already; this covers the packages outside them."""
    assert [c for c in circles(GRAPH) if len({m.split(".")[0] for m in c}) > 1] == []


def test_the_graph_has_every_module_and_finds_a_circle(tmp_path):
    """Positive control: the tree's graph holds every package's modules (a walk that found
    nothing would pass the checks above), and a circle closed by a lazy relative import
    through a package's __init__ is found, while one closed under TYPE_CHECKING is not."""
    assert len(PACKAGES) >= 10 and {"data", "models", "training", "serving"} <= set(PACKAGES)
    assert {"training.trainer", "data", "dlrm_main"} <= set(GRAPH) and "data" in GRAPH["training.trainer"] | {
        m.split(".")[0] for m in GRAPH["training.trainer"]
    }
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("from pkg.sub.a import A\n")
    (tmp_path / "pkg" / "sub" / "a.py").write_text("def f():\n    from . import b\nA = 1\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("from pkg.sub import A\n")
    (tmp_path / "pkg" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.d\n")
    (tmp_path / "pkg" / "d.py").write_text("import pkg.c\n")
    assert circles(import_graph(str(tmp_path))) == [["pkg.sub", "pkg.sub.a", "pkg.sub.b"]]


# --- every module imported first -------------------------------------------------------


def third_party_imports() -> list[str]:
    """The top-level names the project imports that are neither its own nor the standard
    library's: what the fresh interpreters may load before forking (they never import us)."""
    ours = {module.split(".")[0] for module in GRAPH}
    names = {name.split(".")[0] for path in project_modules(REPO).values() for name in _imports(path)}
    return sorted(names - ours - set(sys.stdlib_module_names) - {"tests", "__future__"})


def modules_failing_a_first_import(modules: list[str], preload: list[str]) -> dict[str, str]:
    """Module -> error, for each of ``modules`` that fails when it is the first project
    module a fresh interpreter imports (tests/support/import_first.py: one interpreter per
    worker, with the libraries loaded once, forks a clean child per module)."""
    workers = 2
    chunks = [modules[i::workers] for i in range(workers)]
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.import_first", "--preload", ",".join(preload), *chunk],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for chunk in chunks
        if chunk
    ]
    failing = {}
    for run in runs:
        out, err = run.communicate(timeout=600)
        assert run.returncode in (0, 1), err
        failing.update(line.split("\t", 1) for line in out.splitlines() if "\t" in line)
    return failing


@pytest.mark.slow
def test_every_module_imports_first_in_a_fresh_interpreter():
    """`python -c "import data.parquet_source"` must work for every module: a circle
    inside a package breaks the import of whichever of its modules comes first."""
    modules = [m for m in sorted(GRAPH) if not m.endswith(".__main__")]  # run by `python -m`, not imported
    failing = modules_failing_a_first_import(modules, third_party_imports())
    assert {m: e for m, e in failing.items() if m not in KNOWN_FIRST_IMPORT_FAILURES} == {}
    assert [m for m in KNOWN_FIRST_IMPORT_FAILURES if m not in failing] == [], "delete from KNOWN_FIRST_IMPORT_FAILURES"


@pytest.mark.slow
def test_a_first_import_that_fails_is_found(tmp_path, monkeypatch):
    """Positive control: a module of two that import each other's names fails first."""
    (tmp_path / "circle_pkg").mkdir()
    (tmp_path / "circle_pkg" / "__init__.py").write_text("")
    (tmp_path / "circle_pkg" / "a.py").write_text("from circle_pkg.b import B\nA = 1\n")
    (tmp_path / "circle_pkg" / "b.py").write_text("from circle_pkg.a import A\nB = 2\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", REPO)]))
    failing = modules_failing_a_first_import(["circle_pkg", "circle_pkg.a", "circle_pkg.b"], ["numpy"])
    assert sorted(failing) == ["circle_pkg.a", "circle_pkg.b"]
    assert "partially initialized module" in failing["circle_pkg.a"]


# --- where a test goes -----------------------------------------------------------------

# Folders of tests/ that mirror no package: whole deployments, the docs' pages, helpers.
TEST_FOLDERS = ("system", "docs", "support")


def misplaced_tests(root: str) -> list[str]:
    """The test files under ``root``/tests that break docs/tests.md's rule: the tests of
    PACKAGE/MODULE.py are tests/PACKAGE/test_MODULE.py or test_MODULE_ASPECT.py (MODULE: any
    file or folder of the package, or the package's own name for tests of all of it),
    subpackages mirrored folder by folder; tests/system/ and tests/docs/ take any name;
    tests/ itself holds the entry points' tests (test_dlrm_main*.py) and
    test_architecture.py and test_checks.py (the tree's own checks)."""
    tests = os.path.join(root, "tests")
    top_level = {name[:-3] for name in os.listdir(root) if name.endswith(".py")}
    misplaced = []
    for folder, subfolders, files in os.walk(tests):
        subfolders[:] = sorted(s for s in subfolders if s != "__pycache__")
        parts = os.path.relpath(folder, tests).split(os.sep) if folder != tests else []
        if parts[:1] in (["support"], ["system"], ["docs"]):
            continue
        package = os.path.join(root, *parts)
        if parts and not os.path.isfile(os.path.join(package, "__init__.py")):
            misplaced += [os.path.join("tests", *parts, f) for f in sorted(files) if f.startswith("test_")]
            continue
        if parts:  # the package's files and folders by name, and the package itself
            names = {os.path.splitext(e)[0] for e in os.listdir(package) if not e.startswith(("_", "."))} | {parts[-1]}
        else:
            names = top_level | {"architecture", "checks"}
        for file in sorted(f for f in files if f.startswith("test_") and f.endswith(".py")):
            stem = file[len("test_") : -len(".py")]
            if not any(stem == n or stem.startswith(n + "_") for n in names):
                misplaced.append(os.path.join("tests", *parts, file))
    return misplaced


def test_every_test_file_sits_in_the_folder_of_what_it_tests():
    assert misplaced_tests(REPO) == []


def test_a_misplaced_test_file_is_found(tmp_path):
    """Positive control: a test named after no module of its folder's package, one in a
    folder that mirrors no package and a flat one are found; the rule's good places are not."""
    for folder in ("data/sources", "tests/data/sources", "tests/serving", "tests/system", "tests/nowhere"):
        (tmp_path / folder).mkdir(parents=True)
    for package in ("data", "data/sources"):
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "data" / "transcode.py").write_text("")
    (tmp_path / "data" / "sources" / "parquet.py").write_text("")
    (tmp_path / "dlrm_main.py").write_text("")
    good = [
        "tests/data/test_transcode.py",
        "tests/data/test_transcode_byo.py",
        "tests/data/test_sources.py",
        "tests/data/sources/test_parquet.py",
        "tests/data/test_data_flags.py",
        "tests/system/test_anything.py",
        "tests/test_dlrm_main_teardown.py",
        "tests/test_architecture.py",
        "tests/test_checks.py",
    ]
    bad = [
        "tests/data/test_transcoder.py",
        "tests/data/sources/test_transcode.py",
        "tests/serving/test_serve.py",
        "tests/nowhere/test_x.py",
        "tests/test_trainer_flat.py",
    ]
    for name in good + bad:
        (tmp_path / name).write_text("")
    assert sorted(misplaced_tests(str(tmp_path))) == sorted(bad)
