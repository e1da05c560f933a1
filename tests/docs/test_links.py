"""Every relative link in README.md, docs/*.md and the experiments' READMEs points to a file or folder that exists,
and a link to a heading (`page.md#heading`, `#heading`) to a heading that page has (GitHub's anchors)."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "experiments").glob("**/README.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def prose(page: Path) -> str:
    return re.sub(r"(?ms)^```.*?^```", "", page.read_text())  # code blocks hold no links and no headings


def relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page)) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def anchors(page: Path) -> set[str]:
    """GitHub's anchor of each heading: lower case, punctuation dropped, spaces as hyphens."""
    heads = re.findall(r"(?m)^#+ (.*)$", prose(page))
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def broken(page: Path, link: str) -> bool:
    path, _, anchor = link.partition("#")
    target = (page.parent / path) if path else page
    if not target.exists():
        return True
    return bool(anchor) and target.suffix == ".md" and anchor not in anchors(target)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(page):
    missing = [link for link in relative_links(page) if broken(page, link)]
    assert not missing, f"{page.relative_to(REPO)} links to missing files or headings: {missing}"


def test_the_check_reads_links_and_headings():
    readme = REPO / "README.md"
    assert len(relative_links(readme)) >= 10 and "two-commands" in anchors(readme)
    assert broken(readme, "docs/no_such_page.md") and broken(readme, "#no-such-heading")
    assert not broken(REPO / "docs" / "heads.md", "#every-head-hook-points-your-own-statistics-patching")
