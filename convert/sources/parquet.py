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
floats. A Hub download holds several splits: :mod:`convert.sources.hub_layout` keeps one.

The scan reads only the labels and the images' paths; a worker reads the image column one
row group at a time and keeps the last ones it read (:data:`ROW_GROUPS`), so a shuffled
conversion reads each row group about once per worker, not once per sample.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from convert.options import ConvertOptions
from convert.samples import Sample, SampleTable
from convert.scan import Scan
from convert.sources.base import Stored, position, refuse_folder_options
from convert.sources.files import FileSource, Spans, listed_folder, open_file
from convert.sources.hub_layout import split_files
from convert.sources.labels import Labels
from readers.storage.remote import is_url

__all__ = ["PARQUET_HINT", "ROW_GROUPS", "ParquetReader", "ParquetSource", "RowGroups"]

PARQUET_HINT = "reading Parquet needs pyarrow: pip install -e '.[parquet]' in the checkout"
_LABEL_NAMES = ("label", "labels")
_SEQUENCES = ("Sequence", "List", "LargeList")  # the features of a list, by datasets version


def _parquet(where: str) -> Any:
    """``pyarrow.parquet``, or a ValueError saying how to install it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{where}: {PARQUET_HINT}") from None
    return pq


@dataclass(frozen=True)
class Columns:
    """Which columns hold the images and the labels, and the class names the schema gives."""

    image: str
    image_is_struct: bool
    label: str | None
    class_names: tuple[str, ...] | None

    @classmethod
    def of(cls, where: str, schema: Any, label_key: str | None) -> Columns:
        import pyarrow as pa

        features = _features(schema)
        image = next((n for n, f in features.items() if _type(f) == "Image"), None)
        if image is None:
            image = next(
                (
                    f.name
                    for f in schema
                    if pa.types.is_binary(f.type)
                    or pa.types.is_large_binary(f.type)
                    or (pa.types.is_struct(f.type) and f.type.get_field_index("bytes") >= 0)
                ),
                None,
            )
        if image is None:
            raise ValueError(f"{where}: no image column (Image feature, {{bytes, path}} or bytes)")
        label = label_key or _label_column(where, features, schema.names)
        if label is not None:
            if label not in schema.names:
                raise ValueError(
                    f"{where}: no column {label!r} (columns: {', '.join(schema.names)})"
                )
            _check_label_type(where, label, schema.field(label).type)
        names = features.get(label, {}).get("names") if label else None
        is_struct = pa.types.is_struct(schema.field(image).type)
        return cls(image, is_struct, label, tuple(names) if names else None)


def _features(schema: Any) -> dict[str, Any]:
    """The ``datasets`` features the schema metadata records, or none."""
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        features = json.loads(raw)["info"]["features"] if raw else {}
    except (ValueError, KeyError, TypeError):
        return {}
    return features if isinstance(features, dict) else {}


def _type(feature: Any) -> str | None:
    """A feature's ``_type``: ``"[ClassLabel]"`` for a list of class labels (how each
    datasets version writes one: ``Sequence``/``List`` of it, or ``[it]``)."""
    if isinstance(feature, list) and len(feature) == 1:
        return f"[{_type(feature[0])}]"
    if not isinstance(feature, dict):
        return None
    if feature.get("_type") in _SEQUENCES:
        return f"[{_type(feature.get('feature'))}]"
    return feature.get("_type")


def _label_column(where: str, features: dict[str, Any], names: list[str]) -> str | None:
    """The label column the schema shows: its one ``ClassLabel`` (or list of them), else a
    column named ``label``/``labels``, else None; several are refused, never one taken."""
    found = [n for n, f in features.items() if _type(f) in ("ClassLabel", "[ClassLabel]")]
    if len(found) > 1:
        raise ValueError(
            f"{where}: {len(found)} label columns ({', '.join(found)}): choose one with "
            "--label-key NAME"
        )
    return found[0] if found else next((n for n in _LABEL_NAMES if n in names), None)


def _check_label_type(where: str, column: str, kind: Any) -> None:
    """A label column holds one class number or name a row (or nothing): refuse the rest
    before anything is written."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        raise ValueError(
            f"{where}: column {column!r} holds several labels an image (multi-label), which "
            "imgpack does not store yet: choose a single-label column with --label-key NAME"
        )
    if not (
        pa.types.is_integer(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_null(kind)
    ):
        raise ValueError(
            f"{where}: column {column!r} holds {kind} values, not class numbers or names: "
            "choose the label column with --label-key NAME"
        )


@dataclass(frozen=True)
class GroupImages:
    """One row group's image column: each row's bytes, and its path where one is kept."""

    data: Any  # a pyarrow binary array
    paths: Any  # a pyarrow string array, or None

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + (self.paths.nbytes if self.paths is not None else 0))

    def row(self, row: int) -> tuple[bytes | None, str | None]:
        path = self.paths[row].as_py() if self.paths is not None else None
        return self.data[row].as_py(), path


