"""The per-sample checks every read path applies: the CRC-32 a shard records for each of its
encoded samples (:func:`readers.spec.sample_crc`), compared with the bytes just read, and
the header of a raw ``wds`` sample's ``.npy`` member.

Every read of a shard goes through :meth:`readers.formats.reader.ShardReader.read` or
:func:`readers.formats.reader.read_checked` (``ds[i]``, ``__getitems__``, ``crop=``, the
stream, ``imgpack verify``), which check here, so that a damaged sample is the same
``DatasetError`` naming ``shard[index]`` whichever path reads it.

The CRC-32s of many samples are computed in one call (:func:`stored_crcs`): with the compiled
``readers/formats/crc32.c``, without the GIL and by carry-less multiplication (several times
``zlib.crc32``'s speed, which also releases and retakes the GIL per sample, which two decode
threads then hand back and forth). Without it (not built, a CPU without
PCLMULQDQ, or ``IMGPACK_KERNEL=0``), ``zlib.crc32`` per sample: the same numbers.
"""

from __future__ import annotations

import functools
import io
import math
import zlib
from collections.abc import Sequence
from types import ModuleType

import numpy as np

from readers.compiled import compiled_module
from readers.spec import DatasetError, sample_crc

__all__ = ["SampleCrcs", "npy_pixels", "raw_pixels", "stored_crc", "stored_crcs"]


@functools.cache
def _compiled_crcs() -> ModuleType | None:
    """``readers.formats.crc32`` where it was built and the CPU has PCLMULQDQ, else None."""
    crc32 = compiled_module("readers.formats.crc32", "reads use zlib.crc32")
    return crc32 if crc32 is not None and crc32.CLMUL else None


def stored_crcs(values: Sequence[bytes | memoryview]) -> np.ndarray:
    """uint32 ``[n]``: :func:`readers.spec.sample_crc` of each encoded value, in one call
    without the GIL where the compiled batch CRC-32 is built."""
    compiled = _compiled_crcs()
    if compiled is None:
        return np.fromiter((sample_crc(v) for v in values), np.uint32, len(values))
    out = np.empty(len(values), dtype=np.uint32)
    compiled.crcs(values if isinstance(values, list) else list(values), out)
    return out


def stored_crc(value: bytes | memoryview, start: int = 0) -> int:
    """``zlib.crc32(value, start)`` (:func:`readers.spec.sample_crc` of an encoded value, or
    of bytes after those of CRC ``start``), by the compiled CRC-32 where it is built: what
    the converter's writers record, a sample or a piece at a time (faster than
    ``zlib.crc32``)."""
    compiled = _compiled_crcs()
    return zlib.crc32(value, start) if compiled is None else compiled.crc(value, start)


class SampleCrcs:
    """One shard's recorded CRC-32s, or none (raw pixels, or a shard written before
    imgpack recorded them): then :meth:`check` accepts anything."""

    __slots__ = ("_crcs", "_where")

    def __init__(self, crcs: np.ndarray | None, where: str, samples: int) -> None:
        if crcs is not None and (crcs.shape != (samples,) or crcs.dtype.kind not in "iu"):
            raise DatasetError(
                f"{where}: {crcs.dtype}{list(crcs.shape)} CRC-32s for {samples} samples"
            )
        self._crcs = crcs  # as the shard keeps them: a view of the mmap'd shard for pt
        self._where = where

    @property
    def recorded(self) -> bool:
        """Whether the shard records CRC-32s (encoded samples written since they were)."""
        return self._crcs is not None

    def check_many(self, indices: Sequence[int], actual: np.ndarray) -> None:
        """:meth:`check` of samples ``indices`` at once, given their computed CRC-32s
        (uint32, :func:`stored_crcs`): one array comparison, the first mismatch named."""
        if self._crcs is None:
            return
        recorded = np.asarray(self._crcs)[np.asarray(indices, dtype=np.int64)].astype(np.int64)
        wrong = np.flatnonzero(recorded != actual)
        if len(wrong):
            k = int(wrong[0])
            self._mismatch(int(indices[k]), int(actual[k]), int(recorded[k]))

    def check(self, i: int, data: bytes | memoryview, actual: int | None = None) -> None:
        """Raise DatasetError naming ``shard[i]`` unless ``data`` has sample ``i``'s CRC
        (``actual``, when the caller computed it already: :func:`stored_crcs`)."""
        if self._crcs is None:
            return
        if actual is None:
            actual = sample_crc(data)
        recorded = int(self._crcs[i])
        if actual != recorded:
            self._mismatch(i, actual, recorded)

    def _mismatch(self, i: int, actual: int, recorded: int) -> None:
        raise DatasetError(
            f"{self._where}[{i}]: stored bytes fail their CRC-32 ({actual:08x}, recorded "
            f"{recorded:08x}): damaged since the conversion (imgpack verify names the shard)"
        )


