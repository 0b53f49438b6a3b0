"""Parquet files in the Hugging Face ``datasets`` image layout (how most image datasets on the
Hub are shipped) as a sample source, read with pyarrow (``pip install -e '.[parquet]'``).

The image column holds ``{bytes, path}`` structs (the ``datasets.Image`` feature) or plain
bytes; the label column integers. Which column is which comes from the ``huggingface``
schema metadata when present (an ``Image`` feature; a ``ClassLabel`` feature, whose
``names`` are the class names), else from the types (the first struct or binary column; an
integer column named ``label``/``labels``, or the one ``--label-key`` names). The scan reads
only the labels and the images' paths; a worker reads the image column of one row group
at a time, keeping the last one for the samples after it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from convert.options import ConvertOptions
from convert.samples import Sample, SampleTable
from convert.scan import Scan
from convert.sources.base import Stored, position, refuse_folder_options
from convert.sources.files import FileSource, Spans, open_file
from convert.sources.labels import Labels

__all__ = ["PARQUET_HINT", "ParquetReader", "ParquetSource"]

PARQUET_HINT = "reading Parquet needs pyarrow: pip install -e '.[parquet]' in the checkout"
_LABEL_NAMES = ("label", "labels")

_ROW_GROUP: dict[str, Any] = {}
"""The row group a worker process read last: ``{"key": (file, group), "images": [...]}``."""


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
        by_type = {name: f.get("_type") for name, f in features.items() if isinstance(f, dict)}
        image = next((n for n, t in by_type.items() if t == "Image"), None)
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
        label = label_key or next((n for n, t in by_type.items() if t == "ClassLabel"), None)
        if label is None:
            label = next((n for n in _LABEL_NAMES if n in schema.names), None)
        if label is not None and label not in schema.names:
            raise ValueError(f"{where}: no column {label!r} (columns: {', '.join(schema.names)})")
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


@dataclass(frozen=True)
class ParquetReader:
    """Reads each sample's image bytes from its file's row group."""

    files: tuple[str, ...]
    spans: Spans  # rows: (file number, row group, row within the group)
    columns: Columns

    def read(self, samples: Sequence[Sample]) -> list[Stored]:
        rows = self.spans.rows()
        out: list[Stored] = []
        for sample in samples:
            file, group, row = (int(x) for x in rows[position(sample)])
            try:
                value = self._group(file, group)[row]
            except (OSError, ValueError) as e:
                out.append(f"{sample.relpath}: cannot read from {self.files[file]}: {e}")
                continue
            out.append(value if value else f"{sample.relpath}: no image bytes")
        return out

    def _group(self, file: int, group: int) -> list[bytes | None]:
        key = (self.files[file], group)
        if _ROW_GROUP.get("key") != key:
            pq = _parquet(self.files[file])
            with open_file(self.files[file]) as f:
                column = pq.ParquetFile(f).read_row_group(group, columns=[self.columns.image])
            values = column.column(0).to_pylist()
            if self.columns.image_is_struct:
                values = [v.get("bytes") if v else None for v in values]
            _ROW_GROUP.update(key=key, images=values)
        return _ROW_GROUP["images"]


class ParquetSource(FileSource):
    """The ``.parquet`` files ``src`` names (a file, a folder, a glob, a brace pattern,
    local or at a URL); see the module docstring."""

    kind = "parquet"
    suffix = ".parquet"
    _reader: ParquetReader | None = None

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
