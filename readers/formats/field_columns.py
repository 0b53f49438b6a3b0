"""The read side of a shard's fields: one :class:`FieldColumn` per field, whatever the format.

Each format reader finds a field's parts (``readers.spec``'s ``FIELD_*`` names) where its
layout keeps them and hands them here: a variable kind (text, json, bytes, array) becomes a
:class:`BlobColumn` over a ``fetch(starts, stops)`` of its values' bytes (slices of the
mmap'd pt blob, of an LMDB value, an HDF5 dataset, ``pread`` of the tar, or one round of
merged range requests for a remote tar: a batch's values of a shard are asked for in one
call), an int or float field a :class:`ScalarColumn` over its typed values. Both check what
they serve as image bytes are checked: a value against its CRC-32 on every read, a typed
column against its one CRC-32 the first time a process reads it. Damage is a
``DatasetError`` naming ``shard[i]`` and the field.
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from typing import Any

import numpy as np

from readers.fields import SCALAR_KINDS, FieldSpec, decode, scalar_bytes
from readers.formats.checks import stored_crcs
from readers.spec import (
    FIELD_CRC,
    FIELD_CRCS,
    FIELD_DATA,
    FIELD_OFFSETS,
    FIELD_SIZES,
    FIELD_VALID,
    FIELD_VALUES,
    DatasetError,
)

__all__ = ["BlobColumn", "FieldColumn", "ScalarColumn", "column_crc", "open_columns", "part_dtype"]

Fetch = Callable[[list[int], list[int]], Sequence[bytes | memoryview]]
"""The bytes ``[starts[k], stops[k])`` of a blob column's storage, for each ``k``."""


def column_crc(values: np.ndarray, valid: np.ndarray) -> int:
    """The ``crc`` part of a typed column: CRC-32 of its values' bytes, then of ``valid``'s
    (what the writers record and :class:`ScalarColumn` checks)."""
    crc = zlib.crc32(memoryview(np.ascontiguousarray(values)).cast("B"))
    return zlib.crc32(memoryview(np.ascontiguousarray(valid, dtype=np.uint8)).cast("B"), crc)


class FieldColumn(ABC):
    """One field of one shard: its values by local index, checked."""

    def __init__(self, name: str, spec: FieldSpec, where: str, valid: np.ndarray) -> None:
        self.name, self.spec, self.where = name, spec, where
        self.valid = valid  # uint8 [n]: 1 where the sample has a value

    def _bad(self, i: int, why: str) -> DatasetError:
        return DatasetError(f"{self.where}[{i}]: field {self.name!r}: {why}")

    @abstractmethod
    def raw(self, indices: Sequence[int]) -> list[bytes | None]:
        """The canonical bytes of samples ``indices`` (None where missing), checked."""

    def values(self, indices: Sequence[int]) -> list[Any]:
        """The Python values of samples ``indices`` (None where missing), checked."""
        out = []
        for i, data in zip(indices, self.raw(indices), strict=True):
            try:
                out.append(decode(self.spec.kind, data, self.name))
            except ValueError as e:
                raise self._bad(i, str(e)) from None
        return out

    def value(self, i: int) -> Any:
        return self.values([i])[0]


class BlobColumn(FieldColumn):
    """A text, json, bytes or array field: value ``i`` is the bytes ``[starts[i],
    stops[i])`` of its storage (the values asked for together fetched in one call),
    checked against ``crcs[i]``."""

    def __init__(
        self,
        name: str,
        spec: FieldSpec,
        where: str,
        fetch: Fetch,
        starts: np.ndarray,
        stops: np.ndarray,
        crcs: np.ndarray,
        valid: np.ndarray,
    ) -> None:
        super().__init__(name, spec, where, valid)
        n = len(valid)
        if not (len(starts) == len(stops) == len(crcs) == n) or (stops < starts).any():
            raise DatasetError(f"{where}: field {name!r}: its columns disagree ({n} samples)")
        self._fetch, self._starts, self._stops, self._crcs = fetch, starts, stops, crcs
        self.packed: np.ndarray | Any = None  # the data part, where values lie back to back

    def whole(self) -> tuple[bytes, np.ndarray] | None:
        """``(data, offsets)``: every value's bytes back to back (value ``i`` is
        ``data[offsets[i]:offsets[i + 1]]``, empty where missing), each checked against
        its CRC-32; None where the format does not keep them so (wds: tar members). What a
        whole-column read (``ds.metadata()``) takes, without a Python object per value;
        ``data`` is a copy, so that the shard's mapped pages can go once it is made."""
        if self.packed is None:
            return None
        offsets = (
            np.append(self._starts, self._stops[-1:])
            if len(self._starts)
            else np.zeros(1, np.int64)
        )
        data = np.asarray(self.packed[int(offsets[0]) : int(offsets[-1])], dtype=np.uint8)
        relative = offsets - offsets[0]
        # zlib over slices of one bytes copy: a third of the cost of memoryview slices
        copy = data.tobytes()
        actual = np.array([zlib.crc32(copy[a:b]) for a, b in pairwise(relative.tolist())])
        bad = np.flatnonzero((actual != self._crcs) & (self.valid != 0))
        if len(bad):
            i = int(bad[0])
            raise self._bad(i, "stored bytes fail their CRC-32: damaged since the conversion")
        return copy, relative

    def raw(self, indices: Sequence[int]) -> list[bytes | None]:
        present = [int(i) for i in indices if self.valid[i]]
        blobs = self._fetch(self._starts[present].tolist(), self._stops[present].tolist())
        got = dict(zip(present, map(bytes, blobs), strict=True))
        actual = stored_crcs(list(got.values())) if got else ()
        for (i, data), crc in zip(got.items(), actual, strict=True):
            recorded = int(self._crcs[i])
            if int(crc) != recorded or len(data) != self._stops[i] - self._starts[i]:
                raise self._bad(
                    i,
                    f"stored bytes fail their CRC-32 ({int(crc):08x}, recorded {recorded:08x}): "
                    "damaged since the conversion (imgpack verify names the shard)",
                )
        return [got.get(i) for i in indices]


