"""Which columns of a Hugging Face Parquet file hold the images and the labels
(:class:`Columns`), read from the ``huggingface`` schema metadata when present (an ``Image``
feature; a ``ClassLabel`` feature, whose ``names`` are the class names), else from the
types; the label columns a single-label dataset cannot use refused in one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["Columns"]

_LABEL_NAMES = ("label", "labels")
_SEQUENCES = ("Sequence", "List", "LargeList")  # the features of a list, by datasets version


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
