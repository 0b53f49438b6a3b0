"""Every relative link and anchor in README.md, CHANGELOG.md, CONTRIBUTING.md and docs/ resolves."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    ROOT / "CONTRIBUTING.md",
    *(ROOT / "docs").glob("*.md"),
]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def anchors(path: Path) -> set[str]:
    """GitHub's heading slugs: lower case, punctuation dropped, spaces to hyphens."""
    slugs: set[str] = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
            slugs.add(slug)
    return slugs


def broken_links(path: Path) -> list[str]:
    """Each link of ``path`` whose file or anchor does not exist."""
    broken = []
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        missing_anchor = anchor and linked.suffix == ".md" and anchor not in anchors(linked)
        if not linked.exists() or missing_anchor:
            broken.append(target)
    return broken


def test_every_relative_link_and_anchor_resolves() -> None:
    found = {path.relative_to(ROOT).as_posix(): broken_links(path) for path in DOCS}
    assert {name: links for name, links in found.items() if links} == {}
