"""Delta exports (serving/delta.py): a delta applied to its base predicts exactly as the
full export of the same checkpoint, is at most 1.1x the bytes of the changed rows and
the dense part, and is refused, in one line, on the wrong base, another model's base,
or when written by a newer version."""

import hashlib
import json
import math
import os
import shutil

import numpy as np
import pytest
import torch
from fbgemm_gpu.split_embedding_configs import SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import rounded_row_size_in_bytes

from common.errors import BadInput
from serving import export, predict
from serving.delta import (
    DELTA_FILE,
    DELTA_VERSION,
    SKETCH_DELTA_FILE,
    DeltaRecord,
    apply_sketch_delta,
    diff_sketches,
    program_tensors,
    rice_decode,
    rice_encode,
)
from serving.model_files import write_manifest
from tests.support.exported_model import tiny_checkpoint

ROWS, DIM, CHANGED = 1000, 16, 50  # per table: a day changing 5% of its rows
NUM_TABLES = 26


def one_day(model: torch.nn.Module) -> None:
    """What a day of training changes: some rows of every table, every dense weight."""
    generator = torch.Generator().manual_seed(3)
    for name, tensor in model.state_dict(keep_vars=True).items():
        if "embedding_bags" in name:
            rows = torch.randperm(ROWS, generator=generator)[:CHANGED]
            tensor.data[rows] += torch.randn(CHANGED, DIM, generator=generator)
        elif tensor.is_floating_point():
            tensor.data += 0.01 * torch.randn(tensor.shape, generator=generator)


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, str]:
    """Day 0 and day 1 of a model, each exported in full, and day 1 as a delta of day 0."""
    root = tmp_path_factory.mktemp("delta")
    day0 = tiny_checkpoint(root, "delta", num_embeddings=ROWS, embedding_dim=DIM, step=1)
    day1 = tiny_checkpoint(root, "delta", num_embeddings=ROWS, embedding_dim=DIM, step=2, change=one_day)
    paths = {name: str(root / name) for name in ("full0", "full1", "delta1")}
    export.export_model(day0, paths["full0"], ["fp16", "int8"])
    export.export_model(day1, paths["full1"], ["fp16", "int8"])
    assert export.main(["--checkpoint", day1, "--output", paths["delta1"], "--delta_from", paths["full0"]]) == 0
    return {**paths, "root": str(root), "day1": day1}


