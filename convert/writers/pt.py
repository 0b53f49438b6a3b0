"""Writer for ``pt`` shards (layout: ``readers/formats/pt.py``, names: ``readers.spec``).

A shard is the zip archive that ``torch.save`` writes for a dict of plain tensors, so it
loads with ``weights_only=True``; but the shard is never held in memory. Each tensor's
bytes go to a :class:`~convert.writers.spool.Spool` as samples arrive. At close,
``torch.save`` writes the archive under ``torch.serialization.skip_data()`` from
``torch.empty`` tensors (never touched, so they take no memory), which leaves a hole where
each tensor's bytes go; the spools are copied into the holes, and what ``skip_data`` left
unset is patched: each record's CRC-32 (in its data descriptor and in the central
directory) and ``.data/serialization_id``, which combines them. The file is byte for byte
what ``torch.save`` of the whole dict writes (``tests/test_memory.py`` checks it); a torch
that lays the archive out otherwise is refused at the first shard, not written wrongly.
"""

from __future__ import annotations

import os
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from convert.writers.base import Layout, Record
from convert.writers.fields import ShardColumns
from convert.writers.spool import Spool
from readers import spec
from readers.formats.checks import stored_crc
from readers.spec import StorageKind

__all__ = ["PtWriter"]

_BYTE_TENSORS = {spec.PT_PATHS, spec.PT_IMAGES, spec.PT_DATA}  # uint8; the others int64


class PtWriter:
    """Streams one shard's tensors to spools and lays them out as a ``torch.save`` file."""

    def __init__(self, path: Path, layout: Layout) -> None:
        self.path = path
        self.layout = layout
        names = [spec.PT_LABELS, spec.PT_PATHS, spec.PT_PATH_OFFSETS]  # torch.save's order
        if layout.kind is StorageKind.FIXED_PIXELS:
            names.append(spec.PT_IMAGES)
        else:
            if layout.kind is StorageKind.VARIABLE_PIXELS:
                names.append(spec.PT_SHAPES)
            names += [spec.PT_DATA, spec.PT_OFFSETS]
        if layout.kind is StorageKind.ENCODED:
            names.append(spec.PT_CRCS)
        self.spools = {name: Spool(path) for name in names}
        self.columns = ShardColumns(layout.schema, path, spooled=True)
        self.n = 0
        self.path_bytes = 0
        self.data_bytes = 0
        self._put(spec.PT_PATH_OFFSETS, 0)
        if spec.PT_OFFSETS in self.spools:
            self._put(spec.PT_OFFSETS, 0)

    def _put(self, name: str, *values: int) -> None:
        # int64 in native byte order, as torch.save stores the tensor (struct: cheaper than
        # a NumPy array per value)
        self.spools[name].write(struct.pack(f"={len(values)}q", *values))

    def add(self, record: Record) -> None:
        self._put(spec.PT_LABELS, record.label)
        path = record.path.encode("utf-8", "surrogateescape")
        self.spools[spec.PT_PATHS].write(path)
        self.path_bytes += len(path)
        self._put(spec.PT_PATH_OFFSETS, self.path_bytes)
        data = record.data
        if isinstance(data, np.ndarray):
            if self.layout.kind is StorageKind.FIXED_PIXELS and data.shape != self.layout.shape:
                raise ValueError(f"{record.path}: {data.shape} pixels, not {self.layout.shape}")
            if spec.PT_SHAPES in self.spools:
                self._put(spec.PT_SHAPES, *data.shape)
            data = memoryview(np.ascontiguousarray(data)).cast("B")
        if spec.PT_IMAGES in self.spools:
            self.spools[spec.PT_IMAGES].write(data)
        else:
            self.spools[spec.PT_DATA].write(data)
            self.data_bytes += len(data)
            self._put(spec.PT_OFFSETS, self.data_bytes)
        if spec.PT_CRCS in self.spools:
            self._put(spec.PT_CRCS, stored_crc(data))
        self.columns.add(record)
        self.n += 1

    def close(self) -> list[str]:
        try:
            n, shape = self.n, self.layout.shape or ()
            sizes = {
                spec.PT_LABELS: (n,),
                spec.PT_PATHS: (self.path_bytes,),
                spec.PT_PATH_OFFSETS: (n + 1,),
                spec.PT_IMAGES: (n, *shape),
                spec.PT_SHAPES: (n, 3),
                spec.PT_DATA: (self.data_bytes,),
                spec.PT_OFFSETS: (n + 1,),
                spec.PT_CRCS: (n,),
            }
            tensors = [
                (name, sizes[name], torch.uint8 if name in _BYTE_TENSORS else torch.int64, spool)
                for name, spool in self.spools.items()
            ]
            tensors += self._recorded_columns()
            skeleton = {name: torch.empty(size, dtype=dtype) for name, size, dtype, _ in tensors}
            with torch.serialization.skip_data():
                torch.save(skeleton, self.path)
            _fill_archive(self.path, [spool for *_, spool in tensors])
        finally:
            for spool in self.spools.values():
                spool.close()
            self.columns.close()
        return []

    def _recorded_columns(self) -> list[tuple[str, tuple[int, ...], torch.dtype, Spool]]:
        """The sizes, then each field's parts, as ``(key, shape, dtype, spool)``."""
        parts = [(spec.PT_SIZES, self.columns.sizes)]
        parts += [(spec.field_key(name, part), v) for name, part, v in self.columns.parts()]
        out = []
        for key, value in parts:
            if isinstance(value, Spool):  # a variable field's bytes
                out.append((key, (value.nbytes,), torch.uint8, value))
                continue
            spool = self.spools[key] = Spool(self.path)  # closed with the others
            spool.write(memoryview(np.ascontiguousarray(value)).cast("B"))
            out.append((key, value.shape, torch.from_numpy(value[:0].copy()).dtype, spool))
        return out


