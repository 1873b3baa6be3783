"""`atomic_symlink`, the promotion of an export: a reader following the link always
finds a target while it is switched, and the link holds a relative path."""

import os
import threading

import pytest

from common.atomic import atomic_symlink


def test_a_reader_never_finds_the_link_missing_while_it_switches(tmp_path):
    targets = [tmp_path / "exports" / name for name in ("day_1", "day_2")]
    for target in targets:
        target.mkdir(parents=True)
        (target / "name").write_text(target.name)
    link = str(tmp_path / "current")
    atomic_symlink(link, str(targets[0]))
    assert os.readlink(link) == os.path.join("exports", "day_1")  # moves with its directory
    seen, stop = [], threading.Event()

    def reader() -> None:
        while not stop.is_set():
            with open(os.path.join(link, "name")) as f:  # FileNotFoundError if the link were ever missing
                seen.append(f.read())

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(300):
            atomic_symlink(link, str(targets[(i + 1) % 2]))
    finally:
        stop.set()
        thread.join()
    assert set(seen) <= {"day_1", "day_2"} and seen
    assert os.path.realpath(link) == str(targets[0])
    assert sorted(os.listdir(tmp_path)) == ["current", "exports"]  # no temporary link left


def test_a_missing_target_or_a_directory_in_the_links_place_is_refused(tmp_path):
    link = str(tmp_path / "current")
    with pytest.raises(FileNotFoundError, match="no such file or directory to link"):
        atomic_symlink(link, str(tmp_path / "nothing"))
    assert not os.path.lexists(link)
    (tmp_path / "current").mkdir()
    (tmp_path / "model").mkdir()
    with pytest.raises(IsADirectoryError, match="is a directory, not a link"):
        atomic_symlink(link, str(tmp_path / "model"))
    assert sorted(os.listdir(tmp_path)) == ["current", "model"]
