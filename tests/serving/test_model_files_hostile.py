"""Generated hostile model directories: a real export, mutated as an attacker would.

Each case starts from a model this project exported (a checkpoint saved and exported
in this process), changes one thing (an archive's members, graph or guards; a field of
inputs.json; a checkpoint's meta.json), rewrites the manifest to match (an attacker
writes the whole directory), and asserts the loaders refuse it with one line
(BadInput), run none of its code (no marker file appears) and write nothing.

Hypothesis draws the cases: HOSTILE_EXAMPLES (default 10) per property; `make
test-hostile` runs more.
"""

import json
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from checkpoints.directory import META_FILE
from common.errors import BadInput
from common.manifest import entry_of_bytes
from harness.launch import REPO
from serving.export import FP32_FILE, export_model
from serving.model_files import (
    MANIFEST_FILE,
    TORCH_EXPORT_FORMAT,
    allowed_references,
    load_model_file,
    read_manifest,
    write_manifest,
)
from serving.model_inputs import INPUTS_FILE, PRECISIONS, program_file
from serving.predict import Predictor
from tests.support.exported_model import tiny_checkpoint
from tests.support.hostile import HOSTILE_SETTINGS as HOSTILE

VARIANTS = {precision: program_file(precision) for precision in PRECISIONS}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict:
    """A tiny Criteo model's checkpoint (saved in this process) and its export."""
    root = tmp_path_factory.mktemp("hostile")
    ckpt = tiny_checkpoint(root, "hostile")
    export_model(ckpt, str(root / "model"), ["fp16", "int8"])
    return {"ckpt": ckpt, "model": str(root / "model"), "root": root}


def copy_model(exported: dict, tmp_path) -> str:
    target = str(tmp_path / "model")
    if os.path.exists(target):
        shutil.rmtree(target)
    shutil.copytree(exported["model"], target)
    return target


def rewrite_manifest(model_dir: str) -> None:
    """What an attacker who writes the whole directory does: a manifest matching the files."""
    os.remove(os.path.join(model_dir, MANIFEST_FILE))
    write_manifest(model_dir)


def rewrite_archive(path: str, change) -> None:
    """Replaces the zip archive at ``path`` by ``change(members)`` ({name: bytes} -> same)."""
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    members = change(members)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def files_under(directory) -> set:
    return {os.path.join(d, f) for d, _, files in os.walk(directory) for f in files}


def assert_refused(model_dir: str, variant: str, marker: str, *match: str) -> str:
    """Loading and running ``variant`` raises BadInput with a one-line message and no
    marker appears; returns the message."""
    before = files_under(os.path.dirname(model_dir))
    with pytest.raises(BadInput) as raised:
        predictor = Predictor(model_dir, variant)
        predictor.predict(np.zeros((2, 13), np.int64), np.zeros((2, 26), np.uint32))
    message = str(raised.value)
    assert "\n" not in message and len(message) < 600, message
    for text in match:
        assert text in message, message
    assert not os.path.exists(marker), "the archive's code ran"
    assert files_under(os.path.dirname(model_dir)) == before, "something was written"
    return message


def test_the_export_loads_and_uses_only_what_the_list_allows(exported):
    """The unchanged export passes every check (the list covers it) and predicts."""
    for variant in VARIANTS:
        p = Predictor(exported["model"], variant).predict(np.zeros((2, 13), np.int64), np.zeros((2, 26), np.uint32))
        assert p.shape == (2,) and np.all((p > 0) & (p < 1))


# ---------------------------------------------------------------- torch.export programs

ATEN_OPERATORS = sorted(name for name in dir(torch.ops.aten) if not name.startswith("_") and name.isidentifier())


def program_json(members: dict) -> str:
    """The member holding the archive's program (graph, signature, guards)."""
    return next(n for n in members if "/models/" in n and n.endswith(".json"))


def guard_running(marker: str):
    """A change of the program: a guard (Python torch.export.load would execute) that
    creates ``marker``."""

    def change(members: dict) -> dict:
        name = program_json(members)
        members[name] = json.dumps(
            {**json.loads(members[name]), "guards_code": [f"open({marker!r}, 'w') and True"]}
        ).encode()
        return members

    return change