def random_rows(count: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.integers(0, 50, (count, 13)), rng.integers(0, 2**32, (count, NUM_TABLES), dtype=np.uint64)


@pytest.mark.parametrize("variant", ["fp32", "fp16", "int8"])
def test_a_delta_on_its_base_predicts_as_the_full_export(exports, variant):
    dense, sparse = random_rows(512)
    full = predict.Predictor(exports["full1"], variant).predict(dense, sparse)
    applied = predict.Predictor(exports["delta1"], variant)
    assert applied.base == os.path.normpath(exports["full0"])  # found where the delta records it
    assert applied.inputs.step == 2
    np.testing.assert_array_equal(applied.predict(dense, sparse), full)
    before = predict.Predictor(exports["full0"], variant).predict(dense, sparse)
    assert np.abs(before - full).max() > 1e-4  # the day changed the model


def test_a_delta_is_at_most_1_1x_the_changed_rows_and_the_dense_part(exports):
    """From file sizes: every file of the delta directory, against the rows the day
    changed at their stored size in each program (fp32; fp16 and int8 rows as FBGEMM
    stores them, 16-byte aligned) plus each program's dense part."""
    delta_bytes = sum(os.path.getsize(os.path.join(exports["delta1"], f)) for f in os.listdir(exports["delta1"]))
    rows = NUM_TABLES * CHANGED
    changed_rows = rows * DIM * 4 + sum(
        rows * rounded_row_size_in_bytes(DIM, kind, 16) for kind in (SparseType.FP16, SparseType.INT8)
    )
    dense = 0
    for variant in ("fp32", "fp16", "int8"):
        program = torch.export.load(os.path.join(exports["full1"], f"{variant}.pt2"))
        dense += sum(
            program.state_dict[name].numel() * program.state_dict[name].element_size()
            for name in program.graph_signature.parameters
            if name != "dlrm.sparse_arch.weight"  # the fp32 tables; the quantized ones are constants
        )
    ratio = delta_bytes / (changed_rows + dense)
    full_bytes = sum(os.path.getsize(os.path.join(exports["full1"], f)) for f in os.listdir(exports["full1"]))
    print(f"delta {delta_bytes} bytes, changed rows {changed_rows} + dense {dense}: {ratio:.3f}x; full {full_bytes}")
    assert ratio <= 1.1
    assert delta_bytes < full_bytes / 4


def test_the_delta_holds_only_the_changed_rows(exports):
    """Applied to the base, the fp32 program's weights are the full export's, and the
    delta names exactly the rows the day changed."""
    with open(os.path.join(exports["delta1"], DELTA_FILE)) as f:
        record = json.load(f)
    (tables,) = [r for r in record["regions"]["fp32"] if r["tensor"] == "dlrm.sparse_arch.weight"]
    assert (tables["rows"], tables["changed"], tables["row_bytes"]) == (NUM_TABLES * ROWS, NUM_TABLES * CHANGED, 64)
    applied = predict.Predictor(exports["delta1"]).model
    full = torch.export.load(os.path.join(exports["full1"], "fp32.pt2"))
    for name, tensor in program_tensors(full).items():
        assert torch.equal(applied.get_parameter(name) if name in full.state_dict else tensor, tensor), name


def predict_error(capsys, *flags: str) -> str:
    assert predict.main(["--input", "nothing.tsv", *flags]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_delta_on_another_base_is_refused_in_one_line(exports, capsys):
    error = predict_error(capsys, "--model", exports["delta1"], "--base", exports["full1"])
    assert f"--base {exports['full1']} is not the export the delta {exports['delta1']} was taken from" in error
    moved = os.path.join(exports["root"], "moved")
    shutil.copytree(exports["full0"], moved)
    assert predict.Predictor(exports["delta1"], "int8", base=moved).base == moved  # the same export elsewhere
    error = predict_error(capsys, "--model", exports["full1"], "--base", exports["full0"])
    assert "is a full export, not a delta" in error


def test_a_delta_of_another_model_is_refused_in_one_line(exports, tmp_path, capsys):
    other = str(tmp_path / "other")
    export.export_model(tiny_checkpoint(tmp_path, "other"), other, [])
    error = predict_error(capsys, "--model", exports["delta1"], "--base", other)
    assert f"--base {other} is another model than the delta" in error and "num_embeddings_per_feature" in error
    # The writer refuses too, before tracing anything.
    assert (
        export.main(
            [
                "--checkpoint",
                exports["day1"],
                "--output",
                str(tmp_path / "d"),
                "--delta_from",
                other,
                "--quantize",
                "none",
            ]
        )
        == 2
    )
    assert "is another model (num_embeddings_per_feature differ" in capsys.readouterr().err


def test_a_delta_written_by_a_newer_version_is_refused_in_one_line(exports, tmp_path, capsys):
    newer = str(tmp_path / "newer")
    shutil.copytree(exports["delta1"], newer)
    path = os.path.join(newer, DELTA_FILE)
    with open(path) as f:
        record = json.load(f)
    with open(path, "w") as f:
        json.dump({**record, "version": DELTA_VERSION + 1}, f)
    os.remove(os.path.join(newer, "manifest.json"))
    write_manifest(newer)
    # base_path is relative to the delta: this copy's base is given.
    error = predict_error(capsys, "--model", newer, "--base", exports["full0"])
    assert error.endswith(
        f"{path}: version is {DELTA_VERSION + 1}, newer than this code reads ({DELTA_VERSION}): use the release "
        "that wrote it or a newer one"
    )


def test_a_damaged_delta_is_refused_by_its_manifest(exports, tmp_path, capsys):
    damaged = str(tmp_path / "damaged")
    shutil.copytree(exports["delta1"], damaged)
    with open(os.path.join(damaged, "fp32.delta"), "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02")
    assert "fp32.delta" in predict_error(capsys, "--model", damaged, "--base", exports["full0"])


def test_the_writer_refuses_what_a_delta_cannot_hold(exports, tmp_path, capsys):
    out = str(tmp_path / "d")
    day1 = exports["day1"]
    assert export.main(["--checkpoint", day1, "--output", out, "--delta_from", exports["delta1"]]) == 2
    assert "is a delta export: deltas are taken from and applied to a full export" in capsys.readouterr().err
    assert (
        export.main(["--checkpoint", day1, "--output", out, "--delta_from", exports["full0"], "--format", "aoti"]) == 2
    )
    assert "an AOTInductor package holds its weights inside compiled code" in capsys.readouterr().err
    fp32_only = str(tmp_path / "fp32_only")
    export.export_model(day1, fp32_only, [])
    assert export.main(["--checkpoint", day1, "--output", out, "--delta_from", fp32_only]) == 2
    assert "has no fp16 program (it has fp32): pass --quantize with those it has (none)" in capsys.readouterr().err
    assert not os.path.exists(out)


def test_a_delta_changing_where_rows_lie_is_refused(exports, tmp_path, capsys):
    """A delta changes weights only: one rewriting the quantized kernel's table offsets
    (which would send lookups outside the tables) is refused, its manifest rewritten to
    vouch for it."""
    crafted = str(tmp_path / "crafted")
    shutil.copytree(exports["delta1"], crafted)
    offsets = "dlrm.sparse_arch.embedding_bag_collection.tbes.0.weights_offsets"
    with open(os.path.join(crafted, "int8.delta"), "ab") as f:
        end = f.tell()
        f.write(np.full(NUM_TABLES, 1 << 40, np.int64).tobytes())
    path = os.path.join(crafted, DELTA_FILE)
    with open(path) as f:
        record = json.load(f)
    region = dict(tensor=offsets, dtype="int64", shape=[NUM_TABLES], start=0, row_bytes=8 * NUM_TABLES, rows=1)
    record["regions"]["int8"].append({**region, "encoding": "all", "changed": 1, "offset": end, "index_bytes": 0})
    with open(path, "w") as f:
        json.dump(record, f)
    os.remove(os.path.join(crafted, "manifest.json"))
    write_manifest(crafted)
    error = predict_error(capsys, "--model", crafted, "--base", exports["full0"], "--variant", "int8")
    assert error.endswith(
        f"{crafted}/int8.delta: {offsets}: a torch.int64 tensor, not weights: a delta changes weights only"
    )


def _filters(seed: int, sizes=(1 << 17, 1 << 13)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.random(n) < 0.3).astype(np.uint8) * rng.integers(1, 256, n, dtype=np.uint8) for n in sizes]


def _sketch_delta_dir(tmp_path, base: list[np.ndarray], new: list[np.ndarray], names=("A", "B")) -> str:
    """A delta export's directory holding only what its seen-id filters need."""
    entries, payload = diff_sketches(base, new, names)
    record = DeltaRecord("0" * 64, "../base", 1, "ckpt", sketch_bits=entries)
    record.sketch_sha256 = hashlib.sha256(b"".join(f.tobytes() for f in new)).hexdigest()
    delta = tmp_path / "delta"
    delta.mkdir()
    (delta / DELTA_FILE).write_bytes(record.to_json())
    (delta / SKETCH_DELTA_FILE).write_bytes(payload)
    write_manifest(str(delta))
    return str(delta)


def _set_bits(filters: list[np.ndarray], count: int, seed: int) -> list[np.ndarray]:
    """``filters`` with ``count`` more bits set in each, at random places (some already set)."""
    rng = np.random.default_rng(seed)
    new = [f.copy() for f in filters]
    for f in new:
        places = rng.choice(len(f), count, replace=False)
        f[places] |= np.uint8(1) << rng.integers(0, 8, count).astype(np.uint8)
    return new


@pytest.mark.parametrize(
    "bits, count",
    [(1 << 16, 0), (1 << 16, 1), (8, 1), (1 << 16, 1 << 16), (1 << 16, 1 << 15), (1 << 21, 2500), (1 << 21, 30)],
    ids=["empty", "one", "one_in_a_byte", "all", "dense", "sparse", "very_sparse"],
)
def test_the_filter_code_round_trips(bits, count):
    """Positions of bits coded and decoded: none, one, every bit, half of them, a day's
    few; the code within 2 bits a position of ``log2(C(bits, count)) / count``, the least
    any code of such a set can average."""
    rng = np.random.default_rng(count)
    positions = np.sort(rng.choice(bits, count, replace=False))
    if count == 1:
        positions[:] = bits - 1  # the last bit: the largest gap
    k, code = rice_encode(positions, bits)
    np.testing.assert_array_equal(rice_decode(code, count, k, bits, "f"), positions)
    log2_choices = (math.lgamma(bits + 1) - math.lgamma(count + 1) - math.lgamma(bits - count + 1)) / math.log(2)
    assert len(code) * 8 <= log2_choices + 2 * count + 16


def test_a_delta_carries_only_the_bits_the_filters_gained_and_rebuilds_them_exactly(tmp_path):
    base = [*_filters(0), np.zeros(1 << 10, np.uint8), np.full(1 << 10, 0x11, np.uint8)]
    new = _set_bits(base[:2], 40, 1)  # a day's new ids: a few bits, spread over the filter
    new += [np.full(1 << 10, 0xFF, np.uint8), base[3].copy()]  # every bit new; none new
    names = ["A", "B", "C", "D"]
    delta = _sketch_delta_dir(tmp_path, base, new, names)
    with open(os.path.join(delta, DELTA_FILE)) as f:
        record = json.load(f)
    assert record["version"] == DELTA_VERSION == 3 and record["sketch"] is None
    added = [int(np.bitwise_count(a & ~b).sum()) for a, b in zip(new, base)]
    assert [e["added"] for e in record["sketch_bits"]] == added[:3]  # D gained none: no entry
    # The bits gained, about log2(m / n) + 1.5 bits each (where a changed byte and its place took 24).
    size = os.path.getsize(os.path.join(delta, SKETCH_DELTA_FILE))
    expected = sum(n * (math.log2(len(f) * 8 / n) + 1.5) / 8 for n, f in zip(added, new) if n)
    assert size <= expected + 3 * 3  # each filter's two streams end in a byte
    # Version 2 took 3 bytes a changed byte (the byte and its place); at 40 new bits in a million, 16 bits a bit.
    sparse = sum(e["code_bytes"] for e in record["sketch_bits"][:2])
    assert sparse <= 2 * sum(int((a != b).sum()) for a, b in zip(base[:2], new[:2]))
    rebuilt = apply_sketch_delta(delta, None, base, names)
    assert b"".join(f.tobytes() for f in rebuilt) == b"".join(f.tobytes() for f in new)
    with pytest.raises(BadInput, match=r"not the one it was taken from"):
        apply_sketch_delta(delta, None, [*_filters(2), *base[2:]], names)  # another base's filters
    lost = [new[0] & np.uint8(0xFE), *new[1:]]  # a bit the base has is gone: not its descendant
    assert diff_sketches(base, lost, names) is None
    assert diff_sketches(base, [new[0][:-1], *new[1:]], names) is None  # another size


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda code: code[:-1], r"does not hold 40 gaps|short of 40 gaps"),
        (lambda code: code[:3], r"short of 40 gaps of \d+ low bits \(truncated\?\)"),
        (lambda code: code + b"\x00", r"does not hold 40 gaps \(40 unary ends in \d+ bytes; truncated or damaged\?\)"),
        (lambda code: code[:-1] + bytes([code[-1] | 0x01]), r"does not hold 40 gaps"),
        (lambda code: b"", r"short of 40 gaps"),
    ],
    ids=["last_byte_cut", "cut_to_3_bytes", "a_byte_more", "an_end_more", "empty"],
)
def test_a_damaged_filter_code_is_refused_in_one_line(damage, message):
    positions = np.sort(np.random.default_rng(0).choice(1 << 16, 40, replace=False))
    k, code = rice_encode(positions, 1 << 16)
    with pytest.raises(BadInput, match=message) as refused:
        rice_decode(damage(code), 40, k, 1 << 16, "d/id_sketch.delta: C1")
    assert str(refused.value).startswith("d/id_sketch.delta: C1: ") and "\n" not in str(refused.value)
    with pytest.raises(BadInput, match=r"names bit \d+ of a filter of 4096 \(damaged\?\)"):
        rice_decode(code, 40, k, 4096, "f")  # positions past the filter
    with pytest.raises(BadInput, match=r"a code of parameter 17 for a filter of 65536 bits"):
        rice_decode(code, 40, 17, 1 << 16, "f")


