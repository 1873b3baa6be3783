"""common.atomic: a file or directory appears complete or not at all, and a failed
write leaves the old one as it was and no temporary behind."""

import json
import os

import numpy as np
import pytest

from common.atomic import atomic_dir, atomic_path, write_bytes, write_json, write_text


def test_write_replaces_the_file_whole(tmp_path):
    path = str(tmp_path / "meta.json")
    write_json(path, {"rows": 1})
    write_json(path, {"rows": 2, "days": [0, 1]})
    with open(path) as f:
        assert f.read() == json.dumps({"rows": 2, "days": [0, 1]}, indent=2) + "\n"
    write_text(path, "a,b\r\n")
    with open(path, "rb") as f:
        assert f.read() == b"a,b\r\n"  # newlines as given
    assert os.listdir(tmp_path) == ["meta.json"]


def test_failure_midway_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = str(tmp_path / "results.csv")
    write_text(path, "old\n")
    with pytest.raises(RuntimeError, match="midway"):
        with atomic_path(path) as tmp, open(tmp, "w") as f:
            f.write("new, half written")
            f.flush()
            raise RuntimeError("midway")
    with open(path) as f:
        assert f.read() == "old\n"
    assert os.listdir(tmp_path) == ["results.csv"]


def test_a_full_disk_names_the_file_and_keeps_the_old_one(tmp_path):
    path = str(tmp_path / "plan.json")
    write_text(path, "old")
    os.symlink("/dev/full", path + ".tmp")  # every write to the temporary fails with ENOSPC
    with pytest.raises(OSError, match=r"plan.json: cannot write \(No space left on device\)$"):
        write_bytes(path, b"x" * (1 << 20))
    with open(path) as f:
        assert f.read() == "old"
    assert os.listdir(tmp_path) == ["plan.json"]


def test_the_suffix_keeps_the_extension_writers_go_by(tmp_path):
    path = str(tmp_path / "counts.npz")
    with atomic_path(path, suffix=".tmp.npz") as tmp:
        np.savez(tmp, ids=np.arange(3))  # np.savez appends .npz to a name without it
    with np.load(path) as saved:
        assert saved["ids"].tolist() == [0, 1, 2]
    assert os.listdir(tmp_path) == ["counts.npz"]


def _fill(directory, text):
    os.makedirs(os.path.join(directory, "sub"))
    write_text(os.path.join(directory, "sub", "a.txt"), text)


def _read(directory):
    with open(os.path.join(directory, "sub", "a.txt")) as f:
        return f.read()


def test_directory_is_replaced_whole_or_kept(tmp_path):
    out = str(tmp_path / "out")
    with atomic_dir(out) as staging:
        _fill(staging, "first")
        assert not os.path.exists(out)  # nothing there until complete
    with atomic_dir(out, replace=True) as staging:
        _fill(staging, "second")
    assert _read(out) == "second" and os.listdir(out) == ["sub"]
    with pytest.raises(RuntimeError, match="midway"):
        with atomic_dir(out) as staging:
            _fill(staging, "third")
            raise RuntimeError("midway")
    assert _read(out) == "second"
    assert os.listdir(tmp_path) == ["out"]  # no staging or old directory left


def test_directory_not_replaced_refuses_a_non_empty_target(tmp_path):
    out = str(tmp_path / "model")
    os.makedirs(out)
    with atomic_dir(out, replace=False) as staging:  # an empty target is taken
        _fill(staging, "model")
    assert _read(out) == "model"
    with pytest.raises(OSError):
        with atomic_dir(out, replace=False) as staging:
            _fill(staging, "other")
    assert _read(out) == "model"
    assert os.listdir(tmp_path) == ["model"]
