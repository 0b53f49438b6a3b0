"""The compiled JPEG crop kernel (``readers/images/jpegcrop.c``; see :mod:`readers.images.kernel`).

Every call releases the GIL around its work; buffers are NumPy arrays (or any C-contiguous
buffer) of the dtypes named.
"""

from typing_extensions import Buffer

HEADER_FIELDS: int
"""Columns of :func:`headers` (9)."""
SIMD: int
"""The best resize level this CPU has: 2 AVX2 by groups, 1 AVX2, 0 plain C."""
OWN_HUFFMAN: int
"""1 where huffman.c was built (the libjpeg-turbo it was written against), else 0."""
HUFFMAN: int
"""The Huffman decoder of calls that do not say: 1 huffman.c, 0 libjpeg's
(``IMGPACK_KERNEL_HUFFMAN=0``, read at import, or no OWN_HUFFMAN)."""
LIBJPEG_TURBO_VERSION: int
"""LIBJPEG_TURBO_VERSION_NUMBER of the headers it was built with (0: another libjpeg)."""

def headers(values: list[object], out: Buffer, /) -> None:
    """int64 ``[n, 9]`` of each value's JPEG markers; zeros where not bytes-like or unparsed."""

def crop(
    values: list[bytes | bytearray | memoryview],
    rows: Buffer,
    boxes: Buffer,
    sizes: Buffer,
    out: Buffer,
    status: Buffer,
    out_h: int,
    out_w: int,
    dct: Buffer | None = None,
    verified: bool = False,
    planar: bool = False,
    next: Buffer | None = None,
    *,
    simd: int = -1,
    huffman: bool = ...,
) -> None:
    """Decode, crop, resize and mirror ``values[row]`` into ``out[row]`` for each of the int64
    ``rows``; int32 ``status[row]`` 0 or why another decoder must take it."""

def encode(pixels: Buffer, height: int, width: int, quality: int, restart: int, /) -> bytes:
    """uint8 RGB rows as a baseline 4:2:0 JPEG, a restart marker every ``restart`` MCUs."""

def resize(
    pixels: Buffer,
    height: int,
    width: int,
    out: Buffer,
    out_h: int,
    out_w: int,
    extent_h: float,
    extent_w: float,
    *,
    simd: int = -1,
) -> None:
    """uint8 HWC ``pixels`` resized into ``out`` with torch's uint8 antialiased bilinear; the
    top-left ``extent_h`` x ``extent_w`` of the pixels is the image."""
