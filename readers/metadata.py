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
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from readers.fields import SCALAR_KINDS, FieldSpec
from readers.formats import ShardReader
from readers.formats.field_columns import BlobColumn, FieldColumn, ScalarColumn
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

    def each_shard(self) -> Iterator[ShardReader]: ...


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

    The shards are read one after another as ``ds.each_shard()`` opens them (a ``wds``
    tar in object storage by byte ranges, never copied into the cache), each column a
    chunk a shard copied out of it, and each shard's mapped pages let go before the next
    (a million samples' shards do not stay resident beside the table).

    Raises:
        ImportError: pyarrow is not installed (saying how to install it).
        ValueError: for a ``columns`` name as :func:`metadata_columns` says.
        readers.DatasetError: for a damaged shard, naming ``shard[i]`` and the field.
    """
    pa = _pyarrow()
    schema = ds.fields
    names = metadata_columns(schema, columns, ds.manifest.location)
    base: dict[str, list[Any]] = {"label": [], "height": [], "width": []}
    chunks: dict[str, list[Any]] = {name: [] for name in names}
    for k, shard in enumerate(ds.each_shard()):
        sizes = shard.sizes()
        base["label"].append(_numbers(pa, pa.int64(), shard.labels))
        base["height"].append(_numbers(pa, pa.int64(), sizes[:, 0]))
        base["width"].append(_numbers(pa, pa.int64(), sizes[:, 1]))
        for name in names:
            column = _column(ds, k, shard, name)
            kind = schema[name].kind
            chunks[name].append(
                _scalar_chunk(pa, column, kind) if kind in SCALAR_KINDS else _text_chunk(pa, column)
            )
        shard.release_pages()
    n = ds.manifest.num_samples
    index = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(np.arange(n, dtype=np.int64))])
    table: dict[str, Any] = {"index": index}
    for column, parts in base.items():
        table[column] = pa.chunked_array(parts, type=pa.int64())
    for name in names:
        kind = schema[name].kind
        arrow_type = {"int": pa.int64(), "float": pa.float64()}.get(kind, pa.string())
        table[f"field:{name}" if name in BASE_COLUMNS else name] = pa.chunked_array(
            chunks[name], type=arrow_type
        )
    return pa.table(table)


def _column(ds: Dataset, k: int, shard: Any, name: str) -> FieldColumn:
    """Field ``name``'s column in shard ``k`` (a ``DatasetError`` naming it when absent)."""
    column = shard.fields.get(name)
    if column is None:
        where = ds.manifest.location.where(ds.manifest.shards[k].path)
        raise DatasetError(f"{where}: shard {k} holds no field {name!r}, which the manifest lists")
    return column


def _scalar_chunk(pa: Any, column: FieldColumn, kind: str) -> Any:
    """An int or float field of one shard: its typed column copied out of the shard, its
    ``valid`` flags as the null mask."""
    if not isinstance(column, ScalarColumn):
        raise DatasetError(f"{column.where}: field {column.name!r}: not a typed column")
    values, valid = column.scalars()
    return _numbers(pa, pa.int64() if kind == "int" else pa.float64(), values, valid)


def _numbers(pa: Any, arrow_type: Any, values: np.ndarray, valid: np.ndarray | None = None) -> Any:
    """An int64 or float64 array of a copy of ``values`` (null where ``valid`` is 0), made
    from NumPy buffers: ``pa.array`` would copy them again, and its first call sets up
    some 50 MB of converters that a table of a million rows does not need."""
    dtype = np.dtype(arrow_type.to_pandas_dtype())
    data = pa.py_buffer(np.array(values, dtype=dtype))
    present = None if valid is None or valid.all() else _bitmap(pa, valid)
    return pa.Array.from_buffers(arrow_type, len(values), [present, data])


def _bitmap(pa: Any, valid: np.ndarray) -> Any:
    """Arrow's validity bitmap of ``valid`` (1 where a value is present)."""
    return pa.py_buffer(np.packbits(np.asarray(valid) != 0, bitorder="little"))


def _text_chunk(pa: Any, column: FieldColumn) -> Any:
    """A text or json field of one shard as a string array (json: its canonical text), from
    the canonical bytes of all its samples (None: null), checked as UTF-8. Values back to
    back become the array's buffers as they are (their one copy out of the shard, no arrow
    cast copying them again)."""
    whole = column.whole() if isinstance(column, BlobColumn) else None
    if whole is None:  # values not back to back (wds members): joined here, as pa.array
        # would, but without importing pandas (28 MB) to look for its objects in them
        raw = column.raw(range(len(column.valid)))
        lengths = np.fromiter((0 if v is None else len(v) for v in raw), np.int64, len(raw))
        relative = np.zeros(len(raw) + 1, dtype=np.int64)
        np.cumsum(lengths, out=relative[1:])
        data = b"".join(v for v in raw if v is not None)
    else:
        data, relative = whole
    if relative[-1] >= 2**31:  # more than a string array's int32 offsets reach
        raise DatasetError(
            f"{column.where}: field {column.name!r}: {relative[-1]} bytes of text in one "
            "shard, more than a metadata column holds (2 GiB)"
        )
    offsets, data = pa.py_buffer(relative.astype(np.int32)), pa.py_buffer(data)
    present = None if column.valid.all() else _bitmap(pa, column.valid)
    text = pa.Array.from_buffers(pa.string(), len(column.valid), [present, offsets, data])
    try:
        text.validate(full=True)
    except pa.ArrowInvalid as e:
        raise DatasetError(f"{column.where}: field {column.name!r}: not UTF-8 text: {e}") from e
    return text