@HOSTILE
@given(op=st.sampled_from(ATEN_OPERATORS), variant=st.sampled_from(list(VARIANTS)))
def test_a_graph_node_calling_an_operator_the_export_does_not_is_refused(exported, tmp_path_factory, op, variant):
    tmp_path = tmp_path_factory.mktemp("graph")
    model_dir = copy_model(exported, tmp_path)
    target = f"torch.ops.aten.{op}.default"

    def retarget(members: dict) -> dict:
        name = program_json(members)
        program = json.loads(members[name])
        node = next(n for n in program["graph_module"]["graph"]["nodes"] if n["target"].startswith("torch.ops.aten"))
        node["target"] = target
        members[name] = json.dumps(program).encode()
        return members

    rewrite_archive(os.path.join(model_dir, VARIANTS[variant]), retarget)
    rewrite_manifest(model_dir)
    if target in allowed_references()[TORCH_EXPORT_FORMAT]:
        return  # an operator our export calls: allowed (the graph is then wrong, not foreign)
    assert_refused(model_dir, variant, str(tmp_path / "none"), f"a graph node calls {target}")


@pytest.mark.parametrize("variant", ["fp16", "int8"])
def test_a_quantized_program_running_code_in_a_guard_is_refused(exported, tmp_path, variant):
    """A guard writing a file is refused before anything is loaded (fp32's:
    tests/serving/test_predict.py)."""
    marker = str(tmp_path / "written_by_the_model")
    model_dir = copy_model(exported, tmp_path)
    rewrite_archive(os.path.join(model_dir, VARIANTS[variant]), guard_running(marker))
    rewrite_manifest(model_dir)
    assert_refused(model_dir, variant, marker, f"{VARIANTS[variant]}: refused: a guard is not a size comparison")


@HOSTILE
@given(
    member=st.sampled_from(
        [
            "extra/evil.txt",
            "models/evil.so",
            "data/evil.pkl",
            "data/weights/evil.pkl",
            "data/aotinductor/model.so",
            "models/../../etc.json",
            "constants/0",
        ]
    ),
    variant=st.sampled_from(list(VARIANTS)),
)
def test_archive_members_torch_does_not_write_are_refused(exported, tmp_path_factory, member, variant):
    tmp_path = tmp_path_factory.mktemp("member")
    model_dir = copy_model(exported, tmp_path)

    def add(members: dict) -> dict:
        root = next(iter(members)).split("/", 1)[0]
        members[f"{root}/{member}"] = b"payload"
        return members

    rewrite_archive(os.path.join(model_dir, VARIANTS[variant]), add)
    rewrite_manifest(model_dir)
    assert_refused(model_dir, variant, str(tmp_path / "none"), "refused: unexpected archive member")


def test_an_fp32_program_of_another_model_is_refused_at_load(exported, tmp_path):
    """Item 8: a program taking other inputs than inputs.json says (before: a guard
    failure at the first call)."""
    model_dir = copy_model(exported, tmp_path)
    inputs = json.loads(open(os.path.join(model_dir, INPUTS_FILE)).read())
    inputs["dense_feature_names"] = inputs["dense_feature_names"][:5]
    with open(os.path.join(model_dir, INPUTS_FILE), "w") as f:
        json.dump(inputs, f)
    rewrite_manifest(model_dir)
    manifest = read_manifest(model_dir)
    with pytest.raises(
        BadInput,
        match="takes inputs of 13 dense columns and 26 sparse columns, the directory's "
        "inputs.json describes 5 dense columns and 26 sparse columns",
    ):
        load_model_file(model_dir, FP32_FILE, "torch.export", manifest, {"dense": 5, "sparse": 26})


# ---------------------------------------------------------------- meta.json, inputs.json


