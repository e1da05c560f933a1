"""Every relative link in README.md, docs/*.md and experiments/README.md points to a file or folder that exists."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "experiments" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"(?s)```.*?```", "", page.read_text())  # code blocks hold no links
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(page):
    links = relative_links(page)
    missing = [t for t in links if not (page.parent / t.split("#")[0]).exists()]
    assert not missing, f"{page.relative_to(REPO)} links to missing files: {missing}"


def test_the_pages_have_links():
    assert len(relative_links(REPO / "README.md")) >= 10  # the check above reads links, not nothing
