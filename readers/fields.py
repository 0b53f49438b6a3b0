"""Sample fields: what a sample holds beside its image and label, defined once.

A field has a name and a kind (:data:`KINDS`). Everywhere between a source and a shard a
field's value is its **canonical bytes** (:func:`encode`): what every format stores for a
variable-length kind, what the content checksum covers, and what ``imgpack diff`` compares.
Readers turn them back into Python values with :func:`decode`. No kind is read with pickle:
``array`` values are ``.npy`` bytes loaded with ``allow_pickle=False``.

========  ===========================  ================================================
kind      Python value                 canonical bytes
========  ===========================  ================================================
text      ``str``                      UTF-8
json      any JSON value               ``json.dumps`` compact, non-ASCII kept (UTF-8)
int       ``int`` (int64)              ASCII decimal (WebDataset's ``.cls``)
float     ``float`` (float64)          the JSON number (``repr``; ``NaN``, ``Infinity``)
bytes     ``bytes``                    the bytes
array     ``numpy.ndarray``            ``.npy`` (``numpy.save``, ``allow_pickle=False``)
========  ===========================  ================================================

A value may be missing in some samples: it is ``None`` in Python and stored as null (no
bytes). The :class:`Schema` (name -> :class:`FieldSpec`) is recorded in the manifest under
``fields``; its names are sorted, which fixes the order checksums and batches see them in.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = [
    "KINDS",
    "SCALAR_KINDS",
    "FieldSpec",
    "Schema",
    "canonical",
    "check_name",
    "collate_field",
    "decode",
    "encode",
    "extension_kind",
    "parse_schema",
    "scalar_bytes",
    "scalar_column",
    "schema_json",
    "schema_of",
]

KINDS = ("text", "json", "int", "float", "bytes", "array")
SCALAR_KINDS = ("int", "float")  # stored as typed columns, batched as tensors
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")

# The kind a WebDataset member's extension decodes to under ``webdataset``'s default
# handlers (``.decode()``), by the last dotted part of the extension: the rest are bytes.
_EXTENSION_KINDS = {
    "txt": "text",
    "text": "text",
    "transcript": "text",
    "json": "json",
    "jsn": "json",
    "cls": "int",
    "cls2": "int",
    "class": "int",
    "count": "int",
    "index": "int",
    "inx": "int",
    "id": "int",
    "npy": "array",
}


@dataclass(frozen=True)
class FieldSpec:
    """One field of a schema: its kind and, where every value shares them, an array's
    ``dtype``/``shape``; ``names``: the class names of a json list of class indices (a
    Hub ``Sequence(ClassLabel)`` column)."""

    kind: str
    dtype: str | None = None  # array: numpy dtype string ("<f4"), when fixed
    shape: tuple[int, ...] | None = None  # array: when fixed
    names: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.dtype is not None:
            out["dtype"] = self.dtype
        if self.shape is not None:
            out["shape"] = list(self.shape)
        if self.names is not None:
            out["names"] = list(self.names)
        return out


Schema = Mapping[str, FieldSpec]
"""Field name -> spec, names sorted (:func:`parse_schema` and :func:`schema_of` make one)."""


def check_name(name: str, where: str) -> str:
    """``name`` if it can name a field in every format (a tar member's extension, an HDF5
    dataset, a pt key): letters, digits, ``_``, ``.``, ``-``; ValueError naming ``where``."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"{where}: {name!r} cannot name a field (letters, digits, '_', '.', '-'; at most "
            "64): rename it, or leave it out with --fields"
        )
    return name


def schema_of(specs: Mapping[str, FieldSpec]) -> dict[str, FieldSpec]:
    """``specs`` as a :data:`Schema`: names checked and sorted."""
    for name, field_spec in specs.items():
        check_name(name, "field")
        if field_spec.kind not in KINDS:
            raise ValueError(f"field {name!r}: unknown kind {field_spec.kind!r}")
    return {name: specs[name] for name in sorted(specs)}


def schema_json(schema: Schema) -> dict[str, Any]:
    """The manifest's ``fields`` object."""
    return {name: field_spec.to_json() for name, field_spec in schema.items()}


def parse_schema(raw: Any, where: str) -> dict[str, FieldSpec]:
    """The manifest's ``fields`` (absent: no fields), checked; ValueError naming ``where``
    and the field."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: fields must be an object")
    specs = {}
    for name, entry in raw.items():
        if not isinstance(entry, dict) or entry.get("kind") not in KINDS:
            raise ValueError(f"{where}: field {name!r}: kind must be one of {', '.join(KINDS)}")
        dtype, shape, names = entry.get("dtype"), entry.get("shape"), entry.get("names")
        if dtype is not None and not isinstance(dtype, str):
            raise ValueError(f"{where}: field {name!r}: dtype must be a string")
        if shape is not None and not (
            isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)
        ):
            raise ValueError(f"{where}: field {name!r}: shape must be a list of sizes")
        if names is not None and not (
            isinstance(names, list) and all(isinstance(n, str) for n in names)
        ):
            raise ValueError(f"{where}: field {name!r}: names must be a list of strings")
        specs[check_name(name, where)] = FieldSpec(
            entry["kind"],
            dtype,
            None if shape is None else tuple(shape),
            None if names is None else tuple(names),
        )
    return schema_of(specs)


def extension_kind(extension: str) -> str:
    """The kind of a WebDataset member with ``extension`` (``txt``, ``caption.txt``,
    ``json``...), as ``webdataset``'s default decoders read it; bytes for the rest."""
    return _EXTENSION_KINDS.get(extension.rsplit(".", 1)[-1].lower(), "bytes")