class RowGroups:
    """The row groups a process read last, up to ``budget`` bytes, the least recently used
    dropped first. ``reads`` counts the row groups read from their files."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.reads = 0
        self._kept: OrderedDict[tuple[str, str, int], GroupImages] = OrderedDict()
        self._bytes = 0

    def get(self, key: tuple[str, str, int], load: Callable[[], GroupImages]) -> GroupImages:
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


ROW_GROUPS = RowGroups(256 << 20)
"""This process's row groups: a worker's, or the caller's (``inspect``)."""


@dataclass(frozen=True)
class ParquetReader:
    """Reads each sample's image bytes from its file's row group."""

    files: tuple[str, ...]
    spans: Spans  # rows: (file number, row group, row within the group)
    columns: Columns

    def read(self, samples: Sequence[Sample]) -> list[Stored]:
        rows = self.spans.rows()
        places = [tuple(int(x) for x in rows[position(s)]) for s in samples]
        out: list[Stored] = [""] * len(samples)
        for at in sorted(range(len(samples)), key=lambda i: places[i]):  # a group at a time
            file, group, row = places[at]
            out[at] = self._one(samples[at].relpath, file, group, row)
        return out

    def _one(self, name: str, file: int, group: int, row: int) -> Stored:
        where = self.files[file]
        try:
            images = ROW_GROUPS.get(
                (self.spans.path, where, group), lambda: self._load(where, group)
            )
            data, path = images.row(row)
            if data:
                return data
            if not path:
                return f"{name}: no image bytes"
            return _read_path(where, path, name)
        except (OSError, ValueError) as e:
            return f"{name}: cannot read from {where}: {e}"

    def _load(self, where: str, group: int) -> GroupImages:
        pq = _parquet(where)
        with open_file(where) as f:
            table = pq.ParquetFile(f).read_row_group(group, columns=[self.columns.image])
        column = table.column(0).combine_chunks()
        if self.columns.image_is_struct:
            paths = column.field("path") if column.type.get_field_index("path") >= 0 else None
            return GroupImages(column.field("bytes"), paths)
        return GroupImages(column, None)


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
        """Every row, in file order: its image's path (``file#row`` without one) and label."""
        refuse_folder_options(self.where, options)
        pq = _parquet(self.where)
        import pyarrow as pa

        columns: Columns | None = None
        labels: Labels | None = None
        spans: list[tuple[int, int, int]] = []
        paths: list[str] = []
        for number, path in enumerate(self.files):
            try:
                with open_file(path) as f:
                    pf = pq.ParquetFile(f)
                    found = Columns.of(path, pf.schema_arrow, self.label_key)
                    if columns is None:
                        columns = found
                        wanted = options.classes or found.class_names
                        labels = Labels(self.where, found.label or "label", wanted)
                    elif found != columns:
                        raise ValueError(f"{path}: its columns differ from {self.files[0]}'s")
                    for at, (group, row, name, value) in enumerate(_rows(pf, columns)):
                        shown = name or f"{Path(path).name}#{at}"
                        paths.append(shown)
                        spans.append((number, group, row))
                        labels.add(shown, value)
            except pa.ArrowException as e:
                raise ValueError(f"{path}: not a readable Parquet file: {e}") from e
        if columns is None or labels is None or not spans:
            raise FileNotFoundError(f"{self.where}: no rows")
        self._reader = ParquetReader(self.files, Spans.write(np.array(spans), self), columns)
        classes, numbers, left_out = labels.resolve()
        samples = SampleTable.of(
            Sample(path, label, index)
            for index, (path, label) in enumerate(zip(paths, numbers, strict=True))
            if label is not None
        )
        return Scan(classes, samples, left_out)

    def reader(self) -> ParquetReader:
        if self._reader is None:
            raise RuntimeError("ParquetSource.reader before scan")
        return self._reader

    def record(self) -> dict[str, object]:
        split = {"split": self.split} if self.split else {}
        return {**super().record(), **split}


def _rows(pf: Any, columns: Columns) -> Iterator[tuple[int, int, str | None, Any]]:
    """``(row group, row in it, image path or None, label or None)`` of each row of ``pf``,
    reading only the paths and labels."""
    read = [f"{columns.image}.path"] if columns.image_is_struct else []
    read += [columns.label] if columns.label else []
    for group in range(pf.metadata.num_row_groups):
        size = pf.metadata.row_group(group).num_rows
        table = pf.read_row_group(group, columns=read) if read else None
        names: list[Any] = [None] * size
        if table is not None and columns.image_is_struct:
            names = [v.get("path") if v else None for v in table.column(columns.image).to_pylist()]
        values = (
            table.column(columns.label).to_pylist()
            if table is not None and columns.label
            else [None] * size
        )
        for row in range(size):
            yield group, row, names[row], values[row]
