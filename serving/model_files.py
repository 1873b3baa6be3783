"""An exported model directory's files: their manifest, and loading them without running code.

``python -m serving.export`` writes ``manifest.json`` last (each file's size and
SHA-256); loaders check every file they read against it, so a damaged file is refused
by name. A manifest does not stop someone who writes the whole directory, so the model
files are also inspected before torch loads them, as torch's loaders would run code
from a crafted file. What an archive may use is what our own export emits, listed in
``exported_operators.json`` (scripts/exported_operators.py exports every model variant
and collects it; a test fails when the list drifts from the exporter):

- ``fp32.pt2``, ``fp16.pt2``, ``int8.pt2`` (torch.export): ``torch.export.load``
  unpickles payloads marked as pickled with ``weights_only=False``, retries sample
  inputs the same way, loads compiled AOTInductor libraries, evaluates symbolic shapes with sympy (``eval``) and
  executes the guards' code, and a graph node may name any attribute of ``torch``. The
  archive is refused unless it holds only the members torch.export.save writes, raw
  tensors, sample inputs that load with ``weights_only=True``, shape expressions and
  guards of a plain arithmetic grammar, and graph nodes calling only operators of
  the list (ATen's, and FBGEMM's inference operators for the quantized tables); and,
  given the directory's inputs.json, unless its inputs have the columns inputs.json
  describes (a program of another model).
- ``fp16.pt``/``int8.pt`` (TorchScript, written by exports before the quantized
  variants became torch.export programs): refused with a line saying to re-export.
  TorchScript code may call any operator, and what it may call was listed from the
  exporter's own output, which no longer writes TorchScript.
- ``*.aoti.pt2`` (AOTInductor, ``--format aoti``): a compiled shared library; loading it
  runs its code by design, so no inspection can make it safe. It is loaded only when
  the caller says it is trusted (``--trust_native_code``), only from a directory with a
  manifest, and from the bytes checked against it (`NativeCodeRefused` otherwise); and,
  as a program, only when the input columns the export recorded in it (its metadata,
  `AOTI_INPUTS_KEY`) are those inputs.json describes: a package of another model would
  otherwise fail inside its compiled code (a C++ assertion) at the first forward.

A delta export's ``*.delta`` files (format ``delta``, serving/delta.py) are raw bytes of
changed rows, written into the base's programs after these checks; `load_model_file`
refuses them as models of their own.

Example::

    manifest = read_manifest("model_dir")
    module = load_model_file("model_dir", "fp32.pt2", "torch.export", manifest)
"""

import functools
import io
import json
import os
import re
import sys
import zipfile
from collections.abc import Iterator
from typing import Any

import torch

from common.errors import BadInput
from common.library_noise import INDUCTOR_NOTICES, quieted
from common.manifest import ManifestEntry, check_bytes, check_manifest_format, entry_of_bytes

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
# The format of an AOTInductor package (compiled native code: loaded only when trusted).
AOTI_FORMAT = "aoti"
TORCH_EXPORT_FORMAT = "torch.export"
# The quantized variants of older exports: recognised, to refuse them with a line saying to re-export.
TORCHSCRIPT_FORMAT = "torchscript"
# The changed rows of a delta export (serving/delta.py), applied onto its base's torch.export program.
DELTA_FORMAT = "delta"
FORMATS = (TORCH_EXPORT_FORMAT, TORCHSCRIPT_FORMAT, AOTI_FORMAT, DELTA_FORMAT)
TRUST_FLAG = "--trust_native_code"
# The key of an AOTInductor package's metadata (strings only) under which serving.export
# records the columns of each input of the program it compiled, as JSON.
AOTI_INPUTS_KEY = "dlrm_input_columns"
# Every operator, builtin and attribute the models this project exports use, by format:
# written by scripts/exported_operators.py from fresh exports of every supported model
# variant (a test fails when it drifts from what the exporter emits).
ALLOWED_REFERENCES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exported_operators.json")


class UnsafeModelError(BadInput):
    """A model file torch would load by running code it holds; the message names the file."""


class ReexportNeeded(BadInput):
    """A model file in a format this version no longer loads (TorchScript)."""


class NativeCodeRefused(BadInput):
    """An AOTInductor package asked for without ``--trust_native_code``, or from a
    directory without a manifest to check it against."""


def write_manifest(directory: str) -> dict[str, ManifestEntry]:
    """Hashes every file of ``directory``, its subdirectories' too (the Triton model
    repository: ``triton/NAME/1/model.pt2``), into its manifest.json (written last)."""
    files = {}
    for parent, subdirectories, names in os.walk(directory):
        subdirectories.sort()
        for name in sorted(names):
            path = os.path.join(parent, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, directory).replace(os.sep, "/")] = entry_of_bytes(f.read())
    with open(os.path.join(directory, MANIFEST_FILE), "w") as f:
        json.dump({"manifest_version": MANIFEST_VERSION, "files": files}, f, indent=1)
    return files


