"""An image folder's ``--metadata FILE``: a CSV, JSON lines or Parquet table with a ``path``
column (relative to SRC, ``/`` between folders) whose every other column is a field of the
image it names; and :class:`FieldTable`, where a folder's scan leaves each sample's field
values (the metadata's canonical bytes, which sidecars it has) for the workers.

Kinds: a Parquet column's from its Arrow type (:mod:`convert.sources.parquet_columns`); a
JSON lines column's from its values (strings text, integers and booleans int, numbers with
a fraction float, even beside integers; lists and objects json); a CSV column's from its
text: int if every non-empty cell is an integer, else float if every one is a number, else
text. An empty CSV cell, a JSON ``null`` or an absent key, a Parquet null: missing (read
back as None), as is every field of an image no row names. A row naming no image is a
problem (``errors.jsonl``, or the error under ``--on-error fail``) naming the file and the
row; a path named twice, a column whose values mix kinds (both named) or a file without a
``path`` column is an error before anything is written.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from convert.sources.base import kind_clash
from convert.sources.files import Spans
from readers.fields import FieldSpec, encode

__all__ = ["PATH_COLUMN", "FieldTable", "Metadata"]

PATH_COLUMN = "path"
_INT = re.compile(r"\s*[-+]?\d+\s*")
_PARQUET_SUFFIXES = (".parquet", ".pq")
_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
_ONE_A_LINE = " (JSON lines: one object a line, with its 'path')"


@dataclass(frozen=True)
class Metadata:
    """The rows of a ``--metadata`` file: each row's path (normalised), its line or row
    number for messages, and each field's canonical values (schema order, None: missing)."""

    file: str
    paths: list[str]
    places: list[str]  # "line 3" / "row 2": how messages name each row
    fields: dict[str, FieldSpec]
    values: dict[str, list[bytes | None]]

    @classmethod
    def read(cls, file: str | os.PathLike[str]) -> Metadata:
        """The table of ``file``, by its suffix (``.parquet``, ``.jsonl``/``.json``, else
        CSV); ValueError naming the file for what it cannot hold."""
        path = Path(file)
        name = path.name.lower()
        if name.endswith(_PARQUET_SUFFIXES):
            return _parquet(path)
        if name.endswith(_JSONL_SUFFIXES):
            return _json_lines(path)
        return _csv(path)

    def rows_by_path(self) -> dict[str, int]:
        """Row number of each path; a path named twice is a ValueError naming both rows."""
        rows: dict[str, int] = {}
        for at, path in enumerate(self.paths):
            first = rows.setdefault(path, at)
            if first != at:
                raise ValueError(
                    f"{self.file}: {self.places[at]}: path {path!r} is named again (first "
                    f"at {self.places[first]}): keep one row per image"
                )
        return rows


def normal_path(path: str) -> str:
    """A relative path as the folder scan gives it (``os.sep``, no ``./``), to match on."""
    return os.path.normpath(path.replace("\\", "/")).replace("/", os.sep)


def _csv(path: Path) -> Metadata:
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if not header:
            raise ValueError(f"{path}: empty metadata file (a header row with 'path' first)")
        columns = _columns(path, header)
        paths, places, cells = [], [], []
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue  # a blank line
            if len(row) != len(header):
                raise ValueError(
                    f"{path}: line {reader.line_num}: {len(row)} cells, the header has "
                    f"{len(header)}"
                )
            places.append(f"line {reader.line_num}")
            paths.append(_row_path(path, places[-1], row[columns[PATH_COLUMN]]))
            cells.append(row)
    fields, values = {}, {}
    for name, at in columns.items():
        if name == PATH_COLUMN:
            continue
        column = [row[at] if row[at] != "" else None for row in cells]
        kind = _csv_kind(column)
        fields[name] = FieldSpec(kind)
        values[name] = [
            None if cell is None else encode(kind, _parse(kind, cell), f"{path}: {place}")
            for cell, place in zip(column, places, strict=True)
        ]
    return Metadata(str(path), paths, places, fields, values)


def _csv_kind(cells: Iterable[str | None]) -> str:
    """int if every non-empty cell is an integer, float if every one is a number, text."""
    present = [c for c in cells if c is not None]
    if present and all(_INT.fullmatch(c) for c in present):
        return "int"
    try:
        if present:
            [float(c) for c in present]
            return "float"
    except ValueError:
        pass
    return "text"


def _parse(kind: str, cell: str) -> Any:
    return int(cell) if kind == "int" else float(cell) if kind == "float" else cell


