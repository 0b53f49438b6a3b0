"""docs/BENCHMARKS.md's tables are what scripts/bench/doc_tables.py renders from docs/results/."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from scripts.bench import doc_tables


def test_benchmarks_doc_matches_its_results() -> None:
    doc = doc_tables.DOC.read_text()
    assert doc_tables.render_doc(doc, doc_tables.load_results()) == doc, (
        "docs/BENCHMARKS.md differs from docs/results/: run "
        "python -m scripts.bench.doc_tables --write"
    )


def test_benchmarks_doc_stays_under_400_lines() -> None:
    assert len(doc_tables.DOC.read_text().splitlines()) <= 400


def test_a_changed_result_changes_the_rendered_doc(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    shutil.copytree(doc_tables.RESULTS, folder)
    path = folder / "plain-read.json"
    result = json.loads(path.read_text())
    result["tables"][0]["rows"][0][1] += 1
    path.write_text(json.dumps(result))
    doc = doc_tables.DOC.read_text()
    assert doc_tables.render_doc(doc, doc_tables.load_results(folder)) != doc


def test_a_result_without_its_block_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    shutil.copytree(doc_tables.RESULTS, folder)
    shutil.copy(folder / "decode.json", folder / "decode-again.json")
    with pytest.raises(ValueError, match="no block for \\['decode-again'\\]"):
        doc_tables.render_doc(doc_tables.DOC.read_text(), doc_tables.load_results(folder))


def test_a_result_missing_its_provenance_is_refused(tmp_path: Path) -> None:
    result = json.loads((doc_tables.RESULTS / "decode.json").read_text())
    del result["commit"]
    (tmp_path / "decode.json").write_text(json.dumps(result))
    with pytest.raises(ValueError, match=r"decode\.json: missing commit"):
        doc_tables.load_results(tmp_path)