class ScalarColumn(FieldColumn):
    """An int or float field: typed ``values`` with ``valid``, checked against the column's
    ``crc`` when first read."""

    def __init__(
        self,
        name: str,
        spec: FieldSpec,
        where: str,
        values: np.ndarray,
        valid: np.ndarray,
        crc: int,
    ) -> None:
        super().__init__(name, spec, where, valid)
        if spec.kind not in SCALAR_KINDS or len(values) != len(valid):
            raise DatasetError(f"{where}: field {name!r}: not a typed column of {len(valid)}")
        self._values, self._crc, self._checked = values, crc, False

    def scalars(self) -> tuple[np.ndarray, np.ndarray]:
        """``(values, valid)``: the whole column (int64 or float64, uint8), checked."""
        if not self._checked:
            actual = column_crc(self._values, self.valid)
            if actual != self._crc:
                raise DatasetError(
                    f"{self.where}: field {self.name!r}: its column fails its CRC-32 "
                    f"({actual:08x}, recorded {self._crc:08x}): damaged since the conversion"
                )
            self._checked = True
        return self._values, self.valid

    def raw(self, indices: Sequence[int]) -> list[bytes | None]:
        values, valid = self.scalars()
        return [scalar_bytes(self.spec.kind, values[i]) if valid[i] else None for i in indices]

    def values(self, indices: Sequence[int]) -> list[Any]:
        values, valid = self.scalars()
        return [values[i].item() if valid[i] else None for i in indices]


Part = Callable[[str, str], np.ndarray]
"""The stored array of part ``part`` of field ``name`` (``DatasetError`` if it is absent)."""

_SCALAR_DTYPES = {"int": np.int64, "float": np.float64}
_PART_DTYPES = {
    FIELD_DATA: "u1",
    FIELD_OFFSETS: "<i8",
    FIELD_SIZES: "<i8",
    FIELD_CRCS: "<u4",
    FIELD_VALID: "u1",
    FIELD_CRC: "<u4",
}


def part_dtype(kind: str, part: str) -> np.dtype:
    """The little-endian dtype a part is stored as where a format keeps raw bytes (lmdb)."""
    if part == FIELD_VALUES:
        return np.dtype("<i8" if kind == "int" else "<f8")
    return np.dtype(_PART_DTYPES[part])


def open_columns(
    schema: Mapping[str, FieldSpec], where: str, n: int, part: Part, fetch: Fetch | None = None
) -> dict[str, FieldColumn]:
    """The columns of a shard of ``n`` samples whose parts ``part`` finds. A variable
    field's bytes are its ``data`` part sliced by ``offsets`` (``[n + 1]``), or, with
    ``fetch`` (``wds``: a read of the tar), ``offsets`` and ``sizes`` (``[n]``) locate them."""
    columns: dict[str, FieldColumn] = {}
    for name, field_spec in schema.items():
        valid = part(name, FIELD_VALID)
        if len(valid) != n:
            raise DatasetError(f"{where}: field {name!r}: {len(valid)} values for {n} samples")
        if field_spec.kind in SCALAR_KINDS:
            values, crc = part(name, FIELD_VALUES), part(name, FIELD_CRC)
            if values.dtype != _SCALAR_DTYPES[field_spec.kind] or len(crc) != 1:
                raise DatasetError(f"{where}: field {name!r}: not a typed column")
            columns[name] = ScalarColumn(name, field_spec, where, values, valid, int(crc[0]))
            continue
        offsets = part(name, FIELD_OFFSETS).astype(np.int64, copy=False)
        if fetch is None:
            data = part(name, FIELD_DATA)
            starts, stops = offsets[:-1], offsets[1:]
            if len(offsets) != n + 1 or (len(offsets) and offsets[-1] > len(data)):
                raise DatasetError(f"{where}: field {name!r}: offsets past its data")
            blob: Fetch = _slicer(data)
        else:
            starts, blob = offsets, fetch
            stops = offsets + part(name, FIELD_SIZES).astype(np.int64, copy=False)
        crcs = part(name, FIELD_CRCS)
        column = BlobColumn(name, field_spec, where, blob, starts, stops, crcs, valid)
        column.packed = data if fetch is None else None
        columns[name] = column
    return columns


def _slicer(data: np.ndarray) -> Fetch:
    def fetch(starts: list[int], stops: list[int]) -> list[memoryview]:
        return [memoryview(data[a:b]) for a, b in zip(starts, stops, strict=True)]

    return fetch
