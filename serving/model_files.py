"""An exported model directory's files: their manifest, and loading them without running code.

``python -m serving.export`` writes ``manifest.json`` last (each file's size and
SHA-256); loaders check every file they read against it, so a damaged file is refused
by name. A manifest does not stop someone who writes the whole directory, so the model
files are also inspected before torch loads them, as torch's loaders would run code
from a crafted file:

- ``fp32.pt2`` (torch.export): ``torch.export.load`` unpickles payloads marked as
  pickled with ``weights_only=False``, retries sample inputs the same way, loads
  compiled AOTInductor libraries, evaluates symbolic shapes with sympy (``eval``) and
  executes the guards' code, and a graph node may name any attribute of ``torch``. The
  archive is refused unless it holds only raw tensors, sample inputs that load with
  ``weights_only=True``, shape expressions and guards of a plain arithmetic grammar,
  and graph nodes calling ATen/FBGEMM operators or Python's arithmetic operators.
- ``fp16.pt``/``int8.pt`` (TorchScript): no Python runs, but the scripted code may call
  operators that read or write files (``aten::from_file``). The archive is refused
  unless its pickles name only TorchScript classes, tensors and storages, and its code
  calls no such operator and uses only FBGEMM's inference helper classes.

Example::

    manifest = read_manifest("model_dir")
    module = load_model_file("model_dir", "fp32.pt2", "torch.export", manifest)
"""

import io
import json
import os
import pickletools
import re
import sys
import zipfile
from typing import Any, Dict, Iterator, Optional

import torch

from common.errors import BadInput
from common.manifest import ManifestEntry, check_bytes, check_manifest_format, entry_of_bytes

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
FORMATS = ("torch.export", "torchscript")


class UnsafeModelError(BadInput):
    """A model file torch would load by running code it holds; the message names the file."""


def write_manifest(directory: str) -> Dict[str, ManifestEntry]:
    """Hashes every file of ``directory`` into its manifest.json (written last)."""
    files = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            files[name] = entry_of_bytes(f.read())
    with open(os.path.join(directory, MANIFEST_FILE), "w") as f:
        json.dump({"manifest_version": MANIFEST_VERSION, "files": files}, f, indent=1)
    return files


def read_manifest(model_dir: str) -> Optional[Dict[str, ManifestEntry]]:
    """The directory's manifest; None (with a warning) for an export made before manifests."""
    path = os.path.join(model_dir, MANIFEST_FILE)
    if not os.path.exists(path):
        if os.path.isdir(model_dir):
            print(f"warning: {model_dir} has no {MANIFEST_FILE} (exported before integrity checks): "
                  "its files are loaded unverified", file=sys.stderr, flush=True)
        return None
    try:
        with open(path, "rb") as f:
            return check_manifest_format(json.loads(f.read()), path)
    except (OSError, ValueError, BadInput) as e:  # unreadable, not JSON (a ValueError), or a ManifestError
        raise BadInput(f"{path}: not a model manifest ({e})") from e


def read_file(model_dir: str, name: str, manifest: Optional[Dict[str, ManifestEntry]]) -> bytes:
    """One file of the directory, checked against the manifest (BadInput naming it)."""
    path = os.path.join(model_dir, name)
    if os.path.basename(name) != name:
        raise BadInput(f"{model_dir}: file name {name!r} is not a plain name in the directory")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BadInput(f"{path}: missing or unreadable ({e.strerror or e})") from e
    if manifest is not None:
        check_bytes(data, path, manifest.get(name))  # ManifestError: bad input
    return data


def load_model_file(model_dir: str, name: str, fmt: str, manifest: Optional[Dict[str, ManifestEntry]]) -> Any:
    """The callable model in ``name`` (a torch.export program or TorchScript), after the
    manifest and the safety checks (module docstring). BadInput naming the file otherwise."""
    data = read_file(model_dir, name, manifest)
    path = os.path.join(model_dir, name)
    if fmt not in FORMATS:
        raise BadInput(f"{path}: unknown model format {fmt!r} (expected one of {', '.join(FORMATS)})")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as e:
        raise BadInput(f"{path}: not a model archive (truncated or damaged?)") from e
    with archive:
        check = check_exported_program if fmt == "torch.export" else check_torchscript
        check(archive, path)
    try:
        if fmt == "torch.export":
            return torch.export.load(io.BytesIO(data)).module()
        return torch.jit.load(io.BytesIO(data))
    except Exception as e:  # torch raises many types for a file it cannot read
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise BadInput(f"{path}: cannot be loaded ({type(e).__name__}: {first[:200]})") from e


# ---------------------------------------------------------------- torch.export archives

# Archive members (below the archive's root folder) torch.export.save writes for us.
_PT2_MEMBER = re.compile(r"(archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"
                         r"|models/\w+\.json|data/sample_inputs/\w+\.pt|data/weights/\w+(\.json)?"
                         r"|data/constants/\w+(\.json)?)")
# Graph node targets: ATen and FBGEMM operators, Python's arithmetic and comparisons.
_OPERATOR_TARGET = re.compile(r"torch\.ops\.(aten|fbgemm)\.\w+\.\w+|_operator\.(add|sub|mul|floordiv|truediv|mod"
                              r"|neg|pow|eq|ne|le|lt|ge|gt|getitem|and_|or_|not_)")
