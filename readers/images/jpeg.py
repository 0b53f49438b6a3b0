"""JPEG markers: what a JPEG's header says before any decoder is set up.

The size, the EXIF/XMP orientation and where the scan starts, read from the markers in
bounded steps (:func:`jpeg_header`, fuzzed in ``tests/test_decode.py``), and the DCT
scaling factor a decode may use: one reducing-gap rule (:data:`DCT_REDUCING_GAP`) for the
converter's resize (:func:`dct_scale`) and the readers' crops (:func:`crop_dct_divisors`,
which the compiled kernel receives per box rather than deciding itself).
:mod:`readers.images.decode` and the fused crop path (:mod:`readers.images.fused`) both
start here.
"""

from __future__ import annotations

import re
import struct

import numpy as np

__all__ = [
    "DCT_REDUCING_GAP",
    "EXIF_HEADER",
    "JPEG_EOI",
    "ORIENTATION",
    "crop_dct_divisors",
    "dct_scale",
    "exif_orientation",
    "is_jpeg",
    "jpeg_header",
    "jpeg_size",
    "xmp_orientation",
]

JPEG_MAGIC = b"\xff\xd8\xff"
JPEG_EOI = b"\xff\xd9"
EXIF_HEADER = b"Exif\0\0"
XMP_HEADER = b"http://ns.adobe.com/xap/1.0/\0"
ORIENTATION = 0x0112  # EXIF/TIFF tag
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # C4/C8/CC: DHT, JPG, DAC
_NO_LENGTH = frozenset([0x01, *range(0xD0, 0xDA), 0xFF])  # TEM, RSTn, SOI, EOI, fill
_XMP_ORIENTATION = re.compile(rb'tiff:Orientation(?:="|>)([0-9])')  # Pillow's pattern

DCT_REDUCING_GAP = 2.5
"""How many times its target a DCT-scaled decode must stay: the antialiased resize then
does the last >= 2.5x of the reduction (Pillow's ``reducing_gap`` idea). Measured on real
photos, every one stayed within 0.6 levels of torchvision's pixels at 64-512 for the
converter's ``--resize``; 2 let fine detail reach 1.69 (a gravel texture at 64), and 3
would leave 1440 px photos unscaled for 256 (docs/FORMATS.md). Crops of 2560-6000 px
photos: within 0.2 levels of a full decode on average (tests/test_crop_large.py), where
the former rule (the scaled box at least the output) gave up to 3.9."""
_DIVISORS = (8, 4, 2)


def is_jpeg(data: bytes | memoryview) -> bool:
    """True if ``data`` starts with the JPEG SOI marker (whatever the file is named)."""
    return bytes(data[:3]) == JPEG_MAGIC


def dct_scale(width: int, height: int, min_side: float | None) -> tuple[int, int]:
    """The JPEG scaling factor ``(1, d)``, ``d`` in 1, 2, 4, 8, that shrinks the image
    most while its shorter side stays at least ``min_side`` (``short / d >= min_side``, the
    rule of Pillow's ``draft``): libjpeg-turbo then reduces in the DCT domain, skipping
    most of the inverse DCT. The output is ``ceil(side / d)`` pixels a side."""
    short = min(width, height)
    for d in _DIVISORS:
        if min_side and short >= d * min_side:
            return 1, d
    return 1, 1  # (a full decode; decode_image passes no factor at all then)


def crop_dct_divisors(boxes: np.ndarray, sizes: np.ndarray, out: tuple[int, int]) -> np.ndarray:
    """int64 ``[n]``: the DCT scaling divisor (1, 2, 4, 8) to decode each crop with: the
    largest whose scaled box stays at least :data:`DCT_REDUCING_GAP` times the output
    ``out`` (height, width) in both directions (:func:`dct_scale`'s rule, for a box), and 1
    for a box reaching outside its image (padded at full size). ``boxes``: ``[n, >=4]``
    top, left, height, width; ``sizes``: ``[n, 2]`` the upright images' height, width."""
    divisors = np.ones(len(boxes), dtype=np.int64)
    if not len(boxes):  # (an empty batch's arrays may have lost their second dimension)
        return divisors
    boxes, sizes = np.asarray(boxes, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
    top, left, bh, bw = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    inside = (top >= 0) & (left >= 0) & (top + bh <= sizes[:, 0]) & (left + bw <= sizes[:, 1])
    for d in _DIVISORS[::-1]:  # 2, then 4 and 8 where they fit too
        fits = (bh >= d * DCT_REDUCING_GAP * out[0]) & (bw >= d * DCT_REDUCING_GAP * out[1])
        divisors[inside & fits] = d
    return divisors


def jpeg_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """``(height, width)`` of a JPEG as :func:`decode_image` returns it at full size
    (EXIF orientation applied), from its markers alone; None if not a parseable JPEG."""
    header = jpeg_header(bytes(data)) if is_jpeg(data) else None
    if header is None:
        return None
    width, height, orientation, _ = header
    return (width, height) if orientation in (5, 6, 7, 8) else (height, width)


def jpeg_header(data: bytes) -> tuple[int, int, int, int] | None:
    """``(width, height, orientation, offset of SOS)`` from the markers before the first
    scan; None if they don't parse.

    Cheaper than ``decode_header`` (no decompressor to set up) and bounded: every step moves
    forward. EXIF segments are joined, and XMP is the fallback, as in Pillow.
    """
    size, exif, xmp = None, b"", b""
    i, n = 2, len(data)
    while i + 4 <= n and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xDA:  # SOS: the entropy-coded data follows
            break
        if marker in _NO_LENGTH:  # no payload (0xFF: a fill byte before the marker)
            i += 1 if marker == 0xFF else 2
            continue
        length = (data[i + 2] << 8) | data[i + 3]
        if length < 2:
            return None
        start, end = i + 4, i + 2 + length  # the payload
        if marker in _SOF and size is None and length >= 7 and start + 5 <= n:
            size = struct.unpack_from(">HH", data, start + 1)[::-1]
        elif marker == 0xE1 and data.startswith(EXIF_HEADER, start):
            exif += data[start + len(EXIF_HEADER) : end]
        elif marker == 0xE1 and data.startswith(XMP_HEADER, start):
            xmp = data[start + len(XMP_HEADER) : end]
        i = end
    else:
        return None  # no SOS
    if size is None:
        return None
    orientation = exif_orientation(exif)
    if orientation is None:
        orientation = xmp_orientation(xmp)
    return *size, orientation, i


def exif_orientation(tiff: bytes) -> int | None:
    """The Orientation in IFD0 of TIFF-structured EXIF; None if absent or unreadable."""
    order = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if order is None or len(tiff) < 8:
        return None
    (ifd,) = struct.unpack_from(order + "I", tiff, 4)
    if ifd + 2 > len(tiff):
        return None
    (count,) = struct.unpack_from(order + "H", tiff, ifd)
    for entry in range(ifd + 2, min(ifd + 2 + 12 * count, len(tiff) - 11), 12):
        tag, kind, values = struct.unpack_from(order + "HHI", tiff, entry)
        if tag == ORIENTATION:  # SHORT as the spec says, or LONG; anything else is ignored
            if values != 1 or kind not in (3, 4):
                return 0
            return struct.unpack_from(order + ("H" if kind == 3 else "I"), tiff, entry + 8)[0]
    return None


def xmp_orientation(xmp: bytes) -> int:
    """The ``tiff:Orientation`` in XMP metadata, 1 (upright) if there is none."""
    match = _XMP_ORIENTATION.search(xmp)
    return int(match[1]) if match else 1
