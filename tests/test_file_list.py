"""A source given as a list of its files (``--file-list``): exactly the listed files, in the
list's order, with its labels; SRC is not walked (files it does not list are not looked
for); a listed file that is missing is a bad file; bad rows are refused naming the line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import readers
from convert import BadInputError, ConvertOptions, convert_folder
from convert.cli import main
from tests.conftest import SAMPLE_DATA

LISTED = [  # not in walk order, classes named otherwise than the folders
    ("space/rocket_01.jpg", "vehicle"),
    ("nature/chelsea_00.jpg", "animal"),
    ("people/astronaut_02.jpg", "person"),
    ("nature/chelsea_03.png", "animal"),
]


def _write(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def _convert(src: Path, listed: Path, dst: Path, **kw) -> Path:
    options = ConvertOptions(format="wds", encoding="jpeg", resize=64, file_list=str(listed))
    convert_folder(src, dst, options, workers=1, progress=False, **kw)
    return dst


def test_a_file_list_is_the_source_in_its_order_with_its_labels(tmp_path: Path) -> None:
    listed = _write(tmp_path / "list.tsv", ["path\tlabel", *(f"{p}\t{c}" for p, c in LISTED)])
    dst = _convert(SAMPLE_DATA, listed, tmp_path / "dst")
    ds = readers.open_dataset(dst)
    assert ds.classes == ["animal", "person", "vehicle"]
    assert [ds.source_path(i) for i in range(len(ds))] == [p for p, _ in LISTED]
    assert [ds.classes[t] for t in ds.targets] == [c for _, c in LISTED]
    manifest = json.loads((dst / "imgpack.json").read_text())
    assert manifest["skipped"] == 0  # the 28 files it does not list: not looked for
    assert not (dst / "errors.jsonl").exists()


def test_a_one_column_list_is_unlabeled_and_a_missing_file_is_a_bad_file(
    tmp_path: Path,
) -> None:
    src = tmp_path / "src"
    shutil.copytree(SAMPLE_DATA, src)
    (src / "people" / "astronaut_02.jpg").unlink()  # listed, gone since
    listed = _write(tmp_path / "list.csv", [p for p, _ in LISTED])
    dst = _convert(src, listed, tmp_path / "dst")
    ds = readers.open_dataset(dst)
    assert ds.classes == [] and set(ds.targets) == {-1} and len(ds) == 3
    errors = [json.loads(line) for line in (dst / "errors.jsonl").read_text().splitlines()]
    assert [e["path"] for e in errors] == ["people/astronaut_02.jpg"]
    assert "cannot read" in errors[0]["error"]
    with pytest.raises(BadInputError, match=r"astronaut_02\.jpg"):
        _convert(src, listed, tmp_path / "failed", on_error="fail")


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["a.jpg,x", "b.jpg"], r"list\.csv:2: expected relative_path,label_name"),
        (["a.jpg", "../outside.jpg"], r"list\.csv:2: '../outside.jpg' is not a path inside SRC"),
        (["a.jpg,x", "/abs.jpg,x"], r"list\.csv:2: '/abs.jpg' is not a path inside SRC"),
        (["a.jpg", "b.jpg", "./a.jpg"], r"list\.csv: 'a.jpg' is listed twice"),
        (["path"], r"list\.csv: lists no file"),
    ],
    ids=["shape", "parent", "absolute", "twice", "empty"],
)
def test_a_bad_file_list_is_refused_naming_the_line(
    tmp_path: Path, rows: list[str], message: str
) -> None:
    listed = _write(tmp_path / "list.csv", rows)
    with pytest.raises(ValueError, match=message):
        _convert(SAMPLE_DATA, listed, tmp_path / "dst")
    assert not (tmp_path / "dst").exists()


def test_cli_file_list_excludes_labels(tmp_path: Path) -> None:
    listed = _write(tmp_path / "list.csv", [p for p, _ in LISTED])
    args = ["convert", str(SAMPLE_DATA), str(tmp_path / "dst"), "--format", "wds"]
    result = CliRunner().invoke(main, [*args, "--file-list", str(listed), "--labels", str(listed)])
    assert result.exit_code == 1
    assert "--file-list names the files and their labels" in result.output
    done = CliRunner().invoke(main, [*args, "--file-list", str(listed)])
    assert done.exit_code == 0, done.output
    assert len(readers.open_dataset(tmp_path / "dst")) == len(LISTED)
