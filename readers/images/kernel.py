"""The compiled crop kernel (``readers/images/``, its binding ``jpegcrop.c``), when it was built.

Two calls per batch, neither holding the GIL: :func:`jpeg_headers` reads every sample's
JPEG markers at once (what :func:`readers.images.jpeg.jpeg_header` reads, plus the frame's
type and components), and :func:`crop_shared`, called once by each decode thread, the
threads taking the batch's rows one at a time from a shared counter (:func:`crop_rows` for
one thread), decodes only the box of each JPEG (libjpeg's ``jpeg_crop_scanline`` and
``jpeg_skip_scanlines``; the IDCT scaled by each box's divisor, by default the
reducing-gap rule of :func:`readers.images.jpeg.crop_dct_divisors`), resizes it with a
port of torch's uint8 antialiased bilinear (bit-exact) and stores it, mirrored if asked,
straight into its batch row. Verified bytes (see :func:`crop_rows`)
whose restart markers cut every MCU row into intervals, as the converter writes them
(:func:`readers.images.decode.encode_jpeg`), decode only the intervals around the box: the
entropy decode, most of a small JPEG's cost, then skips the rows above the box and the
columns beside it. The Huffman codes of every baseline scan go through the kernel's own
decoder (``huffman.c``: a fast path across restart markers, where libjpeg-turbo's has
none, and a faster one than libjpeg-turbo's without them). :func:`decode_whole` decodes a
whole JPEG the same way (the converter's decode and resize; verified full decodes), and
:func:`resize` resizes the converter's other decoded pixels (PNGs, EXIF-rotated JPEGs,
datasets' raw pixels) as the kernel resizes a box, so that a conversion never needs torch.

A sample the kernel does not take (:func:`kernel_decodes`: EXIF-rotated, CMYK, lossless,
12-bit, incomplete...) or fails on (any libjpeg error or warning) is left to the Python
path, which judges it as before. Without the compiled module, or with ``IMGPACK_KERNEL=0``
(read once per process), everything takes the Python path, with one notice in the log.

How a call decodes is the call's own (``simd``, ``huffman`` below), never a process-wide
switch that another decode thread would see flip; ``IMGPACK_KERNEL_HUFFMAN=0`` (read once,
at import) makes libjpeg's Huffman decoder the default of calls that do not say.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import cache
from types import ModuleType
from typing import Any

import numpy as np

from readers.compiled import COMPILED_ENV, compiled_off
from readers.images.jpeg import crop_dct_divisors

__all__ = [
    "KERNEL_ENV",
    "crop_kernel",
    "crop_rows",
    "crop_shared",
    "decode_whole",
    "jpeg_headers",
    "kernel_decodes",
    "resize",
]

log = logging.getLogger(__name__)

KERNEL_ENV = COMPILED_ENV  # "0" turns the kernel off
# The columns of jpeg_headers() (the C file's H_* names).
PARSED, WIDTH, HEIGHT, ORIENTATION, FRAME, PRECISION, COMPONENTS, COMPLETE, TAKES = range(9)


@cache
def crop_kernel() -> ModuleType | None:
    """The compiled module, or None (noted once in the log) when it was not built or
    ``IMGPACK_KERNEL=0`` turns it off."""
    if compiled_off():
        log.info("%s=0: crops decode through the Python path", KERNEL_ENV)
        return None
    try:
        from readers.images import jpegcrop
    except ImportError as e:
        log.warning("the crop kernel is not built (%s); crops decode through the Python path", e)
        return None
    return jpegcrop


def jpeg_headers(kernel: ModuleType, values: Sequence[Any]) -> np.ndarray:
    """int64 ``[n, 9]``: per value, whether its JPEG markers parse (else a row of zeros, as
    for pixels or other formats), its width, height, EXIF/XMP orientation, frame marker,
    sample precision, components, whether it ends with EOI, and whether the kernel takes it
    (:func:`kernel_decodes`, before the pixel limit)."""
    out = np.empty((len(values), kernel.HEADER_FIELDS), dtype=np.int64)
    kernel.headers(list(values), out)
    return out


def kernel_decodes(headers: np.ndarray, max_pixels: int | None) -> np.ndarray:
    """Which samples the kernel takes: complete, upright, 8-bit Huffman-coded baseline or
    progressive JPEGs of one or three components (the C header walk's verdict, so that one
    converted image costs a comparison, not a dozen NumPy operations), at most ``max_pixels``
    (None: no limit)."""
    take = headers[:, TAKES] == 1
    if max_pixels is not None:
        take &= headers[:, WIDTH] * headers[:, HEIGHT] <= max_pixels
    return take


def crop_rows(
    kernel: ModuleType,
    values: Sequence[Any],
    rows: np.ndarray,
    boxes: np.ndarray,
    sizes: np.ndarray,
    out: np.ndarray,
    dct_denominator: int | np.ndarray | None = None,
    verified: bool = False,
    simd: int = -1,
    huffman: bool | None = None,
) -> np.ndarray:
    """Decode the ``boxes`` (``[n, 5]`` top, left, height, width, flip) of the JPEGs
    ``values[rows]`` (of upright ``sizes``, ``[n, 2]`` height, width) into ``out[rows]``
    (uint8 ``[n, H, W, 3]``: C-contiguous, or the HWC view of a C-contiguous ``[n, 3, H,
    W]``, which the kernel then fills plane by plane) in one call without the GIL; returns
    the rows it could not decode, for the Python path. ``dct_denominator`` (1, 2, 4, 8, one
    for every box or int64 ``[n]``, one per value) scales the IDCT of boxes inside the
    image; None: :func:`readers.images.jpeg.crop_dct_divisors` (the reducing-gap rule the
    Python path follows too). ``verified`` (the bytes passed their
    CRC-32, see :attr:`readers.formats.reader.ShardReader.verified`) stops each decode after
    the box's last row and, where restart markers allow, decodes only the intervals around
    the box; otherwise the rest is entropy-decoded too, so that damage anywhere in the file
    fails as a full decode's would. ``simd`` (the resize's instructions: 0 plain C, 1 AVX2,
    2 AVX2 by groups of four outputs; -1 the CPU's best) and ``huffman`` (the kernel's own
    Huffman decoder or libjpeg's; None: the module's ``HUFFMAN``) hold for this call only;
    all give the same pixels."""
    status = np.zeros(len(values), dtype=np.int32)
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    crop_shared(
        kernel,
        values,
        rows,
        boxes,
        sizes,
        out,
        status,
        None,
        dct_denominator,
        verified,
        simd=simd,
        huffman=huffman,
    )
    return rows[status[rows] != 0]


def crop_shared(
    kernel: ModuleType,
    values: Sequence[Any],
    rows: np.ndarray,
    boxes: np.ndarray,
    sizes: np.ndarray,
    out: np.ndarray,
    status: np.ndarray,
    next_row: np.ndarray | None,
    dct_denominator: int | np.ndarray | None = None,
    verified: bool = False,
    simd: int = -1,
    huffman: bool | None = None,
) -> None:
    """:func:`crop_rows`, as one of several decode threads' calls sharing ``rows``: given
    the same ``next_row`` (int64 ``[1]``, from 0), each call takes the next row by an
    atomic increment, so the threads finish together whatever each box costs. Writes
    ``status[row]`` (int32 ``[len(values)]``) for every row: 0, or why the Python path must
    decode it; read it once every call has returned."""
    if dct_denominator is None:
        dct_denominator = crop_dct_divisors(boxes, sizes, out.shape[1:3])
    elif np.ndim(dct_denominator) == 0:
        dct_denominator = np.full(len(values), dct_denominator, dtype=np.int64)
    planes = out.transpose(0, 3, 1, 2)
    planar = not out.flags.c_contiguous
    if planar and not planes.flags.c_contiguous:
        raise ValueError("out must be a C-contiguous NHWC array or the NHWC view of an NCHW one")
    kernel.crop(
        values if isinstance(values, list) else list(values),
        np.ascontiguousarray(rows, dtype=np.int64),
        np.ascontiguousarray(boxes, dtype=np.int64),
        np.ascontiguousarray(sizes, dtype=np.int64),
        planes if planar else out,
        status,
        *out.shape[1:3],
        np.ascontiguousarray(dct_denominator, dtype=np.int64),
        verified,
        planar,
        next_row,
        simd=simd,
        huffman=kernel.HUFFMAN if huffman is None else huffman,
    )


def decode_whole(
    module: ModuleType,
    data: Any,
    max_pixels: int | None,
    size: Callable[[int, int], tuple[int, int]] | None = None,
    dct_denominator: Callable[[int, int], int] | None = None,
    verified: bool = False,
    simd: int = -1,
    huffman: bool | None = None,
) -> np.ndarray | None:
    """The whole of the JPEG ``data`` decoded in one kernel call, as uint8 ``[H, W, 3]``,
    resized to ``size(height, width)`` (None: its own size) from a decode DCT-scaled by
    ``dct_denominator(height, width)`` (None: 1); or None where the caller's decoder must
    take it (:func:`kernel_decodes` refuses it, over ``max_pixels``, or a libjpeg error or
    warning). ``verified`` as for :func:`crop_rows`: here, the markers after the last row
    are left unread (a full decode reads every row anyway); ``simd`` and ``huffman`` as for
    :func:`crop_rows`."""
    headers = jpeg_headers(module, [data])
    if not kernel_decodes(headers, max_pixels)[0]:
        return None
    height, width = int(headers[0, HEIGHT]), int(headers[0, WIDTH])
    out_h, out_w = size(height, width) if size else (height, width)
    out = np.empty((1, out_h, out_w, 3), dtype=np.uint8)
    failed = crop_rows(
        module,
        [data],
        np.zeros(1, dtype=np.int64),
        np.array([[0, 0, height, width, 0]], dtype=np.int64),  # the whole image, unmirrored
        np.array([[height, width]], dtype=np.int64),
        out,
        dct_denominator(height, width) if dct_denominator else 1,
        verified,
        simd=simd,
        huffman=huffman,
    )
    return None if len(failed) else out[0]


def resize(
    module: ModuleType,
    pixels: np.ndarray,
    size: tuple[int, int],
    extent: tuple[float, float] | None = None,
    simd: int = -1,
) -> np.ndarray:
    """uint8 ``[H, W, 3]`` pixels that are no JPEG box (a PNG, a dataset's raw pixels)
    resized to ``size`` by the kernel's port of torch's uint8 antialiased bilinear, without
    the GIL: bit-exact with ``F.interpolate(size=size, antialias=True)`` of the whole.
    ``extent``: the ``(height, width)`` the image spans from the top-left corner of
    ``pixels`` when that is not all of it (a DCT-scaled decode), mapped onto ``size`` as
    :func:`decode_whole` maps its scaled decodes. ``simd`` as for :func:`crop_rows`."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"resize takes uint8 [H, W, 3] pixels, not {pixels.dtype} {pixels.shape}")
    height, width = pixels.shape[:2]
    out = np.empty((*size, 3), dtype=np.uint8)
    module.resize(
        np.ascontiguousarray(pixels),
        height,
        width,
        out,
        *size,
        *(extent or (height, width)),
        simd=simd,
    )
    return out