def read_manifest(model_dir: str) -> dict[str, ManifestEntry] | None:
    """The directory's manifest; None (with a warning) for an export made before manifests."""
    path = os.path.join(model_dir, MANIFEST_FILE)
    if not os.path.exists(path):
        if os.path.isdir(model_dir):
            print(
                f"warning: {model_dir} has no {MANIFEST_FILE} (exported before integrity checks): "
                "its files are loaded unverified",
                file=sys.stderr,
                flush=True,
            )
        return None
    try:
        with open(path, "rb") as f:
            return check_manifest_format(json.loads(f.read()), path)
    except (OSError, ValueError, BadInput) as e:  # unreadable, not JSON (a ValueError), or a ManifestError
        raise BadInput(f"{path}: not a model manifest ({e})") from e


def read_file(model_dir: str, name: str, manifest: dict[str, ManifestEntry] | None) -> bytes:
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


def load_model_file(
    model_dir: str,
    name: str,
    fmt: str,
    manifest: dict[str, ManifestEntry] | None,
    input_columns: dict[str, int] | None = None,
    trust_native_code: bool = False,
) -> Any:
    """The callable model in ``name`` (a torch.export program or, trusted, an
    AOTInductor package), after the manifest and the safety checks (module
    docstring). BadInput naming the file otherwise.

    Args:
        input_columns: the columns of each input (``{"dense": 13, "sparse": 26}``) the
            directory's inputs.json describes; a torch.export program taking others
            (a file of another model) is refused before it is loaded.
        trust_native_code: load an AOTInductor package (running its compiled code).
    """
    path = os.path.join(model_dir, name)
    if fmt not in FORMATS:
        raise BadInput(f"{path}: unknown model format {fmt!r} (expected one of {', '.join(FORMATS)})")
    if fmt == AOTI_FORMAT:
        return _load_aoti_package(model_dir, name, manifest, trust_native_code, input_columns)
    if fmt == DELTA_FORMAT:
        raise BadInput(
            f"{path}: a delta export's rows, not a model: serving.predict and serving.serve apply it to "
            "the full export it was taken from (docs/serving.md, delta exports)"
        )
    if fmt == TORCHSCRIPT_FORMAT:
        raise ReexportNeeded(
            f"{path}: a TorchScript variant of an older export, no longer loaded (the quantized "
            "variants are torch.export programs now): export the checkpoint again "
            "(python -m serving.export)"
        )
    return load_exported_program(model_dir, name, manifest, input_columns).module()


def load_exported_program(
    model_dir: str,
    name: str,
    manifest: dict[str, ManifestEntry] | None,
    input_columns: dict[str, int] | None = None,
) -> "torch.export.ExportedProgram":
    """The torch.export program in ``name`` (its weights in ``state_dict`` and
    ``constants``: serving/delta.py changes rows of them), after the manifest and the
    safety checks of `load_model_file`; BadInput naming the file otherwise."""
    path = os.path.join(model_dir, name)
    data = read_file(model_dir, name, manifest)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as e:
        raise BadInput(f"{path}: not a model archive (truncated or damaged?)") from e
    with archive:
        check_exported_program(archive, path)
        if input_columns is not None:
            _check_input_columns(program_input_columns(archive, path), input_columns, path)
    try:
        return torch.export.load(io.BytesIO(data))
    except Exception as e:  # torch raises many types for a file it cannot read
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise BadInput(f"{path}: cannot be loaded ({type(e).__name__}: {first[:200]})") from e


def _check_input_columns(taken: dict[str, int], described: dict[str, int], path: str) -> None:
    if taken != described:
        raise BadInput(
            f"{path} takes inputs of {_columns(taken)}, the directory's inputs.json describes "
            f"{_columns(described)}: the file is another model's"
        )


