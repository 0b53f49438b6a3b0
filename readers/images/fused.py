"""Decode, crop and resize one stored sample straight into its row of a batch.

The box comes from a :class:`readers.images.crop.Crop`. A JPEG whose box is at least twice the
output in both directions decodes scaled down in the DCT domain (1/2, 1/4 or 1/8, the
box scaled with it), everything else at full size; the box is then copied into the row,
or resized with torch's antialiased bilinear (torchvision's ``resize`` of uint8 tensors),
and mirrored by the copy. Without DCT scaling the pixels equal a full decode followed by
the same crop and resize on the tensor; with it they differ by a few levels.

Upright, complete baseline/progressive JPEGs go to the compiled kernel
(:mod:`readers.images.kernel`): one call per decode thread for its slice of the batch, the
GIL released, only the box decoded; it places a DCT-scaled box at its exact (fractional)
position, so it comes closer to the full decode than the rounded box below. The Python
path, for everything else and wherever the kernel is missing or refuses a sample: other
upright JPEGs through libjpeg-turbo (:mod:`readers.images.turbo`); everything else, and any
JPEG libjpeg-turbo fails or warns on, decoded by :func:`readers.decode_image` (PyTurboJPEG,
else Pillow: the same judge of damaged files as every other path) and cropped from its
pixels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from readers.images.crop import Crop
from readers.images.decode import check_pixels, decode_image, decoder_name, pixel_limit
from readers.images.jpeg import JPEG_EOI, is_jpeg, jpeg_header
from readers.images.kernel import (
    HEIGHT,
    WIDTH,
    crop_kernel,
    crop_rows,
    jpeg_headers,
    kernel_decodes,
)
from readers.images.pool import DecodePool, batch_parts
from readers.images.turbo import TurboDecoder, turbo_decoder
from readers.spec import DatasetError

__all__ = [
    "Probe",
    "crop_batch",
    "crop_parts",
    "dct_factor",
    "fill_decoded",
    "fill_row",
    "place",
    "probe",
    "resize",
]


def dct_factor(box_h: int, box_w: int, out_h: int, out_w: int) -> int:
    """The largest DCT scaling divisor (8, 4, 2) that keeps the box at least the output's
    size, or 1 when the box is not resized down by 2x or more."""
    for d in (8, 4, 2):
        if box_h // d >= out_h and box_w // d >= out_w:
            return d
    return 1


def resize(pixels: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``[3, h, w]`` uint8 to ``[3, *size]``: bilinear, antialiased, as torchvision's
    ``resize`` of a uint8 tensor (torch's vectorised channels-last uint8 kernel)."""
    x = pixels[None].contiguous(memory_format=torch.channels_last)
    return F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)[0]


def place(src: np.ndarray, box: np.ndarray, out: np.ndarray) -> None:
    """Write ``box`` (top, left, height, width, flip) of the HWC pixels ``src`` into the
    HWC row ``out``: copied when it has the row's size, else resized; mirrored if asked;
    zeros where the box lies outside ``src``."""
    top, left, bh, bw, flip = (int(v) for v in box)
    h, w = src.shape[:2]
    if top < 0 or left < 0 or top + bh > h or left + bw > w:  # pad, as torchvision does
        padded = np.zeros((bh, bw, 3), dtype=np.uint8)
        y0, x0 = max(top, 0), max(left, 0)
        y1, x1 = min(top + bh, h), min(left + bw, w)
        if y1 > y0 and x1 > x0:
            padded[y0 - top : y1 - top, x0 - left : x1 - left] = src[y0:y1, x0:x1]
        src, top, left = padded, 0, 0
    view = src[top : top + bh, left : left + bw]
    if view.shape[:2] != out.shape[:2]:
        chw = torch.from_numpy(view).permute(2, 0, 1)
        view = resize(chw, out.shape[:2]).permute(1, 2, 0).numpy()
    np.copyto(out, view[:, ::-1] if flip else view)


class Probe(NamedTuple):
    """A stored sample whose upright size is known without decoding it."""

    value: bytes | np.ndarray  # a JPEG libjpeg-turbo may decode as it is, or HWC pixels
    height: int
    width: int


def probe(value: bytes | memoryview | np.ndarray, turbo: TurboDecoder | None) -> Probe | None:
    """Pixels, or an upright complete JPEG for the fast path, with its size from its
    markers; None for anything :func:`readers.decode_image` must decode first.

    Raises:
        ImageTooLargeError: the JPEG is over the decompression-bomb limit.
    """
    if isinstance(value, np.ndarray):
        return Probe(value, *value.shape[:2])
    if turbo is None or not is_jpeg(value):
        return None
    data = value if isinstance(value, bytes) else bytes(value)
    header = jpeg_header(data) if data.endswith(JPEG_EOI) else None
    if header is None or header[2] in range(2, 9):  # unparsed, or EXIF-rotated
        return None
    check_pixels(header[0], header[1], "", None)
    return Probe(data, header[1], header[0])


