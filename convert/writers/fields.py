"""What every format writer records beside the image: each sample's stored size and the
parts of each field (``readers.spec``'s ``FIELD_*``), as samples arrive.

A variable field's value bytes go to a :class:`~convert.writers.spool.Spool` (or, for
``wds``, into the tar as members, whose offsets the writer passes in), so the writer's
memory does not grow with them; the per-sample parts (offsets, CRC-32s, valid flags, typed
values) are a few bytes a sample, kept in arrays until the shard closes. A format writer
then lays each part out under its own names (:meth:`ShardColumns.parts`).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from convert.writers.base import Record
from convert.writers.spool import Spool
from readers import spec
from readers.fields import SCALAR_KINDS, FieldSpec, decode
from readers.formats.checks import stored_crc
from readers.formats.field_columns import column_crc

__all__ = ["ShardColumns"]

Part = np.ndarray | Spool


class _Blob:
    """A text, json, bytes or array field: its values back to back (``data``), or where the
    writer put each one (``wds``: tar offsets)."""

    def __init__(self, beside: Path, spooled: bool) -> None:
        self.data = Spool(beside) if spooled else None
        self.offsets = array("q", [0] if spooled else [])
        self.sizes = array("q")
        self.crcs = array("I")
        self.valid = bytearray()

    def add(self, value: bytes | None, offset: int | None) -> None:
        self.valid.append(value is not None)
        self.crcs.append(0 if value is None else stored_crc(value))
        if self.data is not None:
            if value is not None:
                self.data.write(value)
            self.offsets.append(self.data.nbytes)
        else:
            self.offsets.append(offset or 0)
            self.sizes.append(0 if value is None else len(value))

    def parts(self) -> dict[str, Part]:
        out: dict[str, Part] = {}
        if self.data is not None:
            out[spec.FIELD_DATA] = self.data
        out[spec.FIELD_OFFSETS] = np.frombuffer(self.offsets, dtype=np.int64)
        if self.data is None:
            out[spec.FIELD_SIZES] = np.frombuffer(self.sizes, dtype=np.int64)
        out[spec.FIELD_CRCS] = np.frombuffer(self.crcs, dtype=np.uint32)
        out[spec.FIELD_VALID] = np.frombuffer(self.valid, dtype=np.uint8)
        return out

    def close(self) -> None:
        if self.data is not None:
            self.data.close()


class _Scalar:
    """An int or float field: a typed column, with one CRC-32 over it."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.values = array("q" if kind == "int" else "d")
        self.valid = bytearray()

    def add(self, value: bytes | None, offset: int | None) -> None:
        self.valid.append(value is not None)
        self.values.append(0 if value is None else decode(self.kind, value, "field"))

    def parts(self) -> dict[str, Part]:
        values = np.frombuffer(self.values, dtype=np.int64 if self.kind == "int" else np.float64)
        valid = np.frombuffer(self.valid, dtype=np.uint8)
        crc = np.array([column_crc(values, valid)], dtype=np.uint32)
        return {spec.FIELD_VALUES: values, spec.FIELD_VALID: valid, spec.FIELD_CRC: crc}

    def close(self) -> None:
        pass


class ShardColumns:
    """The stored image sizes and the field columns of one shard being written.

    ``spooled``: whether variable fields' bytes are kept here (pt, hdf5, lmdb) or written by
    the format itself, which passes each value's location to :meth:`add` (wds's members).
    """

    def __init__(self, schema: Mapping[str, FieldSpec], beside: Path, spooled: bool) -> None:
        self.schema = dict(schema)
        self._sizes = array("q")
        self._columns = {
            name: _Scalar(s.kind) if s.kind in SCALAR_KINDS else _Blob(beside, spooled)
            for name, s in self.schema.items()
        }

    def add(self, record: Record, offsets: Mapping[str, int] | None = None) -> None:
        """Record ``record``'s size and fields (``offsets``: where the format put each
        variable field's value, when not spooled)."""
        self._sizes.extend(record.size)
        for name, column in self._columns.items():
            column.add(record.fields.get(name), None if offsets is None else offsets.get(name))

    @property
    def sizes(self) -> np.ndarray:
        """int64 ``[n, 2]``: each sample's stored (height, width)."""
        return np.frombuffer(self._sizes, dtype=np.int64).reshape(-1, 2)

    def parts(self) -> Iterator[tuple[str, str, Part]]:
        """``(field, part, value)`` for every part of every field, in the schema's order:
        NumPy arrays, and the spooled bytes of variable fields (``FIELD_DATA``)."""
        for name, column in self._columns.items():
            for part, value in column.parts().items():
                yield name, part, value

    def close(self) -> None:
        """Discard the spools (after the format has copied them out)."""
        for column in self._columns.values():
            column.close()