def _load_aoti_package(
    model_dir: str,
    name: str,
    manifest: dict[str, ManifestEntry] | None,
    trusted: bool,
    input_columns: dict[str, int] | None = None,
) -> Any:
    """The AOTInductor package ``name``, loaded from the bytes the manifest vouches for
    (what was exported is what runs, even if the file changes meanwhile), after its
    recorded input columns are checked against ``input_columns`` (inputs.json's)."""
    path = os.path.join(model_dir, name)
    if not trusted:
        raise NativeCodeRefused(
            f"{path} is an AOTInductor package: compiled native code that runs when it is "
            f"loaded; pass {TRUST_FLAG} to load it (only for a model directory you trust)"
        )
    if manifest is None:
        raise NativeCodeRefused(
            f"{path}: an AOTInductor package is loaded only from a model directory with its "
            f"{MANIFEST_FILE}, which vouches for its bytes"
        )
    data = read_file(model_dir, name, manifest)
    if input_columns is not None:
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                taken = package_input_columns(archive, path)
        except zipfile.BadZipFile as e:
            raise BadInput(f"{path}: not an AOTInductor package (truncated or damaged?)") from e
        _check_input_columns(taken, input_columns, path)
    import torch._inductor  # here: slow to import, and only a trusted package needs it

    try:
        with quieted(INDUCTOR_NOTICES):
            return torch._inductor.aoti_load_package(io.BytesIO(data))
    except Exception as e:  # torch raises many types for a package it cannot load
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise BadInput(f"{path}: cannot be loaded ({type(e).__name__}: {first[:200]})") from e


@functools.cache
def allowed_references() -> dict[str, frozenset[str]]:
    """Format -> what its archives may use (``ALLOWED_REFERENCES_FILE``)."""
    with open(ALLOWED_REFERENCES_FILE) as f:
        return {fmt: frozenset(names) for fmt, names in json.load(f).items() if fmt in FORMATS}


# ---------------------------------------------------------------- torch.export archives

# Archive members (below the archive's root folder) torch.export.save writes for us.
_PT2_MEMBER = re.compile(
    r"(archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"
    r"|models/\w+\.json|data/sample_inputs/\w+\.pt|data/weights/\w+(\.json)?"
    r"|data/constants/\w+(\.json)?)"
)
# Symbolic shapes, as sympy constructor calls: sympy evaluates them with eval().
_SYMPY_TOKEN = re.compile(r"\s*(?:(?P<word>[A-Za-z_]\w*)|'[a-z]\w*'|-?\d+|[(),=])")
_SYMPY_WORDS = frozenset(
    {
        "Add",
        "Mul",
        "Pow",
        "Integer",
        "Rational",
        "Symbol",
        "Max",
        "Min",
        "Mod",
        "FloorDiv",
        "PythonMod",
        "CleanDiv",
        "CeilToInt",
        "FloorToInt",
        "TruncToInt",
        "IntTrueDiv",
        "Eq",
        "Ne",
        "Lt",
        "Le",
        "Gt",
        "Ge",
        "Equality",
        "Unequality",
        "GreaterThan",
        "LessThan",
        "StrictGreaterThan",
        "StrictLessThan",
        "And",
        "Or",
        "Not",
        "True",
        "False",
        "positive",
        "integer",
        "nonnegative",
        "real",
        "finite",
    }
)
# Guards (executed as Python): sizes and strides of the inputs, compared and combined.
_GUARD_TOKEN = re.compile(
    r"\s*(?:L\['\w+'\]|\.size\(\)|\.stride\(\)|\[\d+\]|-?\d+|==|!=|<=|>=|//|[-+*%<>()]"
    r"|\b(and|or|not)\b)"
)


def _tokens_match(text: str, token: "re.Pattern[str]", words: frozenset | None = None) -> bool:
    position = 0
    while position < len(text.rstrip()):
        match = token.match(text, position)
        if match is None or match.end() == position:
            return False
        if words is not None and match.groupdict().get("word") and match.group("word") not in words:
            return False
        position = match.end()
    return True


def _strings(tree: Any, key: str | None = None) -> Iterator[tuple]:
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
    allowed = allowed_references()[TORCH_EXPORT_FORMAT]
    for key, text in _strings(program):
        bad = None
        if key == "target" and text not in allowed:
            bad = f"a graph node calls {text}, which no model exported by this project calls"
        elif key == "expr_str" and not _tokens_match(text, _SYMPY_TOKEN, _SYMPY_WORDS):
            bad = f"a shape expression is not plain arithmetic: {text[:80]!r}"
        elif key == "guards_code" and not _tokens_match(text, _GUARD_TOKEN):
            bad = f"a guard is not a size comparison: {text[:80]!r}"
        elif key in ("name", "as_name") and not text.isidentifier():
            bad = f"a graph value is named {text[:80]!r}"
        if bad:
            raise UnsafeModelError(f"{path}: refused: {bad} ({member}); only code-free exports are loaded")


def _members(archive: zipfile.ZipFile) -> Iterator[tuple[str, str]]:
    """(name, member) of each file of the archive: member is the name below the
    archive's root folder (torch's savers put everything in one)."""
    names = archive.namelist()
    root = names[0].split("/", 1)[0] if names else ""
    for name in names:
        yield name, name[len(root) + 1 :] if name.startswith(root + "/") else name