def fill_row(found: Probe, box: np.ndarray, out: np.ndarray, turbo: TurboDecoder | None) -> None:
    """Place ``box`` of a probed sample into the HWC row ``out``, decoding a JPEG scaled
    down in the DCT domain when the box allows.

    Raises:
        ValueError: a JPEG libjpeg-turbo rejects that Pillow cannot decode either.
    """
    if isinstance(found.value, np.ndarray):
        place(found.value, box, out)
        return
    top, left, bh, bw, flip = (int(v) for v in box)
    height, width = found.height, found.width
    inside = top >= 0 and left >= 0 and top + bh <= height and left + bw <= width
    d = dct_factor(bh, bw, *out.shape[:2]) if inside else 1
    data = np.frombuffer(found.value, dtype=np.uint8)
    pixels = turbo.decode(data, width, height, d) if turbo is not None else None
    if pixels is None:  # CMYK, damaged...: judged and decoded at full size as everywhere
        place(decode_image(found.value), box, out)
        return
    if d > 1:  # the box's edges in the scaled image, to the nearest pixel
        top, bottom = round(top / d), min(round((top + bh) / d), pixels.shape[0])
        left, right = round(left / d), min(round((left + bw) / d), pixels.shape[1])
        bh, bw = bottom - top, right - left
    place(pixels, np.array([top, left, bh, bw, flip]), out)


def fill_decoded(value: bytes | memoryview, crop: Crop, index: int, out: np.ndarray) -> None:
    """Decode a sample :func:`probe` could not size with :func:`readers.decode_image`,
    then draw its box and place it into the HWC row ``out``."""
    pixels = decode_image(value)
    box = crop.boxes(np.array([pixels.shape[:2]]), np.array([index]))[0]
    place(pixels, box, out)


def crop_batch(
    values: Sequence[bytes | memoryview | np.ndarray],
    indices: np.ndarray,
    crop: Crop,
    rows: np.ndarray,
    where: Callable[[int], str],
    verified: bool = False,
) -> None:
    """Fill ``rows`` (uint8 ``[n, H, W, 3]``) with the crops of the stored ``values`` of
    samples ``indices``, on the calling thread (a decode thread: the caller splits a batch
    into parts): sizes from the JPEG markers and every box drawn at once, then the JPEGs
    the compiled kernel takes decoded in one call without the GIL
    (:mod:`readers.images.kernel`), the rest one by one. ``verified``: the values passed
    their CRC-32 (:attr:`readers.formats.reader.ShardReader.verified`), so the kernel may
    stop decoding after each box.

    Raises:
        DatasetError: naming the sample (``where(row)``) that cannot be decoded.
    """
    turbo = turbo_decoder()
    kernel = crop_kernel() if decoder_name() == "turbojpeg" else None  # libjpeg-turbo too

    def named(row: int, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except ValueError as e:  # name the sample only when it fails: this path is hot
            raise DatasetError(f"{where(row)}: {e}") from e

    n = len(values)
    sizes = np.zeros((n, 2), dtype=np.int64)
    fast = np.zeros(n, dtype=bool)
    if kernel is not None:
        headers = jpeg_headers(kernel, values)
        fast = kernel_decodes(headers, pixel_limit(None))  # over it: probe() raises
        sizes[:, 0], sizes[:, 1] = headers[:, HEIGHT], headers[:, WIDTH]
    found: list[Probe | None] = [None] * n
    known = fast.copy()  # the rows whose size is known before decoding
    for row in np.flatnonzero(~fast):
        probed = found[row] = named(row, lambda v=values[row]: probe(v, turbo))
        if probed is not None:
            sizes[row], known[row] = (probed.height, probed.width), True
    boxes = np.zeros((n, 5), dtype=np.int64)
    if known.any():
        boxes[known] = crop.boxes(sizes[known], indices[known])
    failed = np.flatnonzero(fast)
    if kernel is not None and len(failed):
        failed = crop_rows(kernel, values, failed, boxes, sizes, rows, verified=verified)
    for row in failed:  # libjpeg failed or warned: judged as without the kernel
        data = values[row]
        height, width = (int(v) for v in sizes[row])
        found[row] = Probe(data if isinstance(data, bytes) else bytes(data), height, width)

    def fill(row: int) -> None:
        probed = found[row]
        if probed is None:
            fill_decoded(values[row], crop, int(indices[row]), rows[row])  # type: ignore[arg-type]
        else:
            fill_row(probed, boxes[row], rows[row], turbo)

    for row in sorted([*failed, *np.flatnonzero(~fast)]):  # the first failing row raises
        named(row, lambda r=row: fill(r))


def crop_parts(
    read: Callable[[slice], Sequence[bytes | memoryview | np.ndarray]],
    indices: np.ndarray,
    crop: Crop,
    rows: np.ndarray,
    where: Callable[[int], str],
    verified: bool,
    pool: DecodePool,
    threads: int,
) -> None:
    """Fill ``rows`` with the crops of samples ``indices``, the batch cut into one
    contiguous part per decode thread: each thread reads its part's stored values
    (``read(part)``; the readers release the GIL for their I/O and CRC-32s) and crops them
    (:func:`crop_batch`: one kernel call). Measured against reading the whole batch on the
    calling thread first (3 % fewer samples/s) and against reading it part by part there
    while the threads decode (slower still): docs/BENCHMARKS.md.

    Raises:
        DatasetError: for the first part, in order, with a sample (``where(row)``) that
        cannot be read or decoded.
    """

    def decode(part: slice) -> None:
        start = part.start
        named = lambda row: where(start + row)  # noqa: E731
        crop_batch(read(part), indices[part], crop, rows[part], named, verified)

    pool.map(decode, batch_parts(len(indices), threads), threads)
