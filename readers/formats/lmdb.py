"""Reader for ``lmdb`` databases.

On-disk layout (names in ``readers.spec``): one LMDB file per shard (``subdir=False``),
key ``SAMPLE_KEY`` (10 ASCII digits, so key order is index order) per sample whose value
is the stored bytes (encoded image, or raw HWC pixels); metadata keys ``__labels__``
(int64 little-endian), ``__shapes__`` (int64 ``[N, 3]``, raw pixels of varying shape) and
``__crcs__`` (uint32 little-endian, each encoded sample's CRC-32, checked on every
read), from version 2 ``__sizes__`` (int64 ``[N, 2]``, stored height and width) and one key
``__fields.<name>.<part>__`` per part of each field (little-endian arrays, the parts of
``readers.spec``), ``__paths__`` (JSON list; ASCII with ``\\u`` escapes, so that a name
that is not valid UTF-8 keeps its bytes as surrogate escapes). Opened read-only without
locking once per process; the labels (and shapes) are NumPy arrays, the paths are read on
first use into a :class:`readers.formats.paths.PathTable`.
"""

from __future__ import annotations

import json
import os
import weakref
from typing import TYPE_CHECKING

import lmdb
import numpy as np

from readers import spec
from readers.formats.checks import SampleCrcs, raw_pixels
from readers.formats.field_columns import open_columns, part_dtype
from readers.formats.paths import PathTable
from readers.formats.reader import ShardReader
from readers.spec import DatasetError, Layout, StorageKind

if TYPE_CHECKING:  # the type of `out` only: the converter imports this, without torch
    import torch

__all__ = ["LmdbShard"]


# LMDB allows one open environment per file and process: datasets on the same file share
# it, and it closes when the last of them is gone.
_open_envs: weakref.WeakValueDictionary[str, lmdb.Environment] = weakref.WeakValueDictionary()


def _close_inherited_environments() -> None:
    """In a forked child, close the copies of the parent's environments (which LMDB forbids
    using after a fork, and which would block reopening the same files)."""
    for env in list(_open_envs.values()):
        env.close()
    _open_envs.clear()


os.register_at_fork(after_in_child=_close_inherited_environments)


def _environment(path: str) -> lmdb.Environment:
    """This process's read-only environment for ``path``, shared by every dataset on it."""
    key = os.path.realpath(path)
    env = _open_envs.get(key)
    if env is None:
        try:
            env = lmdb.open(
                key, subdir=False, readonly=True, lock=False, readahead=False, meminit=False
            )
        except lmdb.Error as e:
            raise DatasetError(f"{path}: cannot open LMDB file: {e}") from e
        _open_envs[key] = env
    return env


class LmdbShard(ShardReader):
    """A read-only LMDB environment of imgpack samples."""

    def __init__(self, path: str, layout: Layout) -> None:
        self._path = path
        self._env = _environment(path)
        self.labels = np.frombuffer(self._get(spec.LMDB_LABELS), dtype="<i8")
        self._raw = layout.kind is not StorageKind.ENCODED
        self._shape = layout.shape
        if layout.kind is StorageKind.VARIABLE_PIXELS:
            self._shapes = np.frombuffer(self._get(spec.LMDB_SHAPES), dtype="<i8").reshape(-1, 3)
        crcs = self._find(spec.LMDB_CRCS)  # absent for raw pixels and older shards
        crcs_array = None if crcs is None else np.frombuffer(crcs, dtype="<u4")
        self.crcs = SampleCrcs(crcs_array, path, len(self.labels))
        self._schema = layout.schema
        self.fields = open_columns(layout.schema, path, len(self.labels), self._field_part)
        self._paths: PathTable | None = None

    def recorded_sizes(self) -> np.ndarray | None:
        sizes = self._find(spec.LMDB_SIZES)  # absent before version 2
        return None if sizes is None else np.frombuffer(sizes, dtype="<i8").reshape(-1, 2)

    def _field_part(self, name: str, part: str) -> np.ndarray:
        """A field's part: one metadata value, read once (a variable field's bytes are
        sliced from it)."""
        value = self._get(spec.lmdb_field_key(name, part))
        dtype = part_dtype(self._schema[name].kind, part)
        if len(value) % dtype.itemsize:
            raise DatasetError(f"{self._path}: field {name!r}: {part} is not {dtype} values")
        return np.frombuffer(value, dtype=dtype)

    def _find(self, key: bytes, txn: lmdb.Transaction | None = None) -> bytes | None:
        """The value of ``key`` (in ``txn``, else a transaction of its own), or None."""
        try:
            if txn is not None:
                return txn.get(key)
            with self._env.begin() as own:
                return own.get(key)
        except lmdb.Error as e:  # a damaged page (MDB_CORRUPTED, MDB_PAGE_NOTFOUND)
            raise DatasetError(f"{self._path}: cannot read key {key.decode()!r}: {e}") from e

    def _get(self, key: bytes, txn: lmdb.Transaction | None = None) -> bytes:
        value = self._find(key, txn)
        if value is None:
            raise DatasetError(f"{self._path}: missing key {key.decode()!r}")
        return value

    def fetch(self, i: int) -> bytes | np.ndarray:
        value = self._get(spec.SAMPLE_KEY.format(i).encode())
        if not self._raw:
            return value
        shape = self._shape if self._shape is not None else self._shapes[i]
        return raw_pixels(bytearray(value), shape, f"{self._path}[{i}]")

    def read_pixels(self, idx: np.ndarray, out: torch.Tensor) -> None:
        flat = out.numpy().reshape(len(idx), -1)
        with self._env.begin(buffers=True) as txn:  # one transaction, values not copied
            for row, i in enumerate(idx.tolist()):
                value = self._get(spec.SAMPLE_KEY.format(i).encode(), txn)
                flat[row] = raw_pixels(value, self._shape, f"{self._path}[{i}]").reshape(-1)

    def path(self, i: int) -> str:
        if self._paths is None:
            value = self._get(spec.LMDB_PATHS)
            try:
                self._paths = PathTable(json.loads(value))
            except (ValueError, AttributeError) as e:  # not JSON, UTF-8, or a list of str
                raise DatasetError(f"{self._path}: invalid {spec.LMDB_PATHS.decode()}: {e}") from e
        return self._paths[i]
