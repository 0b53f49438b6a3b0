"""Reader for ``pt`` shards: dicts of tensors written by ``torch.save``.

On-disk layout (names in ``readers.spec``): ``images`` uint8 ``[N, H, W, 3]`` when every
sample is raw pixels of one shape; otherwise ``data`` uint8 (samples back to back) with
``offsets`` int64 ``[N + 1]`` and, for raw pixels, ``shapes`` int64 ``[N, 3]``. Always
``labels`` int64 ``[N]`` and ``paths``/``path_offsets`` (UTF-8 source paths; a name that
is not valid UTF-8 keeps its bytes, read back through ``surrogateescape``); for encoded
samples ``crcs`` int64 ``[N]``, each sample's CRC-32, checked on every read; from version 2
``sizes`` int64 ``[N, 2]`` (stored height, width) and each field's parts as tensors
``fields.<name>.<part>`` (``readers.spec``: ``data`` uint8, ``offsets`` int64 ``[N + 1]``,
``crcs`` uint32, ``valid`` uint8; or ``values``, ``valid``, ``crc``). Each shard
is opened once per process with ``torch.load(mmap=True, weights_only=True)``: no pickle
code runs, and reads are slices of the page cache, not whole-file loads.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os

import numpy as np
import torch

from readers import spec
from readers.formats.checks import SampleCrcs, raw_pixels
from readers.formats.field_columns import open_columns
from readers.formats.reader import ShardReader
from readers.spec import DatasetError, Layout, StorageKind

__all__ = ["PtShard"]


class PtShard(ShardReader):
    """An mmap'd ``.pt`` shard."""

    def __init__(self, path: str, layout: Layout) -> None:
        try:
            tensors = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except Exception as e:  # whatever a damaged or hostile file makes torch.load raise
            # (the weights-only unpickler refuses code with pickle.UnpicklingError)
            raise DatasetError(f"{path}: not a valid imgpack .pt shard: {e}") from e
        if not isinstance(tensors, dict) or not all(
            isinstance(v, torch.Tensor) for v in tensors.values()
        ):
            raise DatasetError(f"{path}: not a valid imgpack .pt shard (expected tensors)")
        self._path = path
        self._t = tensors
        self.labels = self._get(spec.PT_LABELS).numpy()
        self._images = tensors.get(spec.PT_IMAGES)
        if self._images is None:
            self._data = self._get(spec.PT_DATA).numpy()
            self._offsets = self._get(spec.PT_OFFSETS).numpy()
            variable = layout.kind is StorageKind.VARIABLE_PIXELS
            self._shapes = tensors[spec.PT_SHAPES].numpy() if variable else None
        crcs = tensors.get(spec.PT_CRCS)
        self.crcs = SampleCrcs(None if crcs is None else crcs.numpy(), path, len(self.labels))
        self._sizes = tensors.get(spec.PT_SIZES)  # a view of the mmap'd shard
        self.fields = open_columns(layout.schema, path, len(self.labels), self._field_part)

    def _get(self, key: str) -> torch.Tensor:
        try:
            return self._t[key]
        except KeyError:
            raise DatasetError(f"{self._path}: missing tensor {key!r}") from None

    def recorded_sizes(self) -> np.ndarray | None:
        return None if self._sizes is None else self._sizes.numpy()

    def release_pages(self) -> None:
        # Every tensor is a view of the one private, read-only-used mapping of the file
        # (no read writes to it: fetch copies what a caller may change), so dropping its
        # pages loses nothing: a later read faults them in again from the page cache.
        # The span of the tensors must fit in the file: else they are not one mapping.
        storages = [s for t in self._t.values() if (s := t.untyped_storage()).nbytes()]
        if not storages:
            return
        start = min(s.data_ptr() for s in storages)
        size = max(s.data_ptr() + s.nbytes() for s in storages) - start
        if size <= os.path.getsize(self._path):
            _drop_pages(start, size)

    def _field_part(self, name: str, part: str) -> np.ndarray:
        return self._get(spec.field_key(name, part)).numpy()

    def fetch(self, i: int) -> memoryview | np.ndarray:
        # Copies: the caller may change an image in place; the shard's pages must not change.
        if self._images is not None:
            return self._images[i].numpy().copy()
        chunk = self._data[self._offsets[i] : self._offsets[i + 1]]
        if self._shapes is not None:
            return raw_pixels(chunk, self._shapes[i], f"{self._path}[{i}]").copy()
        return memoryview(chunk)

    def read_pixels(self, idx: np.ndarray, out: torch.Tensor) -> None:
        torch.index_select(self._images, 0, torch.from_numpy(idx), out=out)

    def path(self, i: int) -> str:
        offsets = self._get(spec.PT_PATH_OFFSETS)
        data = self._get(spec.PT_PATHS)
        return bytes(data[offsets[i] : offsets[i + 1]].numpy()).decode("utf-8", "surrogateescape")


def _drop_pages(address: int, size: int) -> None:
    """``madvise(MADV_DONTNEED)`` over the whole pages of ``[address, address + size)`` of
    a file mapping; nothing where the platform has no ``madvise`` (Windows)."""
    advice = getattr(mmap, "MADV_DONTNEED", None)
    libc = _libc()
    if advice is None or libc is None:
        return
    page = mmap.PAGESIZE
    first, end = address // page * page, -(-(address + size) // page) * page
    libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(end - first), advice)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError, TypeError):
        return None
    return libc