def _json_lines(path: Path) -> Metadata:
    paths, places = [], []
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            place = f"line {number}"
            try:
                row = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}: {place}: not a JSON object: {e}{_ONE_A_LINE}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}: {place}: not a JSON object{_ONE_A_LINE}")
            places.append(place)
            paths.append(_row_path(path, place, row.get(PATH_COLUMN)))
            rows.append(row)
    names = sorted({name for row in rows for name in row} - {PATH_COLUMN})
    fields, values = {}, {}
    for name in names:
        kinds = [_json_kind(row.get(name)) for row in rows]
        found = {k for k in kinds if k is not None}
        if found == {"int", "float"}:
            found = {"float"}  # 1 and 1.5 in one column: numbers
        if len(found) > 1:
            first = next(k for k in kinds if k is not None)
            other = next(k for k in kinds if k is not None and k != first)
            raise kind_clash(str(path), name, first, other)
        kind = found.pop() if found else "json"
        fields[name] = FieldSpec(kind)
        values[name] = [
            encode(kind, row.get(name), f"{path}: {place}: {name}")
            for row, place in zip(rows, places, strict=True)
        ]
    return Metadata(str(path), paths, places, fields, values)


def _json_kind(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return "text"
    if isinstance(value, bool | int):
        return "int"
    if isinstance(value, float):
        return "float"
    return "json"


def _parquet(path: Path) -> Metadata:
    from convert.sources.parquet import PARQUET_HINT
    from convert.sources.parquet_columns import canonical_column, field_kind

    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{path}: {PARQUET_HINT}") from None
    table = pq.read_table(path)
    if PATH_COLUMN not in table.column_names:
        raise ValueError(_no_path(path, table.column_names))
    places = [f"row {n}" for n in range(table.num_rows)]
    paths = [
        _row_path(path, place, value)
        for place, value in zip(places, table.column(PATH_COLUMN).to_pylist(), strict=True)
    ]
    fields, values = {}, {}
    for name in table.column_names:
        if name == PATH_COLUMN:
            continue
        column = table.column(name).combine_chunks()
        fields[name] = FieldSpec(field_kind(column.type))
        values[name] = canonical_column(column, fields[name].kind, f"{path}: {name}")
    return Metadata(str(path), paths, places, fields, values)


def _columns(path: Path, header: Sequence[str]) -> dict[str, int]:
    """Position of each column by name; no ``path`` column, or a name twice: ValueError."""
    columns: dict[str, int] = {}
    for at, name in enumerate(header):
        name = name.strip()
        if name in columns:
            raise ValueError(f"{path}: column {name!r} appears twice in the header")
        columns[name] = at
    if PATH_COLUMN not in columns:
        raise ValueError(_no_path(path, list(columns)))
    return columns


def _no_path(path: Path, columns: Sequence[str]) -> str:
    return (
        f"{path}: no {PATH_COLUMN!r} column (columns: {', '.join(columns) or 'none'}): name "
        "each image by its path relative to SRC in a 'path' column"
    )


def _row_path(path: Path, place: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{path}: {place}: no {PATH_COLUMN!r} (the image's path below SRC)")
    return normal_path(value.strip())


@dataclass(frozen=True)
class FieldTable:
    """Each folder sample's fields, by its position in the scan: an ``int64 [N, 2F]``
    table of (offset, length; -1: missing) per field in schema order. A metadata field's
    bytes lie in ``values`` at that offset; a sidecar field (``sidecars``: its extension by
    schema position) is read from its file by the worker, length 0 meaning "it exists"."""

    spans: Spans
    values: str  # the staged canonical bytes of the metadata fields
    sidecars: tuple[tuple[int, str, str], ...]  # (schema position, extension, kind)

    @classmethod
    def write(
        cls,
        rows: np.ndarray,
        chunks: Iterable[bytes],
        sidecars: Sequence[tuple[int, str, str]],
        owner: object,
    ) -> FieldTable:
        """The table ``rows`` and the metadata bytes ``chunks`` (in offset order), staged
        beside each other in a temporary folder removed once ``owner`` is gone."""
        spans = Spans.write(rows, owner)
        values = os.path.join(os.path.dirname(spans.path), "values.bin")
        with open(values, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        return cls(spans, values, tuple(sidecars))

    def metadata(self, positions: Sequence[int]) -> list[list[bytes | None]]:
        """The staged values of the samples at ``positions`` (sidecar fields: None)."""
        rows = self.spans.rows()
        sidecar = {at for at, _, _ in self.sidecars}
        out = []
        fd = os.open(self.values, os.O_RDONLY)
        try:
            for p in positions:
                row = rows[p]
                out.append(
                    [
                        None
                        if f in sidecar or row[2 * f + 1] < 0
                        else os.pread(fd, int(row[2 * f + 1]), int(row[2 * f]))
                        for f in range(len(row) // 2)
                    ]
                )
        finally:
            os.close(fd)
        return out

    def has(self, position: int, field: int) -> bool:
        """True if the sample at ``position`` has field number ``field``."""
        return bool(self.spans.rows()[position, 2 * field + 1] >= 0)
