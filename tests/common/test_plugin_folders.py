"""common/plugin_folders.py: a registry's folders under the other sys.path entries."""

import os
import sys

from common.plugin_folders import plugin_folders


def test_folders_under_other_entries_join_once_and_the_current_directory_never(tmp_path, monkeypatch):
    own, other, also = (tmp_path / name for name in ("own", "other", "also"))
    for root in (own, other, also):
        (root / "data" / "sources").mkdir(parents=True)
    (tmp_path / "plain").mkdir()
    monkeypatch.chdir(also)  # "" on the path is this directory: never searched
    monkeypatch.setattr(sys, "path", ["", str(own), str(other), str(tmp_path / "plain"), str(other)])
    found = plugin_folders([str(own / "data" / "sources")], "data", "sources")
    assert found == [os.path.join(str(other), "data", "sources")]