def test_a_meta_json_declaring_huge_tables_is_refused_before_allocation(exported, tmp_path):
    """Item 8: a checkpoint's meta.json claiming 10^11-row tables (with a manifest
    rewritten to match) is refused by export with one line, nothing allocated or written."""
    ckpt = str(tmp_path / "step_000000001")
    shutil.copytree(exported["ckpt"], ckpt)
    meta = json.loads(open(os.path.join(ckpt, META_FILE)).read())
    meta["config"]["model"]["num_embeddings_per_feature"][0] = 10**11
    data = json.dumps(meta).encode()
    open(os.path.join(ckpt, META_FILE), "wb").write(data)
    manifest = json.loads(open(os.path.join(ckpt, "COMPLETE")).read())
    manifest["files"][META_FILE] = entry_of_bytes(data)
    open(os.path.join(ckpt, "COMPLETE"), "w").write(json.dumps(manifest))
    with pytest.raises(
        BadInput,
        match=r"model.model.sparse_arch.embedding_bag_collection.embedding_bags.t_cat_0"
        r".weight has shape \[10, 4\] there, \[100000000000, 4\] in this model",
    ):
        export_model(ckpt, str(tmp_path / "out"), ["int8"])
    assert not os.path.exists(tmp_path / "out")


# Mutations of one inputs.json field: (field path, hostile values).
INPUT_LIES = {
    ("dense_feature_names",): [[], ["x"] * 14, "int_0", None],
    ("sparse_feature_names",): [["cat_0"], [], 7],
    ("sparse_hotness",): [[2] * 26, [0] * 26, [10**11] * 26, "1"],
    ("num_embeddings_per_feature",): [[0] * 26, [-1] * 26, [10] * 25, None],
    ("variants", "int8", "file"): ["../int8.pt2", "/etc/hostname", "fp32.pt2", "missing.pt2", ""],
    ("variants", "int8", "format"): ["torchscript", "pickle", 3, "aoti"],
    ("variants", "fp32", "file"): ["int8.pt", "../../model/fp32.pt2"],
    ("preprocessing", "vocabulary"): ["../../../etc/passwd", "/etc/passwd", "inputs.json", 5],
    ("preprocessing", "modulo_num_embeddings_per_feature"): [[0] * 26, [1] * 3, "x"],
    ("layout",): ["feature_spec_csv", "parquet_columns", "pickle", None],
    ("version",): [3, "2", None],
}


@HOSTILE
@given(
    case=st.sampled_from([(field, value) for field, values in INPUT_LIES.items() for value in values]),
    variant=st.sampled_from(list(VARIANTS)),
)
def test_an_inputs_json_that_lies_is_refused_with_one_line(exported, tmp_path_factory, case, variant):
    field, value = case
    variant = field[1] if field[0] == "variants" else variant  # a lie about the variant loaded
    tmp_path = tmp_path_factory.mktemp("inputs")
    model_dir = copy_model(exported, tmp_path)
    path = os.path.join(model_dir, INPUTS_FILE)
    document = json.loads(open(path).read())
    place = document
    for key in field[:-1]:
        place = place[key]
    place[field[-1]] = value
    open(path, "w").write(json.dumps(document))
    rewrite_manifest(model_dir)
    assert_refused(model_dir, variant, str(tmp_path / "none"))


@pytest.mark.slow
def test_the_allow_list_is_what_the_exporter_emits():
    """serving/exported_operators.json is exactly the union over every model variant
    and format of what the export writes (regenerate it after changing the export)."""
    from scripts import exported_operators

    with open(exported_operators.ALLOWED_REFERENCES_FILE) as f:
        assert f.read() == exported_operators.file_text(exported_operators.emitted_references()), (
            "serving/exported_operators.json is out of date: run python scripts/exported_operators.py --write"
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    "module, args",
    [
        ("serving.predict", ["--variant", "int8", "--input", "{input}"]),
        ("serving.quality_gate", ["--data", "{data}", "--limit_rows", "64"]),
    ],
)
def test_the_clis_refuse_a_hostile_archive_with_one_line_and_exit_2(exported, synthetic_dir, tmp_path, module, args):
    marker = str(tmp_path / "written_by_the_model")
    model_dir = copy_model(exported, tmp_path)
    rewrite_archive(os.path.join(model_dir, VARIANTS["int8"]), guard_running(marker))
    rewrite_manifest(model_dir)
    lines = tmp_path / "lines.tsv"
    lines.write_text("1" + "\t1" * 13 + "\ta1" * 26 + "\n")
    argv = [a.format(input=lines, data=synthetic_dir) for a in args]
    result = subprocess.run(
        [sys.executable, "-m", module, "--model", model_dir, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0 and "refused: a guard is not a size comparison" in result.stderr
    assert not os.path.exists(marker)
