"""Render docs/BENCHMARKS.md's result tables from the committed JSON in docs/results/.

Each ``docs/results/<name>.json`` is one measurement: when (``date``), on what code
(``commit``), where (``machine``), how (``command``), where the numbers come from
(``source``: a bench script's JSON, or the doc they were transcribed from) and its
``tables``; a ``summary`` (the Targets) has no one commit, each row naming its own. The doc
holds one block per file between ``<!-- results: <name> -->`` and
``<!-- /results: <name> -->``; everything outside the blocks is written by hand. To add a
result, commit its JSON and an empty pair of markers where it belongs, then run
``python -m scripts.bench.doc_tables --write``; ``tests/test_benchmarks_doc.py`` fails
while the doc and the JSON disagree.

A table is ``{"caption"?, "columns": [...], "decimals"?: {column: n}, "rows": [[...]]}``.
A cell is a number (an integer is written with thousands separators, a float with its
column's ``decimals``), a list of numbers (the rounds, joined by " / "), a string (as
written) or null (empty).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
DOC = ROOT / "docs" / "BENCHMARKS.md"
BLOCK = re.compile(
    r"(<!-- results: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /results: (?P=name) -->)",
    re.DOTALL,
)
REQUIRED = ("title", "date", "commit", "machine", "command", "source", "tables")
SUMMARY_REQUIRED = ("title", "date", "source", "tables")


def load_results(folder: Path = RESULTS) -> dict[str, dict]:
    """Every result file by name (its stem), each checked for the fields a block needs."""
    results = {}
    for path in sorted(folder.glob("*.json")):
        result = json.loads(path.read_text())
        required = SUMMARY_REQUIRED if result.get("summary") else REQUIRED
        missing = [key for key in required if key not in result]
        if missing:
            raise ValueError(f"{path}: missing {', '.join(missing)}")
        results[path.stem] = result
    return results


def cell_text(value: object, decimals: int | None) -> str:
    """One table cell as the doc writes it."""
    if value is None:
        return ""
    if isinstance(value, (bool, str)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{decimals}f}" if decimals is not None else repr(value)
    if isinstance(value, list):
        return " / ".join(cell_text(item, decimals) for item in value)
    raise ValueError(f"a table cell cannot be {type(value).__name__}: {value!r}")


def render_table(table: dict) -> list[str]:
    """A markdown table, its caption (if any) on the line above."""
    columns = table["columns"]
    decimals = table.get("decimals", {})
    lines = [table["caption"], ""] if table.get("caption") else []
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "---|" * len(columns))
    for row in table["rows"]:
        if len(row) != len(columns):
            raise ValueError(f"row {row!r} has {len(row)} cells for {len(columns)} columns")
        cells = [
            cell_text(value, decimals.get(column))
            for column, value in zip(columns, row, strict=True)
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_block(result: dict) -> str:
    """The text between a result's markers: one line of provenance, then the tables.

    A ``summary`` (the Targets) gathers figures measured at several commits: each row
    names its own, so its line says only where the rows come from.
    """
    if result.get("summary"):
        lines = [f"As of {result['date']}: {result['source']}."]
    else:
        commands = result["command"]
        command = commands if isinstance(commands, str) else "; ".join(commands)
        lines = [
            f"Measured {result['date']} at `{result['commit']}` on {result['machine']}: "
            f"`{command}`. Source: {result['source']}."
        ]
    for table in result["tables"]:
        lines += ["", *render_table(table)]
    return "\n".join(lines) + "\n"


def render_doc(doc: str, results: dict[str, dict]) -> str:
    """The doc with every block rendered; refuses a block without a file and vice versa."""
    names = [match["name"] for match in BLOCK.finditer(doc)]
    if len(names) != len(set(names)):
        raise ValueError(f"{DOC.name}: a results block appears twice in {names}")
    unplaced = sorted(set(results) - set(names))
    unknown = sorted(set(names) - set(results))
    if unplaced or unknown:
        raise ValueError(
            f"{DOC.name}: no block for {unplaced or 'none'}; no result file for {unknown or 'none'}"
        )
    return BLOCK.sub(lambda match: match[1] + render_block(results[match["name"]]) + match[4], doc)


def main(argv: list[str] | None = None) -> int:
    """Check (default) or ``--write`` docs/BENCHMARKS.md's tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the doc in place")
    args = parser.parse_args(argv)
    doc = DOC.read_text()
    rendered = render_doc(doc, load_results())
    if args.write:
        DOC.write_text(rendered)
        return 0
    if rendered != doc:
        print(f"{DOC} differs from docs/results/: run with --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