def encode(kind: str, value: Any, where: str) -> bytes | None:
    """The canonical bytes of ``value`` as a ``kind`` field (None stays None: a missing
    value); ValueError naming ``where`` when the value is not of that kind."""
    if value is None:
        return None
    try:
        if kind == "text":
            if not isinstance(value, str):
                raise TypeError(f"a {type(value).__name__}, not text")
            return value.encode("utf-8")
        if kind == "json":
            return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        if kind == "int":
            if isinstance(value, bool | np.bool_):
                value = int(value)
            if not isinstance(value, int | np.integer):
                raise TypeError(f"a {type(value).__name__}, not an integer")
            if not -(2**63) <= int(value) < 2**63:
                raise OverflowError(f"{value} does not fit in int64")
            return str(int(value)).encode("ascii")
        if kind == "float":
            if not isinstance(value, float | int | np.floating | np.integer) or isinstance(
                value, bool
            ):
                raise TypeError(f"a {type(value).__name__}, not a number")
            return json.dumps(float(value)).encode("ascii")
        if kind == "bytes":
            return bytes(value)
        if kind == "array":
            out = io.BytesIO()
            np.save(out, np.asarray(value), allow_pickle=False)
            return out.getvalue()
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"{where}: not a {kind} value: {e}") from None
    raise ValueError(f"{where}: unknown field kind {kind!r}")


def decode(kind: str, data: bytes | memoryview | None, where: str) -> Any:
    """The Python value of a field's canonical ``data`` (None: missing); ValueError naming
    ``where`` when the bytes are not what the kind stores."""
    if data is None:
        return None
    try:
        if kind == "text":
            return bytes(data).decode("utf-8")
        if kind == "json":
            return json.loads(bytes(data).decode("utf-8"))
        if kind == "int":
            return int(bytes(data).decode("ascii"))
        if kind == "float":
            number = json.loads(bytes(data).decode("ascii"))
            if not isinstance(number, int | float) or isinstance(number, bool):
                raise ValueError("not a number")
            return float(number)
        if kind == "bytes":
            return bytes(data)
        if kind == "array":
            return np.load(io.BytesIO(bytes(data)), allow_pickle=False)
    except (ValueError, UnicodeDecodeError, OSError, EOFError) as e:
        raise ValueError(f"{where}: not a stored {kind} value: {e}") from None
    raise ValueError(f"{where}: unknown field kind {kind!r}")


def canonical(kind: str, data: bytes | memoryview, where: str) -> bytes:
    """A source's bytes for a ``kind`` field (a tar member, a sidecar file) as canonical
    bytes: parsed, then encoded again, so equal values store equal bytes whatever wrote
    them (``{"a": 1}`` and ``{"a":1}``); ValueError naming ``where``."""
    if kind == "bytes":
        return bytes(data)
    if kind == "int":  # WebDataset's ASCII digits, surrounding space allowed as int() does
        try:
            return encode(kind, int(bytes(data).decode("ascii")), where)  # type: ignore[return-value]
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{where}: not an integer: {e}") from None
    return encode(kind, decode(kind, data, where), where)  # type: ignore[return-value]


def collate_field(spec: FieldSpec, values: Sequence[Any]) -> torch.Tensor | list[Any]:
    """A batch of one field's values: int and float as an int64/float64 tensor when none is
    missing, fixed-shape arrays stacked, everything else (text, json, bytes, arrays of
    varying shape, a batch with a missing value) the list as it is."""
    import torch  # here, where batches are made: the converter imports this module too

    if not values or any(v is None for v in values):
        return list(values)
    if spec.kind == "int":
        return torch.tensor(values, dtype=torch.int64)
    if spec.kind == "float":
        return torch.tensor(values, dtype=torch.float64)
    if spec.kind == "array":
        first = values[0]
        if all(v.shape == first.shape and v.dtype == first.dtype for v in values):
            return torch.from_numpy(np.stack(values))
    return list(values)


def scalar_column(kind: str, stored: Iterable[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
    """The typed column of an int or float field: ``(values, valid)``, int64 or float64
    values (0 where missing) and uint8 ``valid`` (1 where present), from canonical bytes."""
    dtype = np.int64 if kind == "int" else np.float64
    values, valid = [], []
    for data in stored:
        valid.append(data is not None)
        values.append(0 if data is None else decode(kind, data, "field"))
    return np.array(values, dtype=dtype), np.array(valid, dtype=np.uint8)


def scalar_bytes(kind: str, value: Any) -> bytes:
    """:func:`encode` of one value of a typed column (a NumPy scalar)."""
    return encode(kind, value.item() if hasattr(value, "item") else value, "field")  # type: ignore[return-value]
