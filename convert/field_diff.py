"""``imgpack diff`` on fields: how two datasets' schemas differ, and which matched samples
hold different field values.

Values are compared as each kind means them: text, int and float exactly (their canonical
bytes are their values), json structurally (the parsed values, so key order does not
count, nor do ``1`` and ``1.0``, but ``true`` and ``1`` differ), bytes and arrays by their
bytes. A value missing on one side only is a difference. Only the fields both schemas
hold with the same kind are compared; the rest is a schema difference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import readers
from convert.field_views import dataset_fields, one_line, spec_words
from readers.fields import Schema, decode

__all__ = ["compared_fields", "field_mismatches", "same_json", "same_value", "schema_differences"]

SHOWN_WIDTH = 40  # characters of each side's value in a mismatch


def schema_differences(a: Schema, b: Schema) -> list[str]:
    """How schema ``b`` differs from ``a``, one phrase a field ([] when they are equal)."""
    out = []
    for name in sorted(set(a) | set(b)):
        if name not in b:
            out.append(f"{name}: only in A ({spec_words(a[name])})")
        elif name not in a:
            out.append(f"{name}: only in B ({spec_words(b[name])})")
        elif a[name] != b[name]:
            out.append(f"{name}: {spec_words(a[name])} in A, {spec_words(b[name])} in B")
    return out


def compared_fields(a: Schema, b: Schema) -> list[str]:
    """The fields both schemas hold with the same kind, sorted: the ones compared."""
    return [name for name in a if name in b and a[name].kind == b[name].kind]


def same_json(x: Any, y: Any) -> bool:
    """Whether two parsed JSON values are the same: objects by keys, whatever their order;
    numbers by value (NaN equals NaN); a bool only equals the same bool."""
    if isinstance(x, bool) or isinstance(y, bool):
        return type(x) is type(y) and x == y
    if isinstance(x, int | float) and isinstance(y, int | float):
        return x == y or (math.isnan(x) and math.isnan(y))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(same_json(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(same_json(u, v) for u, v in zip(x, y, strict=True))
    return type(x) is type(y) and x == y


def same_value(kind: str, x: bytes | None, y: bytes | None, name: str) -> bool:
    """Whether two canonical values of a ``kind`` field are the same (see the module
    docstring); a json value that does not parse is a ValueError naming ``name``."""
    if x is None or y is None:
        return x is y
    if bytes(x) == bytes(y):
        return True
    if kind != "json":
        return False
    where = f"field {name!r}"
    return same_json(decode(kind, x, where), decode(kind, y, where))


def field_mismatches(
    da: readers.ImageDataset,
    db: readers.ImageDataset,
    pairs: Sequence[tuple[int, int]],
    names: Sequence[str],
) -> list[dict[str, Any]]:
    """One entry per field value that differs between matched ``pairs`` (``(index in A,
    index in B)``), in pair then field order: A's source path, both indices, the field,
    and each side's value on one line. Values are read CRC-checked (a damaged one is a
    DatasetError naming its shard, sample and field)."""
    if not names or not pairs:
        return []
    schema = da.manifest.fields
    fields_a = dataset_fields(da, [i for i, _ in pairs], names)
    fields_b = dataset_fields(db, [j for _, j in pairs], names)
    out = []
    for (i, j), row_a, row_b in zip(pairs, fields_a, fields_b, strict=True):
        for name in names:
            kind = schema[name].kind
            x, y = row_a[name], row_b[name]
            if not same_value(kind, x, y, name):
                out.append(
                    {
                        "path": da.source_path(i),
                        "index_a": i,
                        "index_b": j,
                        "field": name,
                        "a": _shown(kind, x, name),
                        "b": _shown(kind, y, name),
                    }
                )
    return out


def _shown(kind: str, data: bytes | None, name: str) -> str:
    try:
        return one_line(kind, decode(kind, data, name), SHOWN_WIDTH)
    except ValueError as e:
        return f"({e})"
