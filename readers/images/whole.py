"""Whole-image decodes of a batch through the compiled kernel: the plain read path.

A batch read without ``crop=`` (``__getitems__`` in the training process or a DataLoader
worker, and so :func:`readers.make_loader`, with or without ``transform=``) decodes its
JPEGs the way a crop's box is decoded, in one kernel call per decode thread
(:func:`readers.images.kernel.crop_shared`) with the box the whole image and no DCT
scaling: the pixels of :func:`readers.decode_image` (the kernel refuses, and leaves to the
Python path, every sample libjpeg errs or warns on), without a Python call, an array and a
copy per sample. It takes the batches whose JPEGs the kernel takes are all of one size (a
dataset stored at its training size); the others keep the per-sample path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from contextlib import suppress
from functools import partial
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
import torch

from readers.images.decode import decoder_name, pixel_limit
from readers.images.kernel import (
    HEIGHT,
    WIDTH,
    crop_kernel,
    crop_shared,
    jpeg_headers,
    kernel_decodes,
)
from readers.images.pool import DecodePool

__all__ = [
    "WholeBatch",
    "WholeDecode",
    "WholePlan",
    "plan_whole",
    "start_batch",
    "start_taken",
]


class WholePlan(NamedTuple):
    """A batch the kernel decodes whole (:func:`plan_whole`)."""

    kernel: ModuleType
    taken: np.ndarray  # int64: the rows the kernel decodes, all of ``size``
    size: tuple[int, int]  # their height and width


def plan_whole(values: Sequence[Any]) -> WholePlan | None:
    """The kernel's share of a batch of stored ``values``: None where the kernel is off,
    libjpeg-turbo is missing (the Python path would decode with Pillow, other pixels), it
    takes none of them, or those it takes differ in size (their batch is a list)."""
    if not values or decoder_name() != "turbojpeg":
        return None
    kernel = crop_kernel()
    if kernel is None:
        return None
    headers = jpeg_headers(kernel, values)
    taken = np.flatnonzero(kernel_decodes(headers, pixel_limit(None)))
    if not len(taken):
        return None
    heights, widths = headers[taken, HEIGHT], headers[taken, WIDTH]
    if (heights != heights[0]).any() or (widths != widths[0]).any():
        return None
    return WholePlan(kernel, taken, (int(heights[0]), int(widths[0])))


class WholeDecode:
    """A batch's kernel decode under way on the decode threads (:func:`start_taken`):
    :meth:`left` waits for it."""

    def __init__(self, started: list[Future[None]], status: np.ndarray) -> None:
        self._started = started
        self._status = status

    def left(self) -> np.ndarray:
        """The rows of the batch left to the Python path (not taken, or refused by
        libjpeg), ascending, once every decode thread's call has returned; raises the first
        call's error."""
        wait(self._started)
        for future in self._started:
            future.result()
        return np.flatnonzero(self._status != 0)


def start_taken(
    plan: WholePlan,
    values: Sequence[Any],
    out: np.ndarray,
    verified: bool,
    pool: DecodePool,
    threads: int,
    caller: bool,
) -> WholeDecode:
    """Decode the rows ``plan.taken`` of ``values`` into their rows of ``out`` (uint8 ``[n,
    H, W, 3]``, C-contiguous or the HWC view of a C-contiguous NCHW batch) on ``threads``
    decode threads of ``pool``, which take the rows from a shared counter. ``caller``: the
    calling thread is one of them, and the decode is done on return; else it runs on the
    pool's threads alone while the caller goes on (a batch read ahead). ``verified``: as
    for :func:`readers.images.kernel.crop_rows`."""
    n = len(values)
    height, width = plan.size
    boxes = np.zeros((n, 5), dtype=np.int64)
    boxes[:, 2], boxes[:, 3] = height, width  # the whole image, unmirrored
    sizes = np.ascontiguousarray(boxes[:, 2:4])
    status = np.ones(n, dtype=np.int32)  # rows not taken stay "left to Python"
    status[plan.taken] = 0
    share = partial(
        crop_shared,
        plan.kernel,
        values,
        plan.taken,
        boxes,
        sizes,
        out,
        status,
        np.zeros(1, dtype=np.int64),
        1,  # no DCT scaling: the box is the output's size
        verified,
    )
    if caller:
        pool.share(share, len(plan.taken), threads)
        return WholeDecode([], status)
    return WholeDecode(pool.start(share, len(plan.taken), threads), status)


class WholeBatch:
    """A batch decoded whole (:func:`start_batch`): :meth:`result` finishes it."""

    def __init__(
        self,
        batch: torch.Tensor,
        decode: WholeDecode,
        fallback: Callable[[int], torch.Tensor],
        pool: DecodePool,
        threads: int,
    ) -> None:
        self._batch, self._decode = batch, decode
        self._fallback, self._pool, self._threads = fallback, pool, threads

    def settle(self) -> None:
        """Wait for the decode threads, for a batch no one will ask for; errors dropped."""
        with suppress(Exception):
            self._decode.left()

    def result(self) -> torch.Tensor | list[torch.Tensor]:
        """The uint8 ``[n, 3, H, W]`` batch, its rows the kernel left decoded by
        ``fallback(row)`` on the decode threads; a list where one of those has another
        size."""
        batch = self._batch
        out = batch.permute(0, 2, 3, 1).numpy()
        left = self._decode.left().tolist()

        def fill(row: int) -> torch.Tensor | None:
            image = self._fallback(row)
            if image.shape != batch.shape[1:]:
                return image
            np.copyto(out[row], image.permute(1, 2, 0).numpy())
            return None

        misfits = dict(zip(left, self._pool.map(fill, left, self._threads), strict=True))
        if all(image is None for image in misfits.values()):
            return batch
        rows = range(len(batch))
        return [batch[row] if misfits.get(row) is None else misfits[row] for row in rows]


def start_batch(
    values: Sequence[Any],
    verified: bool,
    fallback: Callable[[int], torch.Tensor],
    allocate: Callable[[tuple[int, int, int, int]], torch.Tensor] | None,
    pool: DecodePool,
    threads: int,
    ahead: bool = False,
) -> WholeBatch | None:
    """Start decoding the stored ``values`` whole into one uint8 ``[n, 3, H, W]``
    channels-last batch from ``allocate(shape)`` (None: a tensor of its own): the kernel's
    rows on the decode threads, then, in :meth:`WholeBatch.result`, the others by
    ``fallback(row)`` (the Python path's ``[3, H, W]`` tensor). ``ahead``: the kernel's
    share runs on the pool's threads while the caller goes on (a batch read ahead of its
    turn); else the caller decodes beside them and the decode is done on return. None where
    :func:`plan_whole` leaves the batch to the per-sample path."""
    plan = plan_whole(values)
    if plan is None:
        return None
    n, (height, width) = len(values), plan.size
    if allocate is None:
        batch = torch.empty((n, height, width, 3), dtype=torch.uint8).permute(0, 3, 1, 2)
    else:
        batch = allocate((n, 3, height, width))
    out = batch.permute(0, 2, 3, 1).numpy()
    decode = start_taken(plan, values, out, verified, pool, threads, caller=not ahead)
    return WholeBatch(batch, decode, fallback, pool, threads)
