"""Writer for ``lmdb`` files (layout: ``readers/formats/lmdb.py``, names: ``readers.spec``).

The map size starts small and doubles whenever the next transaction might not fit, so
there is no terabyte-sized guess that some filesystems refuse, and no MapFullError. The
metadata values (labels, paths, shapes) are spooled as samples arrive and read back once at
close: the writer holds at most one transaction's samples, whatever the file's size.
"""

from __future__ import annotations

from pathlib import Path

import lmdb
import numpy as np

from convert.writers.base import Layout, Record
from convert.writers.fields import ShardColumns
from convert.writers.spool import JsonList, Spool
from readers import spec
from readers.formats.checks import stored_crc
from readers.formats.field_columns import part_dtype
from readers.spec import StorageKind

__all__ = ["LmdbWriter"]

_INITIAL_MAP = 64 << 20
_TXN_BYTES = 64 << 20  # commit at least this often
_PAGE_OVERHEAD = 2  # headroom factor for B-tree pages and overflow rounding


class LmdbWriter:
    """Writes one LMDB file (``subdir=False``) of samples and metadata keys."""

    def __init__(self, path: Path, layout: Layout) -> None:
        self.path = path
        self.layout = layout
        self.env = lmdb.open(
            str(path),
            subdir=False,
            map_size=_INITIAL_MAP,
            lock=False,
            meminit=True,  # zeroed page slack: the same samples give the same bytes
            sync=False,
            map_async=True,
        )
        self.pending: list[tuple[bytes, bytes | bytearray]] = []
        self.pending_bytes = 0
        self.stored_bytes = 0
        self.n = 0
        self.labels = Spool(path)  # int64 little-endian
        # ASCII JSON (json.dumps' separators): \u escapes carry any name, even one that is
        # not valid UTF-8
        self.paths = JsonList(path, separator=", ")
        self.shapes = Spool(path)  # int64 [N, 3], raw pixels of varying shape
        self.crcs = Spool(path)  # uint32 [N], encoded samples
        self.columns = ShardColumns(layout.schema, path, spooled=True)

    def add(self, record: Record) -> None:
        data = record.data
        if isinstance(data, np.ndarray):
            self.shapes.write(np.array(data.shape, dtype="<i8").tobytes())
            data = data.tobytes()
        else:
            self.crcs.write(np.array(stored_crc(data), dtype="<u4").tobytes())
        key = spec.SAMPLE_KEY.format(self.n).encode()
        self.n += 1
        self.labels.write(np.array(record.label, dtype="<i8").tobytes())
        self.paths.append(record.path)
        self.columns.add(record)
        self.pending.append((key, data))
        self.pending_bytes += len(data)
        if self.pending_bytes >= _TXN_BYTES:
            self._commit()

    def _commit(self) -> None:
        needed = (self.stored_bytes + self.pending_bytes) * _PAGE_OVERHEAD + _INITIAL_MAP
        map_size = self.env.info()["map_size"]
        while map_size < needed:
            map_size *= 2
        self.env.set_mapsize(map_size)
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    for key, value in self.pending:
                        txn.put(key, value)
                break
            except lmdb.MapFullError:  # headroom guessed low: grow and redo the transaction
                map_size *= 2
                self.env.set_mapsize(map_size)
        self.stored_bytes += self.pending_bytes
        self.pending, self.pending_bytes = [], 0

    def close(self) -> list[str]:
        try:
            meta: list[tuple[bytes, bytes | bytearray]] = [
                (spec.LMDB_LABELS, self.labels.read()),
                (spec.LMDB_PATHS, self.paths.dumps()),
            ]
            if self.layout.kind is StorageKind.VARIABLE_PIXELS:
                meta.append((spec.LMDB_SHAPES, self.shapes.read()))
            if self.layout.kind is StorageKind.ENCODED:
                meta.append((spec.LMDB_CRCS, self.crcs.read()))
            meta.append((spec.LMDB_SIZES, self.columns.sizes.astype("<i8").tobytes()))
            for name, part, value in self.columns.parts():
                kind = self.layout.schema[name].kind
                stored = value.read() if isinstance(value, Spool) else value
                if not isinstance(stored, bytes):
                    stored = stored.astype(part_dtype(kind, part)).tobytes()
                meta.append((spec.lmdb_field_key(name, part), stored))
            for key, value in meta:
                self.pending.append((key, value))
                self.pending_bytes += len(value)
            self._commit()
            self.env.sync(True)
        finally:
            self.env.close()
            for spool in (self.labels, self.paths, self.shapes, self.crcs):
                spool.close()
            self.columns.close()
        return []
