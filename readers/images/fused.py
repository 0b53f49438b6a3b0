"""Decode, crop and resize one stored sample straight into its row of a batch.

The box comes from a :class:`readers.images.crop.Crop`. A JPEG whose box stays at least
:data:`readers.images.jpeg.DCT_REDUCING_GAP` times the output in both directions once
scaled down in the DCT domain (1/2, 1/4 or 1/8) decodes so scaled, as the converter's
resize does (:func:`readers.images.jpeg.crop_dct_divisors`, decided once per batch for
both paths), everything else at full size; the box is then copied into the row, or
resized with torch's antialiased bilinear (torchvision's ``resize`` of uint8 tensors), and
mirrored by the copy. Without DCT scaling the pixels equal a full decode followed by the
same crop and resize on the tensor; with it they stay within a fraction of a level on
average (the antialiased resize still does the last >= 2.5x).

Upright, complete baseline/progressive JPEGs go to the compiled kernel
(:mod:`readers.images.kernel`): one call per decode thread, the threads taking the batch's
JPEGs one at a time from a shared counter, the GIL released, only the box decoded; it
places a DCT-scaled box at its exact (fractional) position. So does the Python path
(Pillow's resize of the box's fractional edges: torch's filter), for everything else and
wherever the kernel is missing or refuses a sample: other upright JPEGs through
libjpeg-turbo (:mod:`readers.images.turbo`); everything else, and any JPEG libjpeg-turbo
fails or warns on, decoded by :func:`readers.decode_image` (PyTurboJPEG, else Pillow: the
same judge of damaged files as every other path) and cropped from its pixels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from functools import partial
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from readers.images.crop import Crop
from readers.images.decode import check_pixels, decode_image, decoder_name, pixel_limit
from readers.images.jpeg import JPEG_EOI, crop_dct_divisors, is_jpeg, jpeg_header
from readers.images.kernel import (
    HEIGHT,
    WIDTH,
    crop_kernel,
    crop_shared,
    jpeg_headers,
    kernel_decodes,
)
from readers.images.pool import DecodePool, batch_parts
from readers.images.turbo import TurboDecoder, turbo_decoder
from readers.spec import DatasetError

__all__ = [
    "CropPlan",
    "CropsUnderWay",
    "Probe",
    "crop_python",
    "fill_decoded",
    "fill_row",
    "place",
    "place_scaled",
    "plan_crops",
    "probe",
    "resize",
    "start_crops",
]


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


def place_scaled(pixels: np.ndarray, box: np.ndarray, divisor: int, out: np.ndarray) -> None:
    """Write ``box`` (top, left, height, width, flip, in full-size pixels, inside the image)
    of the HWC ``pixels`` decoded DCT-scaled by ``divisor`` into the HWC row ``out``: the
    box at its exact fractional position in the scaled pixels, as the kernel places it,
    resized by Pillow's antialiased bilinear (torch's filter and weights, rounded alike to
    within a level), mirrored if asked."""
    top, left, bh, bw, flip = (int(v) for v in box)
    edges = (left / divisor, top / divisor, (left + bw) / divisor, (top + bh) / divisor)
    size = (out.shape[1], out.shape[0])
    view = np.asarray(Image.fromarray(pixels).resize(size, Image.Resampling.BILINEAR, edges))
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


def fill_row(
    found: Probe, box: np.ndarray, out: np.ndarray, turbo: TurboDecoder | None, divisor: int = 1
) -> None:
    """Place ``box`` of a probed sample into the HWC row ``out``, decoding a JPEG scaled
    down in the DCT domain by ``divisor`` (:func:`readers.images.jpeg.crop_dct_divisors`).

    Raises:
        ValueError: a JPEG libjpeg-turbo rejects that Pillow cannot decode either.
    """
    if isinstance(found.value, np.ndarray):
        place(found.value, box, out)
        return
    data = np.frombuffer(found.value, dtype=np.uint8)
    pixels = turbo.decode(data, found.width, found.height, divisor) if turbo else None
    if pixels is None:  # CMYK, damaged...: judged and decoded at full size as everywhere
        place(decode_image(found.value), box, out)
    elif divisor > 1:
        place_scaled(pixels, box, divisor, out)
    else:
        place(pixels, box, out)


def fill_decoded(value: bytes | memoryview, crop: Crop, index: int, out: np.ndarray) -> None:
    """Decode a sample :func:`probe` could not size with :func:`readers.decode_image`,
    then draw its box and place it into the HWC row ``out``."""
    pixels = decode_image(value)
    box = crop.boxes(np.array([pixels.shape[:2]]), np.array([index]))[0]
    place(pixels, box, out)


class CropPlan(NamedTuple):
    """A batch's crops, decided before any decode (:func:`plan_crops`)."""

    kernel: ModuleType | None  # the compiled crop kernel, where it and libjpeg-turbo are
    fast: np.ndarray  # bool [n]: the rows the kernel takes
    found: list[Probe | None]  # the others: probed for the Python path, or None (not sized)
    sizes: np.ndarray  # int64 [n, 2]: upright height, width, where known
    boxes: np.ndarray  # int64 [n, 5]: top, left, height, width, flip, where known
    divisors: np.ndarray  # int64 [n]: each JPEG's DCT scaling, for the kernel and Python alike


