"""Reader for ``wds`` (WebDataset) tar shards: random access through each tar's index.

On-disk layout (names in ``readers.spec``): standard WebDataset tars ``shard-NNNNNN.tar``
whose members are ``KEY.<ext>`` (``jpg``/``png``/... encoded image, or ``npy`` raw pixels),
``KEY.cls`` (label, ASCII digits) and ``KEY.path.txt`` (source path), KEY being the
10-digit sample index. Beside each tar, ``shard-NNNNNN.tar.idx.json`` lists per sample the
data offset and size of its image member, the extension, label and path: with it the same
tars serve ``WdsDataset[i]`` by one ``pread``, and :class:`readers.WdsStream` reads them
in ascending passes. Only the index's members are read, and it accepts only the image
extensions above: anything else in a tar (``.pyd``, ``.pickle``) is never read, let alone
decoded. Any WebDataset pipeline reads the same tars. From version 2 the index also holds
``heights`` and ``widths`` (each stored image's size) and ``fields``: per field its parts
(``readers.spec``), a text/json/bytes/array value being the member
``KEY.<wds_field_ext>`` that ``offsets``/``sizes`` locate, an int or float field also a
member (for WebDataset pipelines) and read here from its typed ``values``.

In each reading process a shard's index is NumPy arrays (offsets, sizes, labels, whether
the sample is raw, and the paths as one blob, :class:`readers.formats.paths.PathTable`): about
33 bytes per sample plus its path, where the JSON's Python lists took ~224.
"""

from __future__ import annotations

import json
import os
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from readers import spec
from readers.formats.checks import SampleCrcs, npy_pixels
from readers.formats.field_columns import open_columns, part_dtype
from readers.formats.paths import PathTable
from readers.formats.reader import ShardReader, check_fetched
from readers.spec import DatasetError, Layout
from readers.storage.remote import RemoteFolder

if TYPE_CHECKING:  # the type of `out` only: the converter imports this, without torch
    import torch

__all__ = ["RangedWdsShard", "WdsShard", "missing_index", "parse_index", "read_index"]


def read_index(tar_path: str, tar_size: int) -> dict[str, list[Any]]:
    """Load the random-access index that sits beside ``tar_path`` and check every entry,
    including that it points inside the tar's ``tar_size`` bytes. The lists are Python
    objects: keep arrays of them, as :class:`WdsShard` does."""
    path = tar_path + spec.WDS_INDEX_SUFFIX
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise DatasetError(missing_index(path)) from None
    except OSError as e:
        raise DatasetError(f"{path}: missing or invalid tar index: {e}") from e
    return parse_index(data, path, tar_size)


def missing_index(where: str) -> str:
    """The message for a tar whose index ``where`` is missing: the tar may be intact."""
    return (
        f"{where}: the tar's index is missing (the tar alone cannot be read at random; "
        "copy the dataset folder whole, or convert again)"
    )


def parse_index(data: bytes, where: str, tar_size: int) -> dict[str, list[Any]]:
    """The index in ``data`` (read from ``where``), every entry checked as :func:`read_index`
    says; DatasetError naming ``where`` if it is not the writer's."""
    try:
        index = json.loads(data.decode("utf-8"))
        columns = [index[k] for k in spec.WDS_INDEX_COLUMNS]
        if not all(isinstance(c, list) and len(c) == len(columns[0]) for c in columns):
            raise ValueError("columns of different lengths")
        for k, entry in enumerate(zip(*columns, strict=True)):
            _check_index_entry(k, *entry, tar_size)
        crcs = index.get(spec.WDS_CRC_COLUMN)  # absent for raw pixels and older indexes
        if crcs is not None and not (
            isinstance(crcs, list)
            and len(crcs) == len(columns[0])
            and all(type(c) is int and 0 <= c < 1 << 32 for c in crcs)
        ):
            raise ValueError(f"{spec.WDS_CRC_COLUMN!r} is not one CRC-32 per sample")
        _check_recorded_columns(index, len(columns[0]), tar_size)
    except (ValueError, KeyError, TypeError) as e:  # (UnicodeDecodeError, JSONDecodeError)
        raise DatasetError(f"{where}: missing or invalid tar index: {e}") from e
    return index


