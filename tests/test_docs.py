"""The install lines in the docs and messages work: imgpack is installed from a checkout,
never from a package index, and every extra they name exists."""

from __future__ import annotations

import configparser
import re

from tests.conftest import ROOT

TEXT_FILES = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    ROOT / "CHANGELOG.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "convert").rglob("*.py")),
    *sorted((ROOT / "readers").rglob("*.py")),
    *sorted((ROOT / "scripts").rglob("*.py")),
]


def _extras() -> set[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return set(config["options.extras_require"])


def test_no_install_line_asks_a_package_index_for_imgpack():
    wrong = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in TEXT_FILES
        # `pip install imgpack`, or an extra spelled as if it were published (`imgpack[s3]`,
        # also where a message splits the line across two string literals).
        for match in re.finditer(
            r"pip install (?:-\S+ )*['\"]?imgpack\b[^\s'\"`]*['\"]?|\bimgpack\[\w+\]",
            path.read_text(),
        )
    ]
    assert wrong == []


def test_every_extra_an_install_line_names_exists():
    named = {
        (path.relative_to(ROOT), extra)
        for path in TEXT_FILES
        for group in re.findall(r"pip install -e '?\.\[([\w,]+)\]", path.read_text())
        for extra in group.split(",")
    }
    assert named, "no install line with an extra found: the pattern is stale"
    assert {(str(p), e) for p, e in named if e not in _extras()} == set()
