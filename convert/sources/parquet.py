"""Parquet files in the Hugging Face ``datasets`` image layout (how most image datasets on the
Hub are shipped) as a sample source, read with pyarrow (``pip install -e '.[parquet]'``).

The image column holds ``{bytes, path}`` structs (the ``datasets.Image`` feature) or plain
bytes; a row with a path and no bytes is read from that file, a relative path from the
Parquet file's folder. The label column holds one class number or name a row. Which
column is which comes from the ``huggingface`` schema metadata when present (an ``Image``
feature; a ``ClassLabel`` feature, whose ``names`` are the class names), else from the
types (the first struct or binary column; a column named ``label``/``labels``), or
``--label-key`` names the label column. Several label columns are refused until
``--label-key`` picks one, as are a multi-label column (``Sequence(ClassLabel)``) and one of
floats as the label. Every other column is a field (kinds:
:mod:`convert.sources.parquet_columns`), read column-wise by the workers with the images.
A Hub download holds several splits: :mod:`convert.sources.hub_layout` keeps one.

The scan reads only the labels and the images' paths; a worker reads the image column one
row group at a time and keeps the last ones it read (:data:`ROW_GROUPS`), so a shuffled
conversion reads each row group about once per worker, not once per sample. A shuffled
conversion of more than :data:`STAGE_ABOVE` bytes of Parquet (more than a worker keeps)
would still read about a row group a sample: its scan reads the image column too, once, in
order, and stages the bytes in a temporary file per Parquet file (``TMPDIR`` says where;
as many bytes as the images; removed with the source), which the workers read by offset,
as a compressed tar's staged images (:class:`convert.sources.tar_members.Staging`).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from convert.options import ConvertOptions
from convert.samples import Sample, SampleTable
from convert.scan import Scan
from convert.sources.base import (
    Stored,
    WithFields,
    kind_clash,
    position,
    refuse_folder_options,
    select_fields,
)
from convert.sources.files import FileSource, Spans, listed_folder, open_file
from convert.sources.hub_layout import split_files
from convert.sources.labels import Labels
from convert.sources.parquet_columns import Columns, canonical_column
from convert.sources.tar_members import Staging
from convert.sources.webdataset import TarReader
from readers.fields import FieldSpec
from readers.storage.remote import is_url

__all__ = [
    "PARQUET_HINT",
    "ROW_GROUPS",
    "STAGE_ABOVE",
    "ParquetReader",
    "ParquetSource",
    "RowGroups",
]

PARQUET_HINT = "reading Parquet needs pyarrow: pip install -e '.[parquet]' in the checkout"


def _parquet(where: str) -> Any:
    """``pyarrow.parquet``, or a ValueError saying how to install it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{where}: {PARQUET_HINT}") from None
    return pq


@dataclass(frozen=True)
class GroupImages:
    """One row group's image column: each row's bytes, and its path where one is kept; and
    each field column's canonical bytes, row by row (None: null)."""

    data: Any  # a pyarrow binary array, or None: a group read for its fields only
    paths: Any  # a pyarrow string array, or None
    fields: tuple[list[bytes | None], ...] = ()

    @property
    def nbytes(self) -> int:
        held = sum(len(v or b"") + 8 for column in self.fields for v in column)
        images = self.data.nbytes if self.data is not None else 0
        return int(images + (self.paths.nbytes if self.paths is not None else 0) + held)

    @classmethod
    def of(cls, column: Any, is_struct: bool) -> GroupImages:
        """The images of an image column read from one row group (a pyarrow array)."""
        if not is_struct:
            return cls(column, None)
        paths = column.field("path") if column.type.get_field_index("path") >= 0 else None
        return cls(column.field("bytes"), paths)

    def with_fields(self, table: Any, fields: Sequence[tuple[str, FieldSpec]], where: str) -> Any:
        """These images and the ``fields`` columns of ``table`` (one row group), canonical."""
        values = tuple(
            canonical_column(table.column(name).combine_chunks(), spec.kind, f"{where}: {name}")
            for name, spec in fields
        )
        return GroupImages(self.data, self.paths, values)

    def field_values(self, row: int) -> tuple[bytes | None, ...]:
        return tuple(column[row] for column in self.fields)

    def row(self, row: int) -> tuple[bytes | None, str | None]:
        path = self.paths[row].as_py() if self.paths is not None else None
        return self.data[row].as_py(), path


class RowGroups:
    """The row groups a process read last, up to ``budget`` bytes, the least recently used
    dropped first. ``reads`` counts the row groups read from their files."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.reads = 0
        self._kept: OrderedDict[tuple[Any, ...], GroupImages] = OrderedDict()
        self._bytes = 0

    def get(self, key: tuple[Any, ...], load: Callable[[], GroupImages]) -> GroupImages:
        """The row group ``key`` names, read by ``load`` unless kept."""
        images = self._kept.get(key)
        if images is not None:
            self._kept.move_to_end(key)
            return images
        images = load()
        self.reads += 1
        self._kept[key] = images
        self._bytes += images.nbytes
        while self._bytes > self.budget and len(self._kept) > 1:
            _, dropped = self._kept.popitem(last=False)
            self._bytes -= dropped.nbytes
        return images

    def read_through(self, load: Callable[[], Any]) -> Any:
        """A row group read by ``load`` and not kept: the staging scan reads each once."""
        self.reads += 1
        return load()


ROW_GROUPS = RowGroups(256 << 20)
"""This process's row groups: a worker's, or the caller's (``inspect``)."""

