"""Every relative link in README.md and docs/*.md points at a file that exists, and
every `#anchor` at a heading of the page it names (GitHub's heading slugs)."""

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _prose(markdown: str) -> str:
    """The page without fenced code blocks (their brackets are not links)."""
    return FENCE.sub("", markdown)


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation other
    than `-` and `_` dropped, spaces to `-`, repeats suffixed `-1`, `-2`, ...

    Example: ``heading_anchors("## `--mode` and more")`` is ``{"--mode-and-more"}``.
    """
    anchors: set[str] = set()
    for title in HEADING.findall(_prose(markdown)):
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in anchors:
            n += 1
            candidate = f"{slug}-{n}"
        anchors.add(candidate)
    return anchors


def relative_links(page: Path) -> Iterator[tuple[str, Path, str]]:
    """(link as written, target file, anchor or "") of every relative link on ``page``."""
    text = CODE_SPAN.sub("", _prose(page.read_text()))
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        yield target, (page.parent / path).resolve() if path else page, anchor


def broken_links() -> list[str]:
    broken = []
    for page in PAGES:
        for target, file, anchor in relative_links(page):
            where = f"{page.relative_to(REPO)}: ({target})"
            if not file.exists():
                broken.append(f"{where}: no file {file}")
            elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file.read_text()):
                broken.append(f"{where}: no heading with the anchor #{anchor} in {file.name}")
    return broken


def test_pages_exist():
    names = {page.name for page in PAGES}
    assert {
        "README.md",
        "data.md",
        "training.md",
        "sharding_plans.md",
        "checkpoints.md",
        "launching.md",
        "serving.md",
        "benchmarks.md",
        "tests.md",
    } <= names


def test_every_relative_link_resolves():
    assert broken_links() == []


@pytest.mark.parametrize(
    "markdown, anchors",
    [
        ("# Data\n## The `--mode inference_benchmark` flag\n", {"data", "the---mode-inference_benchmark-flag"}),
        ("## Presets\n## Presets\n", {"presets", "presets-1"}),
        ("## Sweeps: many configurations, one table\n", {"sweeps-many-configurations-one-table"}),
        ("```\n# not a heading\n```\n## Real\n", {"real"}),
    ],
)
def test_heading_anchors(markdown, anchors):
    assert heading_anchors(markdown) == anchors


def test_a_missing_file_and_anchor_are_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n[ok](#page) [gone](missing.md) [bad](#nowhere) `[code](x.md)` "
        "[web](https://example.com)\n```\n[fenced](y.md)\n```\n"
    )
    links = list(relative_links(page))
    assert [(t, f.name, a) for t, f, a in links] == [
        ("#page", "page.md", "page"),
        ("missing.md", "missing.md", ""),
        ("#nowhere", "page.md", "nowhere"),
    ]