def program_targets(archive: zipfile.ZipFile) -> set[str]:
    """Every graph node target (operator) of a torch.export archive's programs."""
    return {
        text
        for name, member in _members(archive)
        if member.startswith("models/")
        for key, text in _strings(json.loads(archive.read(name)))
        if key == "target"
    }


def program_input_columns(archive: zipfile.ZipFile, path: str) -> dict[str, int]:
    """Input name -> columns (size of dimension 1) of the program's inputs, from its
    signature; UnsafeModelError when the archive has no readable signature."""
    columns = {}
    try:
        for name, member in _members(archive):
            if member.startswith("models/"):
                module = json.loads(archive.read(name))["graph_module"]
                values = module["graph"]["tensor_values"]
                for spec in module["signature"]["input_specs"]:
                    if "user_input" in spec:
                        value = spec["user_input"]["arg"]["as_tensor"]["name"]
                        sizes = values[value]["sizes"]
                        # A 1-D input (a model's history ids) is one column.
                        columns[value] = sizes[1]["as_int"] if len(sizes) > 1 else 1
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise UnsafeModelError(f"{path}: its program has no readable input signature ({type(e).__name__}: {e})") from e
    return columns


def exported_input_columns(program: "torch.export.ExportedProgram") -> dict[str, int]:
    """Input name -> columns of a torch.export program's inputs (what
    `program_input_columns` reads back from its archive)."""
    inputs = set(program.graph_signature.user_inputs)
    return {
        node.name: int(node.meta["val"].shape[1]) if node.meta["val"].dim() > 1 else 1
        for node in program.graph.nodes
        if node.op == "placeholder" and node.name in inputs
    }


def aoti_metadata(program: "torch.export.ExportedProgram") -> dict[str, str]:
    """What serving.export records in the AOTInductor package of ``program``
    (inductor's ``aot_inductor.metadata``): its input columns, under `AOTI_INPUTS_KEY`."""
    return {AOTI_INPUTS_KEY: json.dumps(exported_input_columns(program), sort_keys=True)}


def package_input_columns(archive: zipfile.ZipFile, path: str) -> dict[str, int]:
    """Input name -> columns of an AOTInductor package's program, as the export
    recorded them in its metadata (read from the archive: nothing is loaded).
    ReexportNeeded for a package without the record (exported before it was kept)."""
    for name, member in _members(archive):
        if member.startswith("data/aotinductor/") and member.endswith("_metadata.json"):
            try:
                recorded = json.loads(archive.read(name)).get(AOTI_INPUTS_KEY)
                if recorded is None:
                    continue
                columns = json.loads(recorded)
                if isinstance(columns, dict) and all(isinstance(k, str) and type(v) is int for k, v in columns.items()):
                    return columns
            except (ValueError, AttributeError, TypeError):
                pass  # not the export's record: refused below
            raise BadInput(f"{path}: its recorded input columns ({name}) do not read as the export writes them")
    raise ReexportNeeded(
        f"{path}: an AOTInductor package that does not record its input columns (exported "
        "before packages kept them): export the checkpoint again (python -m serving.export "
        "--format aoti)"
    )


def _columns(columns: dict[str, int]) -> str:
    return " and ".join(f"{count} {name} columns" for name, count in sorted(columns.items()))


def check_exported_program(archive: zipfile.ZipFile, path: str) -> None:
    """Raises UnsafeModelError unless loading this torch.export archive can run no code."""
    for name, member in _members(archive):
        if not _PT2_MEMBER.fullmatch(member):
            raise UnsafeModelError(
                f"{path}: refused: unexpected archive member {name!r} (compiled code, pickles or a legacy format)"
            )
        if member.endswith(".json"):
            try:
                content = json.loads(archive.read(name))
            except ValueError as e:
                raise UnsafeModelError(f"{path}: {name} is not JSON (damaged?)") from e
            if member.startswith("models/"):
                _check_program_json(content, name, path)
            else:  # weights and constants: raw tensors only, never pickles or script objects
                for fqn, payload in (content.get("config") or {}).items():
                    if payload.get("use_pickle") or not re.fullmatch(
                        r"(weight|tensor)_\d+", str(payload.get("path_name"))
                    ):
                        raise UnsafeModelError(f"{path}: refused: {fqn} is stored as a pickled object ({name})")
        elif member.startswith("data/sample_inputs/"):
            try:
                torch.load(io.BytesIO(archive.read(name)), weights_only=True)
            except Exception as e:  # torch would retry with weights_only=False
                raise UnsafeModelError(f"{path}: refused: {name} is not plain tensors ({type(e).__name__})") from e