# Operators that touch files: never in a model we export.
_FILE_OPERATORS = re.compile(r"\b(from_file|debugprims|load_tensor)\b")
# Symbolic shapes, as sympy constructor calls: sympy evaluates them with eval().
_SYMPY_TOKEN = re.compile(r"\s*(?:(?P<word>[A-Za-z_]\w*)|'[a-z]\w*'|-?\d+|[(),=])")
_SYMPY_WORDS = frozenset({"Add", "Mul", "Pow", "Integer", "Rational", "Symbol", "Max", "Min", "Mod", "FloorDiv",
                          "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt", "TruncToInt", "IntTrueDiv",
                          "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "Equality", "Unequality", "GreaterThan",
                          "LessThan", "StrictGreaterThan", "StrictLessThan", "And", "Or", "Not", "True", "False",
                          "positive", "integer", "nonnegative", "real", "finite"})
# Guards (executed as Python): sizes and strides of the inputs, compared and combined.
_GUARD_TOKEN = re.compile(r"\s*(?:L\['\w+'\]|\.size\(\)|\.stride\(\)|\[\d+\]|-?\d+|==|!=|<=|>=|//|[-+*%<>()]"
                          r"|\b(and|or|not)\b)")


def _tokens_match(text: str, token: "re.Pattern[str]", words: Optional[frozenset] = None) -> bool:
    position = 0
    while position < len(text.rstrip()):
        match = token.match(text, position)
        if match is None or match.end() == position:
            return False
        if words is not None and match.groupdict().get("word") and match.group("word") not in words:
            return False
        position = match.end()
    return True


def _strings(tree: Any, key: Optional[str] = None) -> Iterator[tuple]:
    """(key, string) of every string of a JSON tree, under the nearest dict key."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _strings(v, k)
    elif isinstance(tree, list):
        for v in tree:
            yield from _strings(v, key)
    elif isinstance(tree, str):
        yield key, tree


def _check_program_json(program: Any, member: str, path: str) -> None:
    for key, text in _strings(program):
        bad = None
        if key == "target" and (not _OPERATOR_TARGET.fullmatch(text) or _FILE_OPERATORS.search(text)):
            bad = f"a graph node calls {text}"
        elif key == "expr_str" and not _tokens_match(text, _SYMPY_TOKEN, _SYMPY_WORDS):
            bad = f"a shape expression is not plain arithmetic: {text[:80]!r}"
        elif key == "guards_code" and not _tokens_match(text, _GUARD_TOKEN):
            bad = f"a guard is not a size comparison: {text[:80]!r}"
        elif key in ("name", "as_name") and not text.isidentifier():
            bad = f"a graph value is named {text[:80]!r}"
        if bad:
            raise UnsafeModelError(f"{path}: refused: {bad} ({member}); only code-free exports are loaded")


def check_exported_program(archive: zipfile.ZipFile, path: str) -> None:
    """Raises UnsafeModelError unless loading this torch.export archive can run no code."""
    names = archive.namelist()
    root = names[0].split("/", 1)[0] if names else ""
    for name in names:
        member = name[len(root) + 1:] if name.startswith(root + "/") else name
        if not _PT2_MEMBER.fullmatch(member):
            raise UnsafeModelError(f"{path}: refused: unexpected archive member {name!r} "
                                   "(compiled code, pickles or a legacy format)")
        if member.endswith(".json"):
            try:
                content = json.loads(archive.read(name))
            except ValueError as e:
                raise UnsafeModelError(f"{path}: {name} is not JSON (damaged?)") from e
            if member.startswith("models/"):
                _check_program_json(content, name, path)
            else:  # weights and constants: raw tensors only, never pickles or script objects
                for fqn, payload in (content.get("config") or {}).items():
                    if payload.get("use_pickle") or not re.fullmatch(r"(weight|tensor)_\d+",
                                                                     str(payload.get("path_name"))):
                        raise UnsafeModelError(f"{path}: refused: {fqn} is stored as a pickled object ({name})")
        elif member.startswith("data/sample_inputs/"):
            try:
                torch.load(io.BytesIO(archive.read(name)), weights_only=True)
            except Exception as e:  # torch would retry with weights_only=False
                raise UnsafeModelError(f"{path}: refused: {name} is not plain tensors ({type(e).__name__})") from e


# ---------------------------------------------------------------- TorchScript archives

_SCRIPT_GLOBAL = re.compile(r"__torch__\.(?!torch\.classes\.)[\w.]+ \w+|__torch__\.torch\.classes\.fbgemm "
                            r"(AtomicCounter|TensorQueue)|collections OrderedDict|torch \w+Storage|torch device"
                            r"|torch\._utils _rebuild_\w+|torch\.jit\._pickle \w+")
_SCRIPT_CLASSES = re.compile(r"torch\.classes\.([\w.]+)")


def check_torchscript(archive: zipfile.ZipFile, path: str) -> None:
    """Raises UnsafeModelError unless this TorchScript archive names only TorchScript
    classes, tensors and FBGEMM's inference helpers, and calls no file operator."""
    for name in archive.namelist():
        if name.endswith(".pkl"):
            try:
                opcodes = list(pickletools.genops(archive.read(name)))
            except Exception as e:
                raise UnsafeModelError(f"{path}: {name} is not a readable pickle (damaged?)") from e
            for opcode, argument, _ in opcodes:
                if opcode.name == "STACK_GLOBAL" or (opcode.name == "GLOBAL" and
                                                    not _SCRIPT_GLOBAL.fullmatch(str(argument))):
                    what = argument if opcode.name == "GLOBAL" else "a computed name"
                    raise UnsafeModelError(f"{path}: refused: {name} loads {what}")
        elif name.endswith(".py"):
            code = archive.read(name).decode("utf-8", errors="replace")
            found = _FILE_OPERATORS.search(code)
            classes = set(_SCRIPT_CLASSES.findall(code)) - {"fbgemm.AtomicCounter", "fbgemm.TensorQueue"}
            if found or classes:
                what = found.group(0) if found else f"torch.classes.{sorted(classes)[0]}"
                raise UnsafeModelError(f"{path}: refused: its code uses {what} ({name})")