# --- the zip archive torch.save writes --------------------------------------------------
_LOCAL = struct.Struct("<4s22xHH")  # signature ... name length, extra length
_CENTRAL = struct.Struct("<4s12xI8xHHH12x")  # signature ... CRC-32 ... name/extra/comment
_DESCRIPTOR = b"PK\x07\x08"  # data descriptor after each record's bytes: CRC-32, sizes
_SERIALIZATION_ID = ".data/serialization_id"
_MASK = (1 << 64) - 1


@dataclass
class _Entry:
    name: str
    start: int  # offset of the record's bytes
    size: int
    crc: int
    descriptor: int  # offset of its data descriptor; -1 for an empty record, which has none
    central: int  # offset of its central directory header


def _entries(fd: int, path: Path) -> list[_Entry]:
    """The archive's records in the order written, located byte for byte."""
    with zipfile.ZipFile(path) as archive:
        infos, position = archive.infolist(), archive.start_dir
    entries = []
    for info in infos:
        signature, crc, name_len, extra_len, comment_len = _CENTRAL.unpack(
            os.pread(fd, _CENTRAL.size, position)
        )
        local_sig, local_name, local_extra = _LOCAL.unpack(
            os.pread(fd, _LOCAL.size, info.header_offset)
        )
        start = info.header_offset + _LOCAL.size + local_name + local_extra
        # an empty record (a field no sample of the shard has) is written whole, CRC 0, with
        # no data descriptor after it
        descriptor = start + info.file_size if info.file_size else -1
        signatures = (signature, local_sig) == (b"PK\x01\x02", b"PK\x03\x04")
        if not signatures or (descriptor >= 0 and os.pread(fd, 4, descriptor) != _DESCRIPTOR):
            raise _unknown_layout(path, f"record {info.filename} is not where expected")
        entries.append(_Entry(info.filename, start, info.file_size, crc, descriptor, position))
        position += _CENTRAL.size + name_len + extra_len + comment_len
    return entries


def _hash_combine(records: list[_Entry]) -> int:
    """c10::hash_combine folded over the records' CRC-32s, as the serialization id has it
    (an empty record, written in no chunk, adds nothing)."""
    seed = 0
    for crc in (e.crc for e in records if e.size):
        seed = (seed ^ ((crc + 0x9E3779B9 + (seed << 6) + (seed >> 2)) & _MASK)) & _MASK
    return seed


def _set_crc(fd: int, entry: _Entry, crc: int) -> None:
    packed = struct.pack("<I", crc)
    os.pwrite(fd, packed, entry.descriptor + 4)
    os.pwrite(fd, packed, entry.central + 16)
    entry.crc = crc


def _fill_archive(path: Path, spools: list[Spool]) -> None:
    """Copy the spools into the holes ``skip_data`` left (storage ``k`` is the ``k``-th
    tensor of the dict) and patch the CRCs and the serialization id."""
    with open(path, "r+b") as f:
        fd = f.fileno()
        entries = _entries(fd, path)
        *records, last = entries
        if not last.name.endswith("/" + _SERIALIZATION_ID) or last.size != 40:
            raise _unknown_layout(path, f"the last record is {last.name}")
        serialization_id = os.pread(fd, last.size, last.start)
        if serialization_id[20:] != b"%020d" % _hash_combine(records):
            raise _unknown_layout(path, "its serialization id is not derived as expected")
        prefix = last.name[: -len(_SERIALIZATION_ID)]
        by_name = {e.name: e for e in records}
        for k, spool in enumerate(spools):
            entry = by_name.get(f"{prefix}data/{k}")
            if entry is None or entry.size != spool.nbytes:
                raise _unknown_layout(path, f"no record of {spool.nbytes} bytes for tensor {k}")
            if spool.nbytes:  # an empty record holds nothing, and its CRC is 0 already
                _set_crc(fd, entry, spool.copy_to(fd, entry.start))
        serialization_id = serialization_id[:20] + b"%020d" % _hash_combine(records)
        os.pwrite(fd, serialization_id, last.start)
        _set_crc(fd, last, zlib.crc32(serialization_id))


def _unknown_layout(path: Path, what: str) -> RuntimeError:
    return RuntimeError(
        f"{path}: torch {torch.__version__} lays out torch.save archives in a way this "
        f"imgpack does not know ({what}); convert to another format or use a tested torch"
    )