def _named(where: Callable[[int], str], row: int, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ValueError as e:  # name the sample only when it fails: this path is hot
        raise DatasetError(f"{where(row)}: {e}") from e


def plan_crops(
    values: Sequence[bytes | memoryview | np.ndarray],
    indices: np.ndarray,
    crop: Crop,
    where: Callable[[int], str],
) -> CropPlan:
    """Every sample's size, from its JPEG markers (one kernel call for the batch) or a
    probe, and every box drawn at once.

    Raises:
        DatasetError: naming the first sample (``where(row)``) over the pixel limit.
    """
    kernel = crop_kernel() if decoder_name() == "turbojpeg" else None  # libjpeg-turbo too
    n = len(values)
    sizes = np.zeros((n, 2), dtype=np.int64)
    fast = np.zeros(n, dtype=bool)
    if kernel is not None:
        headers = jpeg_headers(kernel, values)
        fast = kernel_decodes(headers, pixel_limit(None))  # over it: probe() raises
        sizes[:, 0], sizes[:, 1] = headers[:, HEIGHT], headers[:, WIDTH]
    found: list[Probe | None] = [None] * n
    known = fast.copy()  # the rows whose size is known before decoding
    turbo = turbo_decoder()
    for row in np.flatnonzero(~fast):
        probed = found[row] = _named(where, row, lambda v=values[row]: probe(v, turbo))
        if probed is not None:
            sizes[row], known[row] = (probed.height, probed.width), True
    boxes = np.zeros((n, 5), dtype=np.int64)
    if known.any():
        boxes[known] = crop.boxes(sizes[known], indices[known])
    divisors = crop_dct_divisors(boxes, sizes, crop.size)  # 1 for unknown rows (no box)
    return CropPlan(kernel, fast, found, sizes, boxes, divisors)


def crop_python(
    plan: CropPlan,
    todo: np.ndarray,
    values: Sequence[bytes | memoryview | np.ndarray],
    indices: np.ndarray,
    crop: Crop,
    rows: np.ndarray,
    where: Callable[[int], str],
) -> None:
    """The rows ``todo`` (ascending) of the batch ``rows`` on the Python path, one by one:
    those the kernel does not take (their probes in ``plan``) or refused (libjpeg failed or
    warned: judged as without the kernel).

    Raises:
        DatasetError: naming the first of them (``where(row)``) that cannot be decoded.
    """
    turbo = turbo_decoder()
    for row in todo:
        probed = plan.found[row]
        if plan.fast[row]:
            data = values[row]
            height, width = (int(v) for v in plan.sizes[row])
            probed = Probe(data if isinstance(data, bytes) else bytes(data), height, width)
        if probed is None:
            fill = partial(fill_decoded, values[row], crop, int(indices[row]), rows[row])
        else:
            box, divisor = plan.boxes[row], int(plan.divisors[row])
            fill = partial(fill_row, probed, box, rows[row], turbo, divisor)
        _named(where, row, fill)


class CropsUnderWay:
    """A batch's crops begun (:func:`start_crops`): the kernel's share on the decode
    threads; :meth:`finish` waits for it and does the rows left to the Python path."""

    def __init__(
        self,
        plan: CropPlan,
        status: np.ndarray,
        started: list[Future[None]],
        finish_python: Callable[[np.ndarray], None],
    ) -> None:
        self._plan, self._status, self._started = plan, status, started
        self._finish_python = finish_python

    def settle(self) -> None:
        """Wait for the decode threads, for a batch no one will ask for."""
        wait(self._started)

    def finish(self) -> None:
        """Every row filled; raises the kernel calls' first error, else the Python path's
        (naming the sample)."""
        wait(self._started)
        for future in self._started:
            future.result()
        todo = np.flatnonzero(~self._plan.fast | (self._status != 0))
        if len(todo):
            self._finish_python(todo)


def start_crops(
    values: Sequence[bytes | memoryview | np.ndarray],
    indices: np.ndarray,
    crop: Crop,
    rows: np.ndarray,
    where: Callable[[int], str],
    verified: bool = False,
    pool: DecodePool | None = None,
    threads: int = 1,
    ahead: bool = False,
) -> CropsUnderWay:
    """Begin filling ``rows`` (uint8 ``[n, H, W, 3]``) with the crops of the stored
    ``values`` of samples ``indices`` (``where(row)`` names one in errors): the batch planned
    on the calling thread (:func:`plan_crops`), then one kernel call per decode thread of
    ``pool`` (none: the calling thread alone), the threads taking the JPEGs one at a time
    from a shared counter (:func:`readers.images.kernel.crop_shared`: none idles while
    another has boxes left, whatever each costs); :meth:`CropsUnderWay.finish` then does the
    rows left to the Python path (:func:`crop_python`), one contiguous part per thread.
    ``ahead``: the kernel's calls run on the pool's threads alone while the caller goes on
    (a batch read ahead of its turn); else the caller decodes beside them and they are done
    on return. ``verified``: the values passed their CRC-32
    (:attr:`readers.formats.reader.ShardReader.verified`), so the kernel may stop decoding
    after each box. Measured against each thread planning and decoding its own half of the
    batch: docs/BENCHMARKS.md.

    Raises:
        DatasetError: naming the first sample (``where(row)``) over the pixel limit (and
        from ``finish()``, the first that cannot be decoded).
    """
    plan = plan_crops(values, indices, crop, where)
    taken = np.flatnonzero(plan.fast)
    status = np.zeros(len(values), dtype=np.int32)
    started: list[Future[None]] = []
    if plan.kernel is not None and len(taken):
        share = partial(
            crop_shared,
            plan.kernel,
            values,
            taken,
            plan.boxes,
            plan.sizes,
            rows,
            status,
            np.zeros(1, dtype=np.int64),
            plan.divisors,
            verified,
        )
        if pool is None:
            share()
        elif ahead:
            started = pool.start(share, len(taken), threads)
        else:
            pool.share(share, len(taken), threads)
    run = pool.map if pool is not None and threads > 1 else lambda fn, xs, _: [fn(x) for x in xs]

    def finish_python(todo: np.ndarray) -> None:
        parts = [todo[part] for part in batch_parts(len(todo), threads)]
        run(
            lambda part: crop_python(plan, part, values, indices, crop, rows, where), parts, threads
        )

    return CropsUnderWay(plan, status, started, finish_python)