def _check_recorded_columns(index: dict[str, Any], n: int, tar_size: int) -> None:
    """Raise ValueError unless the sizes and field parts (version 2) are lists of ``n``
    numbers, and every field member lies inside the tar."""
    lists = [index[k] for k in spec.WDS_SIZE_COLUMNS if k in index]
    fields = index.get(spec.WDS_FIELDS_KEY, {})
    if not isinstance(fields, dict) or not all(isinstance(f, dict) for f in fields.values()):
        raise ValueError(f"{spec.WDS_FIELDS_KEY!r} is not an object of fields")
    lists += [v for parts in fields.values() for k, v in parts.items() if k != spec.FIELD_CRC]
    for column in lists:
        if not isinstance(column, list) or len(column) != n:
            raise ValueError(f"a size or field column is not one value per sample ({n})")
        if not all(type(v) in (int, float) for v in column):
            raise ValueError("a size or field column holds a value that is not a number")
    for k in spec.WDS_SIZE_COLUMNS:
        if k in index and not all(type(v) is int and 0 <= v < 2**31 for v in index[k]):
            raise ValueError(f"{k!r} holds a value that is no image size")
    for name, parts in fields.items():
        located = [parts.get(spec.FIELD_OFFSETS), parts.get(spec.FIELD_SIZES)]
        if None in located:
            continue
        if not all(type(v) is int for column in located for v in column):
            raise ValueError(f"field {name!r}: offsets and sizes must be integers")
        starts, lengths = (np.asarray(c, dtype=np.int64) for c in located)
        if n and ((starts < 0) | (lengths < 0) | (starts + lengths > tar_size)).any():
            raise ValueError(f"field {name!r}: a member is not inside the {tar_size}-byte tar")


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


class WdsShard(ShardReader):
    """A tar shard read by offset through its index (``layout.shape``: the dataset's fixed
    ``[H, W, 3]`` of raw pixels, if it has one)."""

    def __init__(self, path: str, layout: Layout) -> None:
        self._path, self._shape, self._schema = path, layout.shape, layout.schema
        self._fd: int | None = os.open(path, os.O_RDONLY)
        # Closed when the shard is collected, or at interpreter exit before modules are torn
        # down (a __del__ then ran when os could be gone: "Exception ignored in __del__").
        weakref.finalize(self, os.close, self._fd)
        self._set_index(read_index(path, os.fstat(self._fd).st_size))

    def _set_index(self, index: dict[str, list[Any]]) -> None:
        self._offsets = np.asarray(index["offsets"], dtype=np.int64)
        self._sizes = np.asarray(index["sizes"], dtype=np.int64)
        self._raw = np.asarray([ext == spec.WDS_RAW_EXT for ext in index["exts"]], dtype=bool)
        self._paths = PathTable(index["paths"])
        self.labels = np.asarray(index["labels"], dtype=np.int64)
        crcs = index.get(spec.WDS_CRC_COLUMN)
        crcs_array = None if crcs is None else np.asarray(crcs, dtype=np.uint32)
        self.crcs = SampleCrcs(crcs_array, self._path, len(self.labels))
        self._npy_headers: set[bytes] = set()  # .npy headers npy_pixels accepted here
        heights, widths = (index.get(k) for k in spec.WDS_SIZE_COLUMNS)
        # int32 here (8 bytes a sample held from the open), int64 from recorded_sizes()
        both = heights is not None and widths is not None
        self._recorded = np.array([heights, widths], dtype=np.int32).T if both else None
        stored = index.get(spec.WDS_FIELDS_KEY, {})

        def part(name: str, part: str) -> np.ndarray:
            try:
                values = stored[name][part]
            except KeyError:
                raise DatasetError(
                    f"{self._path}: the index has no {part} of field {name!r}"
                ) from None
            return np.asarray(values, dtype=part_dtype(self._schema[name].kind, part))

        self.fields = open_columns(self._schema, self._path, len(self.labels), part, self._bytes)

    def _bytes(self, starts: list[int], stops: list[int]) -> list[bytes]:
        """Bytes ``[starts[k], stops[k])`` of the tar for each ``k`` (a field's members)."""
        out = []
        for start, stop in zip(starts, stops, strict=True):
            data = os.pread(self._fd, stop - start, start)  # type: ignore[arg-type]
            if len(data) != stop - start:
                raise DatasetError(f"{self._path}: a field member lies past the end of the file")
            out.append(data)
        return out

    def _value(self, i: int, data: bytes) -> bytes | np.ndarray:
        """Sample ``i``'s member bytes as :meth:`fetch` serves them: the pixels of a raw
        member, after checking its ``.npy`` header; encoded bytes as they are."""
        if self._raw[i]:
            pixels = npy_pixels(data, f"{self._path}[{i}]", self._shape)
            self._npy_headers.add(data[: len(data) - pixels.nbytes])
            return pixels
        return data

    def _member(self, i: int) -> bytes:
        size = int(self._sizes[i])
        data = os.pread(self._fd, size, int(self._offsets[i]))
        if len(data) != size:  # the index was checked at open: the tar shrank since
            raise DatasetError(f"{self._path}[{i}]: sample lies past the end of the file")
        return data

    def fetch(self, i: int) -> bytes | np.ndarray:
        return self._value(i, self._member(i))

    def read_pixels(self, idx: np.ndarray, out: torch.Tensor) -> None:
        # The pixels are the last bytes of each .npy member: read them straight into the
        # row, and the header beside them, which must be one read() accepted in this shard.
        rows = out.numpy().reshape(len(idx), -1)
        row_bytes = rows.shape[1]
        for row, i in enumerate(idx.tolist()):
            offset, size = int(self._offsets[i]), int(self._sizes[i])
            header = bytearray(max(size - row_bytes, 0))
            if self._raw[i] and header:
                got = os.preadv(self._fd, [header, rows[row]], offset)
                if got == size and bytes(header) in self._npy_headers:
                    continue
            value = self.read(i)  # a header not seen yet, or damage: judged as read() does
            if not isinstance(value, np.ndarray) or value.size != row_bytes:
                raise DatasetError(f"{self._path}[{i}]: not a raw sample of this shape")
            rows[row] = value.reshape(-1)

    def path(self, i: int) -> str:
        return self._paths[i]

    def recorded_sizes(self) -> np.ndarray | None:
        return self._recorded