def npy_pixels(data: bytes, where: str, shape: tuple[int, int, int] | None) -> np.ndarray:
    """The uint8 HWC pixels of a raw ``.npy`` sample (a writable copy), after checking its
    header as strictly as the writer writes it: format version, dtype, C order, 3
    channels, the dataset's fixed ``shape`` where it has one, and exactly the pixel bytes
    the shape needs (NumPy alone loads a header that claims fewer from the same bytes).

    Raises:
        DatasetError: naming ``where`` (the shard and index) and what is wrong.
    """
    header, length = _npy_header(bytes(data[: _npy_header_length(data)]))
    if isinstance(header, str):
        raise DatasetError(f"{where}: invalid .npy sample: {header}")
    dims, fortran, dtype = header
    if dtype != np.uint8 or fortran or len(dims) != 3 or dims[2] != 3:
        order = "Fortran-order " if fortran else ""
        raise DatasetError(f"{where}: .npy sample is {order}{dtype}{dims}, not uint8 HxWx3")
    if shape is not None and dims != shape:
        raise DatasetError(f"{where}: .npy sample is {dims}, this dataset's images {shape}")
    pixels = len(data) - length
    if pixels != dims[0] * dims[1] * 3:
        raise DatasetError(
            f"{where}: .npy sample holds {pixels} bytes of pixels, its shape {dims} needs "
            f"{dims[0] * dims[1] * 3}"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=length).reshape(dims).copy()


_NPY_HEADER_LIMIT = 4096  # np.save writes 128 bytes for a 3-D uint8 array


def _npy_header_length(data: bytes) -> int:
    """Bytes of the header a ``.npy`` member's first bytes announce (versions 1, 2 and 3
    store its length in 2 or 4 bytes), at most 4 KiB; for anything else a prefix that
    NumPy will refuse. (The cache of parsed headers is keyed by these bytes.)"""
    if data[:6] != b"\x93NUMPY" or len(data) < 12:
        return min(len(data), 12)
    if data[6] == 1:
        return min(10 + int.from_bytes(data[8:10], "little"), _NPY_HEADER_LIMIT)
    return min(12 + int.from_bytes(data[8:12], "little"), _NPY_HEADER_LIMIT)


@functools.lru_cache(maxsize=256)
def _npy_header(head: bytes) -> tuple[tuple[tuple[int, ...], bool, np.dtype] | str, int]:
    """``((shape, fortran_order, dtype), header length)`` parsed from the start of a
    ``.npy`` member, or ``(reason, 0)`` when it is not one. Cached: the header of every
    sample of one shape is the same bytes."""
    stream = io.BytesIO(head)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            header = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            header = np.lib.format.read_array_header_2_0(stream)
        else:
            return f"unsupported .npy version {version}", 0
    except ValueError as e:  # a wrong magic string, a header that is not a dict...
        return str(e), 0
    return header, stream.tell()


def raw_pixels(
    flat: np.ndarray | bytes | bytearray, shape: Sequence[int], where: str
) -> np.ndarray:
    """Raw stored bytes as uint8 HWC pixels of ``shape`` (a view), after checking that
    there are exactly as many as the shape needs.

    Raises:
        DatasetError: naming ``where`` (the shard and index), with both sizes.
    """
    pixels = np.frombuffer(flat, dtype=np.uint8) if not isinstance(flat, np.ndarray) else flat
    dims = tuple(int(d) for d in shape)
    needed = math.prod(dims)
    if pixels.size != needed:
        raise DatasetError(
            f"{where}: {pixels.size} bytes of raw pixels stored, shape {dims} needs {needed}"
        )
    return pixels.reshape(dims)
