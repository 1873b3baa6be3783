"""scripts/release_tag.py: a release X.Y.Z is the commit tagged vX.Y.Z, where
common/version.py and CHANGELOG.md's newest heading say X.Y.Z."""

import os
import subprocess

import pytest

from common.version import VERSION
from harness.launch import REPO
from scripts.release_tag import ReleaseError, changelog_version, main, tag_head, tag_problems, version_in


def test_the_version_is_read_without_running_the_file():
    with open(os.path.join(REPO, "common", "version.py")) as f:
        assert version_in(f.read()) == VERSION
    assert version_in('import os\nVERSION = os.system("false")\n') is None


def test_the_changelog_names_a_release_only_in_a_dated_heading():
    assert changelog_version("# Changelog\n\n## 1.2.3 (2026-11-28)\n\n## 1.2.2 (2026-10-01)\n") == "1.2.3"
    assert changelog_version("# Changelog\n\n## Unreleased\n\n## 1.2.2 (2026-10-01)\n") is None


def _repo(path):
    def git(*args):
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    return git


def _release(path, git, version, heading=None):
    os.makedirs(path / "common", exist_ok=True)
    (path / "common" / "version.py").write_text(f'"""The release."""\n\nVERSION = "{version}"\n')
    (path / "CHANGELOG.md").write_text(f"# Changelog\n\n## {heading or f'{version} (2026-11-28)'}\n\n- a change\n")
    git("add", "-A")
    git("commit", "-q", "-m", f"Release {version}\n\nThe release.")


@pytest.mark.slow
def test_tagging_a_release_and_checking_every_tag(tmp_path, capsys):
    git = _repo(tmp_path)
    _release(tmp_path, git, "0.1.0")
    assert tag_head(str(tmp_path)) == "v0.1.0"
    assert tag_problems(str(tmp_path)) == []
    with pytest.raises(ReleaseError, match="v0.1.0 exists already"):
        tag_head(str(tmp_path))
    # The next version in the files, its changelog still "Unreleased": not taggable.
    _release(tmp_path, git, "0.2.0", heading="Unreleased")
    with pytest.raises(ReleaseError, match=r"says 0\.2\.0 but CHANGELOG\.md's newest heading is not a release"):
        tag_head(str(tmp_path))
    # Positive control: tags on the wrong commit, or not of the form vX.Y.Z, are reported.
    git("tag", "v0.2.0")
    git("tag", "v1")
    assert tag_problems(str(tmp_path)) == [
        "v0.2.0: CHANGELOG.md's newest heading there is not a release",
        "v1: not a release tag (vX.Y.Z)",
    ]
    assert main(["check", "--repo", str(tmp_path)]) == 1
    assert capsys.readouterr().err.splitlines()[0] == (
        "release_tag: v0.2.0: CHANGELOG.md's newest heading there is not a release"
    )


@pytest.mark.slow
def test_this_repositorys_release_tags_match_their_files():
    assert tag_problems(REPO) == []
