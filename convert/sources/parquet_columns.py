"""Which columns of a Hugging Face Parquet file hold the images, the labels and the fields
(:class:`Columns`), read from the ``huggingface`` schema metadata when present (an ``Image``
feature; a ``ClassLabel`` feature, whose ``names`` are the class names), else from the
types; the label columns a single-label dataset cannot use refused in one line.

Every other column is a field, its kind from its Arrow type (:func:`field_kind`): strings
text, integers and booleans int, floats float, binary bytes, lists, structs and maps json
(a ``Sequence(ClassLabel)`` column a json list of class numbers, its class names kept in
the :class:`~readers.fields.FieldSpec`), a second image column (a ``{bytes, path}``
struct: an ``Image`` or ``Audio`` feature) bytes, its ``bytes`` (missing where a row keeps
only a path), anything else (dates, decimals) text, as pyarrow prints it.
:func:`canonical_column` makes a row group's column canonical bytes at once,
through Arrow's casts where they give the canonical text (strings, integers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from readers.fields import FieldSpec, encode

__all__ = ["Columns", "canonical_column", "field_kind"]

_LABEL_NAMES = ("label", "labels")
_SEQUENCES = ("Sequence", "List", "LargeList")  # the features of a list, by datasets version
_PANDAS_INDEX = "__index_level_"  # a pandas index pyarrow kept as a column: not a field
_FLOAT_WORDS = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}  # json.dumps's words
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # readers.fields.encode's


@dataclass(frozen=True)
class Columns:
    """Which columns hold the images and the labels, the class names the schema gives, and
    each other column's field spec (in the file's column order)."""

    image: str
    image_is_struct: bool
    label: str | None
    class_names: tuple[str, ...] | None
    fields: tuple[tuple[str, FieldSpec], ...] = ()

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
        label = label_key or _label_column(where, features, schema)
        if label is not None:
            if label not in schema.names:
                raise ValueError(
                    f"{where}: no column {label!r} (columns: {', '.join(schema.names)})"
                )
            _check_label_type(where, label, schema.field(label).type)
        names = features.get(label, {}).get("names") if label else None
        is_struct = pa.types.is_struct(schema.field(image).type)
        fields = tuple(
            (f.name, FieldSpec(field_kind(f.type), names=_class_names(features.get(f.name))))
            for f in schema
            if f.name not in (image, label) and not f.name.startswith(_PANDAS_INDEX)
        )
        return cls(image, is_struct, label, tuple(names) if names else None, fields)


def field_kind(kind: Any) -> str:
    """The field kind of a column of Arrow type ``kind`` (see the module docstring)."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "text"
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return "int"
    if pa.types.is_floating(kind):
        return "float"
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return "bytes"
    if pa.types.is_fixed_size_binary(kind) or _is_media(kind):
        return "bytes"
    if pa.types.is_nested(kind) or pa.types.is_null(kind):
        return "json"
    return "text"


def canonical_column(column: Any, kind: str, where: str) -> list[bytes | None]:
    """Each row's canonical bytes of a field column (a pyarrow array of one row group;
    None where null): strings and integers through Arrow's casts, the rest per value."""
    import pyarrow as pa

    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if kind == "bytes" and _is_media(column.type):
        import pyarrow.compute as pc

        column = pc.struct_field(column, "bytes")  # a second Image (or Audio): its bytes
    if kind == "text" and not (
        pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
    ):
        column = column.cast(pa.large_string())
    if kind == "int" and pa.types.is_boolean(column.type):
        column = column.cast(pa.int8())
    if kind in ("text", "int"):
        return column.cast(pa.large_string()).cast(pa.large_binary()).to_pylist()
    if kind == "float":  # encode's JSON number, without its checks per value
        return [
            None if v is None else _FLOAT_WORDS.get(r := repr(float(v)), r).encode("ascii")
            for v in column.to_pylist()
        ]
    if kind == "json":  # encode's compact JSON, one encoder for the column
        dumps = _JSON.encode
        return [None if v is None else dumps(v).encode("utf-8") for v in column.to_pylist()]
    return [encode(kind, value, where) for value in column.to_pylist()]


def _is_media(kind: Any) -> bool:
    """True for a ``{bytes, path}`` struct: how ``datasets`` stores an Image or Audio."""
    import pyarrow as pa

    if not pa.types.is_struct(kind) or kind.get_field_index("bytes") < 0:
        return False
    inner = kind.field("bytes").type
    return pa.types.is_binary(inner) or pa.types.is_large_binary(inner)


def _class_names(feature: Any) -> tuple[str, ...] | None:
    """The class names of a ``Sequence(ClassLabel)`` feature (how each datasets version
    writes one), or None."""
    if _type(feature) != "[ClassLabel]":
        return None
    inner = feature[0] if isinstance(feature, list) else feature.get("feature")
    names = inner.get("names") if isinstance(inner, dict) else None
    return tuple(names) if names else None


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


def _label_column(where: str, features: dict[str, Any], schema: Any) -> str | None:
    """The label column the schema shows: its one ``ClassLabel``, else a column named
    ``label``/``labels`` that is no list, else None; several are refused, never one taken.
    A list of class labels (multi-label) is never taken: it is a field."""
    import pyarrow as pa

    found = [n for n, f in features.items() if _type(f) == "ClassLabel"]
    if len(found) > 1:
        raise ValueError(
            f"{where}: {len(found)} label columns ({', '.join(found)}): choose one with "
            "--label-key NAME"
        )
    if found:
        return found[0]
    return next(
        (
            n
            for n in _LABEL_NAMES
            if n in schema.names and not pa.types.is_nested(schema.field(n).type)
        ),
        None,
    )


def _check_label_type(where: str, column: str, kind: Any) -> None:
    """A label column holds one class number or name a row (or nothing): refuse the rest
    before anything is written."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        raise ValueError(
            f"{where}: column {column!r} holds several labels an image (multi-label), which "
            "cannot be the label (it is kept as a json field when another column is, or "
            "none): choose a single-label column with --label-key NAME"
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
