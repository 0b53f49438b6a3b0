"""Writer for ``hdf5`` files (layout: ``readers/formats/hdf5.py``, names: ``readers.spec``).

Samples are appended in blocks to resizable datasets, so a single-file dataset of any size
never sits in memory. ``track_times=False`` keeps the file free of timestamps.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from convert.writers.base import Layout, Record
from convert.writers.fields import ShardColumns
from convert.writers.spool import Spool
from readers import spec
from readers.formats.checks import stored_crcs
from readers.spec import StorageKind

__all__ = ["Hdf5Writer"]

_BLOCK = 256  # samples written per h5py call


class Hdf5Writer:
    """Appends samples to one HDF5 file."""

    def __init__(self, path: Path, layout: Layout) -> None:
        self.layout = layout
        self.fixed = layout.kind is StorageKind.FIXED_PIXELS
        self.file = f = h5py.File(path, "w")

        def create(name: str, shape: tuple[int, ...], dtype, **kw) -> h5py.Dataset:
            return f.create_dataset(
                name, (0, *shape), maxshape=(None, *shape), dtype=dtype, track_times=False, **kw
            )

        if self.fixed:
            shape = layout.shape
            self.images = create(
                spec.H5_IMAGES, shape, np.uint8, chunks=(1, *shape), compression=layout.compression
            )
        else:
            self.images = create(
                spec.H5_IMAGES,
                (),
                h5py.vlen_dtype(np.uint8),
                chunks=(_BLOCK,),
                compression=layout.compression,
            )
        self.shapes = None
        if layout.kind is StorageKind.VARIABLE_PIXELS:
            self.shapes = create(spec.H5_SHAPES, (3,), np.int64, chunks=(_BLOCK, 3))
        self.crcs = None
        if layout.kind is StorageKind.ENCODED:
            self.crcs = create(spec.H5_CRCS, (), np.uint32, chunks=(_BLOCK,))
        self.labels = create(spec.H5_LABELS, (), np.int64, chunks=(_BLOCK,))
        self.paths = create(spec.H5_PATHS, (), h5py.string_dtype("utf-8"), chunks=(_BLOCK,))
        self.sizes = create(spec.H5_SIZES, (2,), np.int64, chunks=(_BLOCK, 2))
        self.columns = ShardColumns(layout.schema, path, spooled=True)
        self.pending: list[Record] = []
        self.n = 0

    def add(self, record: Record) -> None:
        self.pending.append(record)
        if len(self.pending) >= _BLOCK:
            self._flush()

    def _flush(self) -> None:
        recs, self.pending = self.pending, []
        if not recs:
            return
        i, j = self.n, self.n + len(recs)
        for d in (self.images, self.shapes, self.crcs, self.labels, self.paths, self.sizes):
            if d is not None:
                d.resize(j, axis=0)
        if self.fixed:
            self.images[i:j] = np.stack([r.data for r in recs])
        else:
            column = np.empty(len(recs), dtype=object)
            column[:] = [
                r.data.reshape(-1)
                if isinstance(r.data, np.ndarray)
                else np.frombuffer(r.data, dtype=np.uint8)
                for r in recs
            ]
            # Not ``images[i:j] = column``: h5py takes an object array whose arrays are all
            # of one length (one sample, or raw pixels of one shape) for a 2-D array.
            self.images.write_direct(column, dest_sel=np.s_[i:j])
        if self.shapes is not None:
            self.shapes[i:j] = np.array([r.data.shape for r in recs], dtype=np.int64)
        if self.crcs is not None:
            self.crcs[i:j] = stored_crcs([r.data for r in recs])
        self.labels[i:j] = np.array([r.label for r in recs], dtype=np.int64)
        # Bytes, so that a name that is not valid UTF-8 (surrogate escapes) keeps its bytes.
        self.paths[i:j] = [r.path.encode("utf-8", "surrogateescape") for r in recs]
        self.sizes[i:j] = np.array([r.size for r in recs], dtype=np.int64)
        for r in recs:
            self.columns.add(r)
        self.n = j

    def _write_fields(self) -> None:
        """Each field's parts as datasets ``fields/<name>/<part>``."""
        for name, part, value in self.columns.parts():
            key = f"{spec.H5_FIELDS}/{name}/{part}"
            if isinstance(value, Spool):  # a variable field's bytes, a piece at a time
                data = self.file.create_dataset(key, (value.nbytes,), np.uint8, track_times=False)
                for offset, piece in value.pieces():
                    data[offset : offset + len(piece)] = np.frombuffer(piece, np.uint8)
            else:
                self.file.create_dataset(key, data=value, track_times=False)

    def close(self) -> list[str]:
        try:
            self._flush()
            self._write_fields()
        finally:
            self.columns.close()
        attrs = self.file.attrs
        # For h5py users only (readers take classes from the manifest, which keeps a name
        # that is not valid UTF-8 exactly): such bytes show as U+FFFD here.
        attrs[spec.H5_ATTR_CLASSES] = [
            c.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            for c in self.layout.classes
        ]
        attrs[spec.H5_ATTR_ENCODING] = self.layout.encoding
        attrs[spec.H5_ATTR_VERSION] = spec.FORMAT_VERSION
        self.file.close()
        return []