STAGE_ABOVE = ROW_GROUPS.budget
"""A shuffled conversion of more Parquet bytes than this stages its images (read by each
scan: a test sets it low)."""


@dataclass(frozen=True)
class ParquetReader:
    """Reads each sample's image bytes from its file's row group, or from the staged
    images by offset (a row without bytes, from its row group still)."""

    files: tuple[str, ...]
    spans: Spans  # rows: (file number, row group, row within the group)
    columns: Columns
    staged: TarReader | None = None  # rows: (file number, offset, length) in its staged file
    fields: tuple[tuple[str, FieldSpec], ...] = ()  # the columns stored, schema order

    def read(self, samples: Sequence[Sample]) -> list[Stored]:
        out: list[Stored] = [""] * len(samples)
        unstaged: Sequence[int] = range(len(samples))
        if self.staged is not None:
            out = self.staged.read(samples)
            lengths = self.staged.spans.rows()[:, 2]
            unstaged = [k for k, s in enumerate(samples) if lengths[position(s)] == 0]
        places: dict[int, tuple[int, ...]] = {}
        if unstaged or (self.staged is not None and self.fields):
            rows = self.spans.rows()  # mapped only now (a process maps one table at a time)
            places = {k: tuple(int(x) for x in rows[position(s)]) for k, s in enumerate(samples)}
        if self.staged is not None and self.fields:  # staged images, fields from row groups
            for at in sorted(set(places) - set(unstaged), key=places.__getitem__):
                out[at] = self._staged_fields(samples[at].relpath, out[at], *places[at])
        for at in sorted(unstaged, key=places.__getitem__):  # a group at a time
            file, group, row = places[at]
            out[at] = self._one(samples[at].relpath, file, group, row)
        return out

    def _staged_fields(self, name: str, image: Stored, file: int, group: int, row: int) -> Stored:
        """A staged image with its fields, read from its row group (kept: fields only)."""
        if not isinstance(image, bytes):
            return image
        where = self.files[file]
        try:
            held = ROW_GROUPS.get(
                (self.spans.path, where, group, "fields"),
                lambda: self._load(where, group, images=False),
            )
        except (OSError, ValueError) as e:
            return f"{name}: cannot read its fields from {where}: {e}"
        return WithFields(image, held.field_values(row))

    def _one(self, name: str, file: int, group: int, row: int) -> Stored:
        where = self.files[file]
        try:
            images = ROW_GROUPS.get(
                (self.spans.path, where, group), lambda: self._load(where, group)
            )
            data, path = images.row(row)
            if not data and not path:
                return f"{name}: no image bytes"
            image = data if data else _read_path(where, path, name)  # type: ignore[arg-type]
        except (OSError, ValueError) as e:
            return f"{name}: cannot read from {where}: {e}"
        if not self.fields or not isinstance(image, bytes):
            return image
        return WithFields(image, images.field_values(row))

    def _load(self, where: str, group: int, images: bool = True) -> GroupImages:
        """Row group ``group``'s images (unless not ``images``) and stored fields."""
        pq = _parquet(where)
        read = [self.columns.image] if images else []
        read += [name for name, _ in self.fields]
        with open_file(where) as f:
            table = pq.ParquetFile(f).read_row_group(group, columns=read)
        found = GroupImages(None, None)
        if images:
            column = table.column(0).combine_chunks()
            found = GroupImages.of(column, self.columns.image_is_struct)
        return found.with_fields(table, self.fields, where) if self.fields else found


def _read_path(parquet: str, path: str, name: str) -> Stored:
    """The image a row names by ``path`` only, relative to the Parquet file's folder."""
    if is_url(path) or os.path.isabs(path):
        resolved = path
    elif is_url(parquet):
        resolved = f"{parquet.rpartition('/')[0]}/{path}"
    else:
        resolved = os.path.join(os.path.dirname(parquet), path)
    try:
        with open_file(resolved) as f:
            return f.read()
    except FileNotFoundError:
        return (
            f"{name}: {parquet} holds no image bytes for it, only the path {path!r}, and "
            f"there is no file {resolved}"
        )


