"""What the tools (``info``, ``inspect``, ``diff``, ``verify``) share about fields: the
schema in words, a value shortened to one line, and the fields of samples read by dataset
index or from a foreign source.

A dataset's fields are read through each shard's :attr:`readers.formats.ShardReader.fields`
columns, grouped by shard (one ``raw`` call a shard), so every value the tools show or
compare is checked against its CRC-32 as every read path checks it. A foreign source's
fields come from its :class:`convert.sources.base.WithFields` samples, in its scan's schema
order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import groupby
from typing import Any

import numpy as np

import readers
from convert.scan import Sample
from convert.sources import DatasetSource
from convert.sources.base import SampleSource, Stored, WithFields, position
from convert.tile_text import ELLIPSIS
from readers.fields import FieldSpec, Schema, decode
from readers.spec import DatasetError

__all__ = [
    "TEXT_KINDS",
    "caption_field",
    "captions",
    "dataset_fields",
    "examples",
    "one_line",
    "schema_lines",
    "source_fields",
    "spec_words",
    "value_words",
]

TEXT_KINDS = ("text",)  # the kinds ``inspect --grid --caption`` writes under a tile


def spec_words(field_spec: FieldSpec) -> str:
    """A field's spec in words: ``text``, ``array <f4 [3, 4]``, ``json names: a, b``."""
    words = [field_spec.kind]
    if field_spec.dtype is not None:
        words.append(field_spec.dtype)
    if field_spec.shape is not None:
        words.append(f"[{', '.join(map(str, field_spec.shape))}]")
    if field_spec.names is not None:
        shown = ", ".join(field_spec.names[:8])
        more = len(field_spec.names) - 8
        words.append(f"names: {shown}" + (f", and {more} more" if more > 0 else ""))
    return " ".join(words)


def schema_lines(schema: Schema, indent: str = "  ") -> list[str]:
    """One line a field: its name and :func:`spec_words`, names aligned."""
    width = max((len(name) for name in schema), default=0)
    return [f"{indent}{name:<{width}}  {spec_words(s)}" for name, s in schema.items()]


def value_words(kind: str, value: Any) -> str:
    """A field's Python value as text, on one line: text with its whitespace runs (newlines
    too) made one space, json compact, bytes and arrays by what they are."""
    if value is None:
        return "(missing)"
    if kind == "text":
        return " ".join(str(value).split())
    if kind == "json":
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if kind == "bytes":
        return f"{len(value)} bytes {bytes(value[:8]).hex()}" + ("…" if len(value) > 8 else "")
    if kind == "array":
        array = np.asarray(value)
        return f"array {array.dtype.str} {list(array.shape)}"
    return repr(value)


def one_line(kind: str, value: Any, width: int = 72) -> str:
    """:func:`value_words` shortened to ``width`` characters (an ellipsis ends it)."""
    words = value_words(kind, value)
    return words if len(words) <= width else words[: max(width - 1, 0)].rstrip() + ELLIPSIS


def dataset_fields(
    ds: readers.ImageDataset, indices: Sequence[int], names: Sequence[str]
) -> list[dict[str, bytes | None]]:
    """The canonical bytes of fields ``names`` of samples ``indices`` (dataset indices),
    in order; a name the shard does not hold reads as a ``DatasetError`` naming it."""
    located = [(k, i, n) for n, (k, i) in enumerate(ds.locate(index) for index in indices)]
    out: list[dict[str, bytes | None]] = [{} for _ in indices]
    for k, group in groupby(sorted(located), key=lambda t: t[0]):
        rows = list(group)
        shard = ds.shard(k)
        for name in names:
            column = shard.fields.get(name)
            if column is None:
                where = ds.manifest.location.where(ds.manifest.shards[k].path)
                raise DatasetError(f"{where}: holds no field {name!r}")
            for (_, _, n), data in zip(rows, column.raw([i for _, i, _ in rows]), strict=True):
                out[n][name] = data
    return out


def source_fields(
    source: SampleSource, samples: Sequence[Sample], schema: Schema
) -> list[dict[str, Any] | None]:
    """The Python values of every field of ``samples`` of a foreign source (its reader's
    :class:`WithFields`), None for a sample that cannot be read; a value whose bytes do
    not decode reads as missing here (the conversion names it)."""
    out: list[dict[str, Any] | None] = []
    for stored in source.reader().read(samples):
        if not isinstance(stored, WithFields):
            out.append(None if isinstance(stored, str) else {})
            continue
        values = {}
        for (name, field_spec), data in zip(schema.items(), stored.fields, strict=True):
            try:
                values[name] = decode(field_spec.kind, data, name)
            except ValueError:
                values[name] = None
        out.append(values)
    return out


def examples(
    source: SampleSource, schema: Schema, samples: Sequence[Sample], shown: int = 3
) -> dict[str, list[str]]:
    """The first ``shown`` values of each field (:func:`one_line`), of the first samples of
    a dataset (by index) or of a foreign source's ``samples``."""
    if not schema:
        return {}
    if isinstance(source, DatasetSource):
        ds = readers.open_dataset(source.manifest, decode_threads=1)
        raw = dataset_fields(ds, range(min(shown, len(ds))), list(schema))
        rows: list[dict[str, Any] | None] = [
            {name: decode(schema[name].kind, data, name) for name, data in row.items()}
            for row in raw
        ]
    else:
        rows = source_fields(source, samples[:shown], schema)
    return {
        name: [one_line(s.kind, row.get(name)) for row in rows if row is not None]
        for name, s in schema.items()
    }


def caption_field(where: str, schema: Schema, name: str) -> str:
    """``name`` if it is a text field of ``schema``, else a ValueError naming the fields
    that could caption a grid."""
    texts = [n for n, s in schema.items() if s.kind in TEXT_KINDS]
    could = f"text fields: {', '.join(texts)}" if texts else "it has no text field"
    if name not in schema:
        raise ValueError(f"{where}: no field {name!r} to caption the grid with ({could})")
    if schema[name].kind not in TEXT_KINDS:
        raise ValueError(
            f"{where}: field {name!r} is {schema[name].kind}, not text: --caption writes a "
            f"text field under each tile ({could})"
        )
    return name


def captions(
    source: SampleSource,
    schema: Schema,
    samples: Sequence[Sample],
    stored: Sequence[Stored],
    name: str,
) -> list[str | None]:
    """Text field ``name`` of each of ``samples`` (None where missing): a dataset's read by
    index, a foreign source's from its ``stored`` values (what its reader gave)."""
    if isinstance(source, DatasetSource):
        ds = readers.open_dataset(source.manifest, decode_threads=1)
        rows = dataset_fields(ds, [position(s) for s in samples], [name])
        return [decode("text", row[name], name) for row in rows]
    k = list(schema).index(name)
    return [
        decode("text", value.fields[k], name) if isinstance(value, WithFields) else None
        for value in stored
    ]
