"""Reader for ``hdf5`` files.

On-disk layout (names in ``readers.spec``): dataset ``images``, either uint8
``[N, H, W, 3]`` chunked one sample per chunk (raw pixels of one shape) or variable-length
uint8 ``[N]`` (encoded bytes, or flattened raw pixels with ``shapes`` int64 ``[N, 3]``);
``labels`` int64 ``[N]``; for encoded samples ``crcs`` uint32 ``[N]``, each sample's
CRC-32, checked on every read; ``paths`` variable-length UTF-8 strings (a name that is not
valid UTF-8 keeps its bytes, read back through ``surrogateescape``); from version 2
``sizes`` int64 ``[N, 2]`` (stored height, width) and the group ``fields`` holding
``<name>/<part>`` datasets for each field (the parts of ``readers.spec``); file attributes
``classes``, ``encoding`` and ``imgpack_format_version``. Optional gzip/lzf compression is
transparent to h5py. The file is opened read-only once per process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import h5py
import numpy as np

from readers import spec
from readers.formats.checks import SampleCrcs, raw_pixels
from readers.formats.field_columns import open_columns
from readers.formats.reader import ShardReader
from readers.spec import DatasetError, Layout, StorageKind

if TYPE_CHECKING:  # the type of `out` only: the converter imports this, without torch
    import torch

__all__ = ["Hdf5Shard"]


class Hdf5Shard(ShardReader):
    """An open HDF5 file of imgpack samples."""

    def __init__(self, path: str, layout: Layout) -> None:
        try:
            self._file = h5py.File(path, "r")
            self._images = self._file[spec.H5_IMAGES]
            self.labels = self._file[spec.H5_LABELS][()]
            self._paths = self._file[spec.H5_PATHS].asstr(errors="surrogateescape")
            variable = layout.kind is StorageKind.VARIABLE_PIXELS
            self._shapes = self._file[spec.H5_SHAPES][()] if variable else None
            crcs = self._file[spec.H5_CRCS][()] if spec.H5_CRCS in self._file else None
        except (OSError, KeyError, TypeError) as e:  # TypeError: paths are not strings
            raise DatasetError(f"{path}: not a valid imgpack HDF5 file: {e}") from e
        self._path = path
        self.crcs = SampleCrcs(crcs, path, len(self.labels))
        self.fields = open_columns(layout.schema, path, len(self.labels), self._field_part)
        self._vlen = self._images.ndim == 1
        self._file_bytes: np.memmap | None = None
        images = self._images
        if (
            not self._vlen
            and images.chunks == (1, *images.shape[1:])
            and (images.id.get_create_plist().get_nfilters() == 0)
        ):
            # Uncompressed, one chunk per sample: a sample is a plain byte range of the file.
            self._file_bytes = np.memmap(path, dtype=np.uint8, mode="r")
            self._chunk_offsets = np.full(len(images), -1, dtype=np.int64)
            self._sample_bytes = int(np.prod(images.shape[1:]))

    def recorded_sizes(self) -> np.ndarray | None:
        if spec.H5_SIZES not in self._file:  # before version 2
            return None
        try:
            return self._file[spec.H5_SIZES][()]
        except OSError as e:
            raise DatasetError(f"{self._path}: unreadable {spec.H5_SIZES}: {e}") from e

    def _field_part(self, name: str, part: str) -> np.ndarray | h5py.Dataset:
        """A field's part: read whole, but a variable field's bytes stay in the file (read a
        value at a time, as images are)."""
        key = f"{spec.H5_FIELDS}/{name}/{part}"
        try:
            stored = self._file[key]
            return stored if part == spec.FIELD_DATA else stored[()]
        except (KeyError, OSError) as e:
            raise DatasetError(f"{self._path}: missing or unreadable {key}: {e}") from e

    def fetch(self, i: int) -> np.ndarray | bytes:
        try:
            value = self._images[i]
        except OSError as e:
            raise self._unreadable(i, e) from e
        if not self._vlen:
            return value
        if self._shapes is not None:
            return raw_pixels(value, self._shapes[i], f"{self._path}[{i}]")
        return value.tobytes()

    def read_pixels(self, idx: np.ndarray, out: torch.Tensor) -> None:
        target = out.numpy()
        if self._file_bytes is None:  # compressed: let HDF5 decompress, one chunk per row
            for row, i in enumerate(idx.tolist()):
                try:
                    self._images.read_direct(target, np.s_[i], np.s_[row])
                except OSError as e:
                    raise self._unreadable(i, e) from e
            return
        rows = target.reshape(len(idx), -1)
        for row, i in enumerate(idx.tolist()):
            start = self._chunk_offset(i)
            rows[row] = self._file_bytes[start : start + self._sample_bytes]

    def _unreadable(self, i: int, error: OSError) -> DatasetError:
        """What h5py's OSError for a damaged chunk or heap block (a gzip chunk that does not
        inflate, a bad address) becomes: an error naming the sample."""
        return DatasetError(f"{self._path}[{i}]: unreadable sample: {error}")

    def _chunk_offset(self, i: int) -> int:
        """Byte offset of sample ``i``'s chunk in the file (looked up once, then cached)."""
        offset = int(self._chunk_offsets[i])
        if offset < 0:
            info = self._images.id.get_chunk_info_by_coord((i, 0, 0, 0))
            if info.byte_offset is None:
                raise DatasetError(f"{self._path}: sample {i} was never written")
            if info.byte_offset + self._sample_bytes > len(self._file_bytes):
                raise DatasetError(f"{self._path}: sample {i} lies past the end of the file")
            offset = self._chunk_offsets[i] = info.byte_offset
        return offset

    def path(self, i: int) -> str:
        return self._paths[i]
