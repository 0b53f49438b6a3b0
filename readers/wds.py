"""Reader for ``wds`` (WebDataset) tar shards: random access through each tar's index.

On-disk layout (names in ``readers.spec``): standard WebDataset tars ``shard-NNNNNN.tar``
whose members are ``KEY.<ext>`` (``jpg``/``png``/... encoded image, or ``npy`` raw pixels),
``KEY.cls`` (label, ASCII digits) and ``KEY.path.txt`` (source path), KEY being the
10-digit sample index. Beside each tar, ``shard-NNNNNN.tar.idx.json`` lists per sample the
data offset and size of its image member, the extension, label and path: with it the same
tars serve ``WdsDataset[i]`` by one ``pread``, and :class:`readers.WdsStream` reads them
in ascending passes. Only the index's members are read, and it accepts only the image
extensions above: anything else in a tar (``.pyd``, ``.pickle``) is never read, let alone
decoded. Any WebDataset pipeline reads the same tars.

In each reading process a shard's index is NumPy arrays (offsets, sizes, labels, whether
the sample is raw, and the paths as one blob, :class:`readers.paths.PathTable`): about
33 bytes per sample plus its path, where the JSON's Python lists took ~224.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any

import numpy as np
import torch

from readers import spec
from readers.base import ImageDataset
from readers.paths import PathTable
from readers.spec import DatasetError

__all__ = ["WdsDataset", "read_index"]

_INDEX_COLUMNS = ("offsets", "sizes", "exts", "labels", "paths")


def read_index(tar_path: str, tar_size: int) -> dict[str, list[Any]]:
    """Load the random-access index that sits beside ``tar_path`` and check every entry,
    including that it points inside the tar's ``tar_size`` bytes. The lists are Python
    objects: keep arrays of them, as :class:`WdsShard` does."""
    path = tar_path + spec.WDS_INDEX_SUFFIX
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
        columns = [index[k] for k in _INDEX_COLUMNS]
        if not all(isinstance(c, list) and len(c) == len(columns[0]) for c in columns):
            raise ValueError("columns of different lengths")
        for k, entry in enumerate(zip(*columns, strict=True)):
            _check_index_entry(k, *entry, tar_size)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DatasetError(f"{path}: missing or invalid tar index: {e}") from e
    return index


def _check_index_entry(
    k: int, offset: Any, size: Any, ext: Any, label: Any, path: Any, tar_size: int
) -> None:
    """Raise ValueError for an entry the writer would not write: a damaged or hand-made
    index must not make a read return bytes from beyond the tar, nor a label of any type."""
    in_tar = type(offset) is int and type(size) is int and 0 <= offset <= offset + size <= tar_size
    if not in_tar:
        raise ValueError(
            f"sample {k}: {size!r} bytes at {offset!r} are not inside the {tar_size}-byte tar"
        )
    if ext not in spec.WDS_IMAGE_EXTS or type(label) is not int or not isinstance(path, str):
        raise ValueError(f"sample {k}: invalid extension, label or path")


def _npy_to_array(data: bytes, name: str) -> np.ndarray:
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as e:
        raise DatasetError(f"{name}: invalid .npy sample: {e}") from e
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise DatasetError(f"{name}: .npy sample is {array.dtype}{array.shape}, not uint8 HxWx3")
    return array


class WdsShard:
    """A tar shard read by offset through its index."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd = os.open(path, os.O_RDONLY)
        index = read_index(path, os.fstat(self._fd).st_size)
        self._offsets = np.asarray(index["offsets"], dtype=np.int64)
        self._sizes = np.asarray(index["sizes"], dtype=np.int64)
        self._raw = np.asarray([ext == spec.WDS_RAW_EXT for ext in index["exts"]], dtype=bool)
        self._paths = PathTable(index["paths"])
        self.labels = np.asarray(index["labels"], dtype=np.int64)

    def read(self, i: int) -> bytes | np.ndarray:
        size = int(self._sizes[i])
        data = os.pread(self._fd, size, int(self._offsets[i]))
        if len(data) != size:  # the index was checked at open: the tar shrank since
            raise DatasetError(f"{self._path}: sample {i} lies past the end of the file")
        if self._raw[i]:
            return _npy_to_array(data, f"{self._path}[{i}]")
        return data

    def read_pixels(self, idx: np.ndarray, out: torch.Tensor) -> None:
        # The pixels are the last bytes of each .npy member: read them straight into the row.
        rows = out.numpy().reshape(len(idx), -1)
        row_bytes = rows.shape[1]
        for row, i in enumerate(idx.tolist()):
            offset, size = int(self._offsets[i]), int(self._sizes[i])
            if not self._raw[i] or size < row_bytes:
                raise DatasetError(f"{self._path}: sample {i} is not a raw sample of this shape")
            got = os.preadv(self._fd, [rows[row]], offset + size - row_bytes)
            if got != row_bytes:
                raise DatasetError(f"{self._path}: sample {i} lies past the end of the file")

    def path(self, i: int) -> str:
        return self._paths[i]

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)


class WdsDataset(ImageDataset):
    """Map-style, random-access dataset over WebDataset tars (through their indexes)."""

    format = "wds"

    def open_shard(self, index: int) -> WdsShard:
        return WdsShard(str(self.manifest.shard_path(index)))