class ParquetSource(FileSource):
    """The ``.parquet`` files ``src`` names (a file, a folder, a glob, a brace pattern,
    local or at a URL), of one split; see the module docstring."""

    kind = "parquet"
    suffix = ".parquet"
    _reader: ParquetReader | None = None

    def __init__(self, src: str, label_key: str | None = None, split: str | None = None) -> None:
        super().__init__(src, label_key)
        self.split = split
        self.files = tuple(split_files(self.where, self.files, split, listed_folder(src)))

    def scan(self, options: ConvertOptions) -> Scan:
        """Every row, in file order: its image's path (``file#row`` without one) and label;
        the images staged too for a large shuffled conversion (see the module docstring)."""
        refuse_folder_options(self.where, options)
        pq = _parquet(self.where)
        import pyarrow as pa

        columns: Columns | None = None
        labels: Labels | None = None
        spans: list[tuple[int, int, int]] = []
        staged_spans: list[tuple[int, int, int]] = []
        paths: list[str] = []
        staging = Staging(self) if options.shuffle and self._above(STAGE_ABOVE) else None
        for number, path in enumerate(self.files):
            try:
                with open_file(path) as f, self._staged(staging, number, path) as staged:
                    pf = pq.ParquetFile(f)
                    found = Columns.of(path, pf.schema_arrow, self.label_key)
                    if columns is None:
                        columns = found
                        wanted = options.classes or found.class_names
                        labels = Labels(self.where, found.label or "label", wanted)
                    elif found != columns:
                        _check_fields(path, columns, found)
                        raise ValueError(f"{path}: its columns differ from {self.files[0]}'s")
                    for at, (group, row, name, value, held) in enumerate(
                        _rows(pf, columns, staged)
                    ):
                        shown = name or f"{Path(path).name}#{at}"
                        paths.append(shown)
                        spans.append((number, group, row))
                        staged_spans.append((number, *held))
                        labels.add(shown, value)
            except pa.ArrowException as e:
                raise ValueError(f"{path}: not a readable Parquet file: {e}") from e
        if columns is None or labels is None or not spans:
            raise FileNotFoundError(f"{self.where}: no rows")
        staged_reader = None
        if staging is not None:
            read_from = tuple(staging.read_from(f) for f in self.files)
            staged_reader = TarReader(read_from, Spans.write(np.array(staged_spans), self))
        spans_table = Spans.write(np.array(spans), self)
        found = dict(columns.fields)
        origins = {name: f"{self.files[0]}: column" for name in found}
        fields = select_fields(self.where, found, options, origins)
        self._reader = ParquetReader(
            self.files, spans_table, columns, staged_reader, tuple(fields.items())
        )
        classes, numbers, left_out = labels.resolve()
        samples = SampleTable.of(
            Sample(path, label, index)
            for index, (path, label) in enumerate(zip(paths, numbers, strict=True))
            if label is not None
        )
        return Scan(classes, samples, left_out, fields=fields)

    def _above(self, budget: int) -> bool:
        """True if the Parquet files hold more than ``budget`` bytes (about the images')."""
        return self.stored_bytes(None) > budget

    @staticmethod
    def _staged(staging: Staging | None, number: int, path: str) -> Any:
        """The staged file of Parquet file ``number``, open for writing, or a null context."""
        return open(staging.file_for(number, path), "wb") if staging else nullcontext()

    def reader(self) -> ParquetReader:
        if self._reader is None:
            raise RuntimeError("ParquetSource.reader before scan")
        return self._reader

    def record(self) -> dict[str, object]:
        split = {"split": self.split} if self.split else {}
        return {**super().record(), **split}


def _check_fields(path: str, first: Columns, found: Columns) -> None:
    """A field column whose kind in ``path`` differs from the first file's: named."""
    kinds = {name: spec.kind for name, spec in first.fields}
    for name, spec in found.fields:
        if name in kinds and kinds[name] != spec.kind:
            raise kind_clash(path, name, kinds[name], spec.kind)


def _rows(
    pf: Any, columns: Columns, staged: BinaryIO | None
) -> Iterator[tuple[int, int, str | None, Any, tuple[int, int]]]:
    """``(row group, row in it, image path or None, label or None, (offset, length) of its
    bytes in ``staged``)`` of each row of ``pf``, reading only the paths and labels unless
    the image bytes are staged (a row without them: length 0)."""
    if staged is not None:
        read = [columns.image]
    else:
        read = [f"{columns.image}.path"] if columns.image_is_struct else []
    read += [columns.label] if columns.label else []
    for group in range(pf.metadata.num_row_groups):
        size = pf.metadata.row_group(group).num_rows
        table = None
        if staged is not None:
            table = ROW_GROUPS.read_through(lambda g=group: pf.read_row_group(g, columns=read))
        elif read:
            table = pf.read_row_group(group, columns=read)
        names: list[Any] = [None] * size
        held = [(0, 0)] * size
        if table is not None and staged is not None:
            images = GroupImages.of(table.column(0).combine_chunks(), columns.image_is_struct)
            names = images.paths.to_pylist() if images.paths is not None else names
            held = [_stage(staged, images.data[row].as_py()) for row in range(size)]
        elif table is not None and columns.image_is_struct:
            names = [v.get("path") if v else None for v in table.column(columns.image).to_pylist()]
        values = (
            table.column(columns.label).to_pylist()
            if table is not None and columns.label
            else [None] * size
        )
        for row in range(size):
            yield group, row, names[row], values[row], held[row]


def _stage(staged: BinaryIO, data: bytes | None) -> tuple[int, int]:
    """``(offset, length)`` of ``data`` once written to ``staged``."""
    offset = staged.tell()
    staged.write(data or b"")
    return offset, len(data or b"")
