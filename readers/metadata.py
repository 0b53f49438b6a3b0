"""``ds.metadata()``: a dataset's per-sample metadata as one ``pyarrow.Table``, to filter with
pyarrow or pandas and train on what is kept (``make_loader(path, indices=table["index"])``).

The table is built from the shards' columns, never from the images: labels, the recorded
stored sizes (:attr:`readers.ImageDataset.sizes`), int and float fields from their typed
columns (:meth:`readers.formats.field_columns.ScalarColumn.scalars`: NumPy arrays, no Python
object per sample) and text and json fields from their canonical bytes (json as its compact
text, which ``pyarrow.compute`` and ``json.loads`` read). Every value is checked as on any
read. pyarrow is optional: only this module imports it, on first use.

=========  ========  ==========================================================
column     type      what
=========  ========  ==========================================================
index      int64     the sample's index: what ``ds[i]`` and ``indices=`` take
label      int64     its label
height     int64     its stored image height
width      int64     its stored image width
NAME       per kind  each text (string), json (string), int (int64) and float
                     (float64) field, in the schema's order; null where missing
=========  ========  ==========================================================

A field named like one of the first four columns is the column ``field:NAME`` (``:`` never
names a field). bytes and array fields are not columns.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from readers.fields import SCALAR_KINDS, FieldSpec
from readers.formats import ShardReader
from readers.formats.field_columns import BlobColumn, FieldColumn
from readers.manifest import Manifest
from readers.spec import DatasetError

if TYPE_CHECKING:
    import pyarrow

__all__ = ["BASE_COLUMNS", "METADATA_KINDS", "Dataset", "metadata_columns", "metadata_table"]

BASE_COLUMNS = ("index", "label", "height", "width")
METADATA_KINDS = ("text", "json", "int", "float")


class Dataset(Protocol):
    """What the table is built from: a map-style dataset (:class:`readers.ImageDataset`)."""

    manifest: Manifest

    @property
    def fields(self) -> Mapping[str, FieldSpec]: ...

    @property
    def sizes(self) -> np.ndarray: ...

    def shard(self, index: int) -> ShardReader: ...


def _pyarrow() -> Any:
    try:
        return importlib.import_module("pyarrow")
    except ModuleNotFoundError as e:
        if e.name != "pyarrow":
            raise
        raise ImportError(
            "ds.metadata() builds a pyarrow.Table and pyarrow is not installed: pip install pyarrow"
        ) from None


def metadata_columns(
    schema: Mapping[str, FieldSpec], columns: Sequence[str] | None, where: object
) -> list[str]:
    """The fields that are columns: ``columns`` checked, or every text, json, int and float
    field of ``schema`` (None).

    Raises:
        ValueError: naming ``where`` (the dataset), for a name the schema lacks (listing
            the names it has), a bytes or array field, or a lone string.
    """
    if columns is None:
        return [name for name, spec in schema.items() if spec.kind in METADATA_KINDS]
    if isinstance(columns, str | bytes):
        raise ValueError(f"{where}: columns= takes a sequence of names: columns=({columns!r},)")
    names = list(dict.fromkeys(columns))
    for name in names:
        if name not in schema:
            have = ", ".join(schema) if schema else "none"
            raise ValueError(f"{where}: no field {name!r} in this dataset; its fields: {have}")
        if schema[name].kind not in METADATA_KINDS:
            raise ValueError(
                f"{where}: field {name!r} is {schema[name].kind}: metadata() holds text, "
                "json, int and float fields; read it with fields=(...) instead"
            )
    return names


def metadata_table(ds: Dataset, columns: Sequence[str] | None = None) -> pyarrow.Table:
    """The metadata table of dataset ``ds`` (see the module's docstring): its fields
    ``columns`` (None: all of the kinds a column holds).

    Raises:
        ImportError: pyarrow is not installed (saying how to install it).
        ValueError: for a ``columns`` name as :func:`metadata_columns` says.
        readers.DatasetError: for a damaged shard, naming ``shard[i]`` and the field.
    """
    pa = _pyarrow()
    schema = ds.fields
    names = metadata_columns(schema, columns, ds.manifest.location)
    shards = [ds.shard(k) for k in range(len(ds.manifest.shards))]
    labels = [np.asarray(shard.labels, dtype=np.int64) for shard in shards]
    sizes = ds.sizes
    n = len(sizes)
    table: dict[str, Any] = {
        "index": pa.array(np.arange(n, dtype=np.int64)),
        "label": pa.array(np.concatenate(labels) if labels else np.empty(0, np.int64)),
        "height": pa.array(np.ascontiguousarray(sizes[:, 0])),
        "width": pa.array(np.ascontiguousarray(sizes[:, 1])),
    }
    for name in names:
        kind = schema[name].kind
        parts = [_column(ds, k, shard, name) for k, shard in enumerate(shards)]
        column = f"field:{name}" if name in BASE_COLUMNS else name
        if kind in SCALAR_KINDS:
            table[column] = _scalar_column(pa, parts, kind)
        else:
            chunks = [_text_chunk(pa, part) for part in parts]
            table[column] = pa.chunked_array(chunks, type=pa.string())
    return pa.table(table)


def _column(ds: Dataset, k: int, shard: Any, name: str) -> FieldColumn:
    """Field ``name``'s column in shard ``k`` (a ``DatasetError`` naming it when absent)."""
    column = shard.fields.get(name)
    if column is None:
        where = ds.manifest.location.where(ds.manifest.shards[k].path)
        raise DatasetError(f"{where}: shard {k} holds no field {name!r}, which the manifest lists")
    return column


def _scalar_column(pa: Any, parts: Sequence[Any], kind: str) -> Any:
    """An int or float field's whole typed column, missing values null: the shards' NumPy
    columns concatenated, with their ``valid`` flags as the null mask."""
    dtype = np.int64 if kind == "int" else np.float64
    values, valid = [], []
    for part in parts:
        part_values, part_valid = part.scalars()
        values.append(part_values)
        valid.append(part_valid)
    if not values:
        return pa.array(np.empty(0, dtype))
    mask = np.concatenate(valid) == 0
    return pa.array(np.concatenate(values).astype(dtype, copy=False), mask=mask)


def _text_chunk(pa: Any, column: FieldColumn) -> Any:
    """A text or json field of one shard as a string array (json: its canonical text), from
    the canonical bytes of all its samples (None: null), checked as UTF-8 by the cast."""
    whole = column.whole() if isinstance(column, BlobColumn) else None
    if whole is None:  # values that are not back to back (wds members): one at a time
        raw = column.raw(range(len(column.valid)))
        return pa.array(raw, type=pa.binary()).cast(pa.string())
    data, offsets = whole
    present = pa.array(column.valid != 0).buffers()[1] if not column.valid.all() else None
    values = pa.Array.from_buffers(
        pa.large_binary(), len(column.valid), [present, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    return values.cast(pa.large_string()).cast(pa.string())