def test_a_truncated_filter_delta_is_refused_in_one_line(tmp_path):
    base = _filters(0)
    delta = _sketch_delta_dir(tmp_path, base, _set_bits(base, 40, 1))
    path = os.path.join(delta, SKETCH_DELTA_FILE)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 1)
    with pytest.raises(
        BadInput, match=rf"^{path}: B: its code lies past the end of the file \(\d+ bytes; truncated\?\)$"
    ):
        apply_sketch_delta(delta, None, base, ["A", "B"])


def test_a_version_2_delta_of_the_filters_is_read(tmp_path):
    """A delta written before version 3 carries the filters' changed bytes (their 16-bit
    gaps, then the bytes): applied by OR as before."""
    base = [_filters(0, sizes=(1 << 13,))[0]]
    new = _set_bits(base, 40, 1)
    changed = np.flatnonzero(base[0] != new[0])
    index = np.diff(changed, prepend=0).astype(np.uint16).tobytes()
    region = dict(tensor="A", dtype="uint8", shape=[1 << 13], start=0, row_bytes=1, rows=1 << 13, encoding="gaps16")
    record = {
        "version": 2,
        "kind": "delta",
        "base_digest": "0" * 64,
        "base_path": "../base",
        "base_step": 1,
        "base_checkpoint": "ckpt",
        "regions": {},
        "sketch": [{**region, "changed": len(changed), "offset": 0, "index_bytes": len(index)}],
        "sketch_sha256": hashlib.sha256(new[0].tobytes()).hexdigest(),
    }
    delta = tmp_path / "delta"
    delta.mkdir()
    (delta / DELTA_FILE).write_text(json.dumps(record))
    (delta / SKETCH_DELTA_FILE).write_bytes(index + new[0][changed].tobytes())
    (rebuilt,) = apply_sketch_delta(str(delta), None, base, ["A"])
    assert rebuilt.tobytes() == new[0].tobytes()