class RangedWdsShard(WdsShard):
    """A tar shard in object storage, read through its index by byte ranges (requests for
    nearby samples merged, and run concurrently): no local copy of the tar is made."""

    def __init__(
        self,
        remote: RemoteFolder,
        name: str,
        tar_size: int,
        layout: Layout,
    ) -> None:
        self._path, self._fd, self._shape = remote.url_of(name), None, layout.shape
        self._schema = layout.schema
        self._remote, self._name = remote, name
        index_url = remote.url_of(name + spec.WDS_INDEX_SUFFIX)
        try:
            data = remote.read(name + spec.WDS_INDEX_SUFFIX)
        except FileNotFoundError:
            raise DatasetError(missing_index(index_url)) from None
        self._set_index(parse_index(data, index_url, tar_size))

    def fetch(self, i: int) -> bytes | np.ndarray:
        return self._fetch_many([i])[0]

    def read_many(self, indices: list[int]) -> list[bytes | np.ndarray]:
        values = self._fetch_many(indices)
        check_fetched([(self, i) for i in indices], values)
        return values

    def _fetch_many(self, indices: list[int]) -> list[bytes | np.ndarray]:
        """:meth:`fetch` of each of ``indices``, their byte ranges requested in one round."""
        starts = self._offsets[indices]
        try:
            blobs = self._remote.read_ranges(
                self._name, starts.tolist(), (starts + self._sizes[indices]).tolist()
            )
        except FileNotFoundError:  # deleted since its index was read
            raise DatasetError(f"{self._path}: shard listed in the manifest is missing") from None
        return [self._value(i, data) for i, data in zip(indices, blobs, strict=True)]

    def _bytes(self, starts: list[int], stops: list[int]) -> list[bytes]:
        """A field's members, in one round of merged range requests (as the images)."""
        if not starts:
            return []
        try:
            return self._remote.read_ranges(self._name, starts, stops)
        except FileNotFoundError:  # deleted since its index was read
            raise DatasetError(f"{self._path}: shard listed in the manifest is missing") from None

    def read_pixels(self, idx: np.ndarray, out: torch.Tensor) -> None:
        rows, indices = out.numpy().reshape(len(idx), -1), idx.tolist()
        for row, (i, value) in enumerate(zip(indices, self.read_many(indices), strict=True)):
            if not isinstance(value, np.ndarray) or value.size != rows.shape[1]:
                raise DatasetError(f"{self._path}: sample {i} is not a raw sample of this shape")
            rows[row] = value.reshape(-1)
