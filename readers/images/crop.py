"""Crops the readers do while decoding (``crop=``), instead of per-sample ``transform=`` s.

A crop object only decides *which box* of each upright image becomes the output and
whether it is mirrored; :mod:`readers.images.fused` decodes and resizes into the batch. Boxes are
drawn for a whole batch at once (NumPy, no per-sample Python), and random draws are a
pure function of ``(seed, epoch, sample index)``: the same crops whatever the number of
workers, threads or ranks, new ones every epoch (``set_epoch``, which
:func:`readers.make_loader` calls).

Semantics follow torchvision: :class:`CenterCrop` as ``transforms.CenterCrop`` (zero
padding when the image is smaller), :class:`RandomResizedCrop` as
``transforms.RandomResizedCrop`` (``get_params``: ten tries, then the central fallback)
with its resize (bilinear, antialiased) and an optional horizontal flip.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["CenterCrop", "Crop", "RandomResizedCrop", "uniforms"]

_TRIES = 10  # torchvision's get_params
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _size(size: int | Sequence[int]) -> tuple[int, int]:
    out = (size, size) if isinstance(size, int) else tuple(size)
    if len(out) != 2 or not all(isinstance(s, int) and s > 0 for s in out):
        raise ValueError(f"size must be a positive int or (height, width), not {size!r}")
    return out  # type: ignore[return-value]


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wraps, as the algorithm wants)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def uniforms(seed: int, epoch: int, indices: np.ndarray, draws: int) -> np.ndarray:
    """``[len(indices), draws]`` floats in [0, 1), a pure function of ``(seed, epoch,
    index, draw)``: counter-based, so no generator state travels between processes."""
    key = np.array([seed & (2**64 - 1), epoch & (2**64 - 1)], dtype=np.uint64)
    base = _mix(_mix(key[:1]) ^ key[1:])  # [1]
    idx = np.asarray(indices, dtype=np.int64).astype(np.uint64)[:, None]
    counter = np.arange(1, draws + 1, dtype=np.uint64)[None, :]
    bits = _mix(_mix(base ^ (idx * _GOLDEN)) + counter * _GOLDEN)
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


class Crop:
    """What the readers need of a crop: the output size and a box per sample."""

    size: tuple[int, int]  # (height, width) of every output image
    flip: bool = False
    # the batches' memory: [N, 3, H, W] with channels-last strides (as JPEGs decode), or
    # NCHW-contiguous, written plane by plane by the decode threads (no copy afterwards)
    channels_last: bool = True

    def boxes(self, sizes: np.ndarray, indices: np.ndarray) -> np.ndarray:
        """int64 ``[n, 5]``: ``top, left, height, width, flip`` per sample, in pixels of
        the upright image whose ``(height, width)`` is in ``sizes`` (``[n, 2]``)."""
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Draw new boxes for epoch ``epoch`` (nothing to do for a fixed crop)."""


class CenterCrop(Crop):
    """The central ``size`` box, as ``torchvision.transforms.CenterCrop(size)`` (zeros where
    the image is smaller).

    With ``ratio``, the central box of ``ratio`` times the largest box of the output's
    aspect that fits, resized to ``size``: ``CenterCrop(224, ratio=224/256)`` is the usual
    evaluation ``Resize(256)`` + ``CenterCrop(224)`` in one step, at any stored size (FFCV's
    ``CenterCropRGBImageDecoder(size, ratio)``), and lets a large JPEG decode scaled down.
    """

    def __init__(
        self, size: int | Sequence[int], ratio: float | None = None, channels_last: bool = True
    ) -> None:
        if ratio is not None and not 0 < ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], not {ratio!r}")
        self.size = _size(size)
        self.ratio = ratio
        self.channels_last = channels_last

    def boxes(self, sizes: np.ndarray, indices: np.ndarray) -> np.ndarray:
        h, w = np.asarray(sizes, dtype=np.int64).T
        oh, ow = self.size
        if self.ratio is None:
            bh, bw = np.full_like(h, oh), np.full_like(w, ow)
        else:
            fit = np.minimum(h / oh, w / ow) * self.ratio
            bh = np.maximum(1, np.rint(oh * fit)).astype(np.int64)  # rint: 224.0 - 1e-14
            bw = np.maximum(1, np.rint(ow * fit)).astype(np.int64)
        # torchvision: round((h - ch) / 2); when padding, the image sits (ch - h) // 2 down
        top = np.where(h >= bh, np.rint((h - bh) / 2), -((bh - h) // 2)).astype(np.int64)
        left = np.where(w >= bw, np.rint((w - bw) / 2), -((bw - w) // 2)).astype(np.int64)
        return np.stack([top, left, bh, bw, np.zeros_like(h)], axis=1)

    def __repr__(self) -> str:
        layout = "" if self.channels_last else ", channels_last=False"
        return f"CenterCrop(size={self.size}, ratio={self.ratio}{layout})"


class RandomResizedCrop(Crop):
    """``torchvision.transforms.RandomResizedCrop(size, scale, ratio)`` (+ a horizontal flip
    with probability 1/2 when ``flip``), decided per sample from ``(seed, epoch, index)``.

    Call :meth:`set_epoch` every epoch for new crops (:func:`readers.make_loader` and
    :class:`readers.EpochSampler` do); the epoch lives in shared memory, so DataLoader
    workers already running see it.
    """

    def __init__(
        self,
        size: int | Sequence[int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip: bool = False,
        seed: int = 0,
        channels_last: bool = True,
    ) -> None:
        if not 0 < scale[0] <= scale[1] or not 0 < ratio[0] <= ratio[1]:
            raise ValueError(
                f"scale and ratio must be (low, high), 0 < low <= high: {scale} {ratio}"
            )
        self.size = _size(size)
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.flip = flip
        self.seed = seed
        self.channels_last = channels_last
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def set_epoch(self, epoch: int) -> None:
        self._epoch[0] = epoch

    def boxes(self, sizes: np.ndarray, indices: np.ndarray) -> np.ndarray:
        """torchvision's ``get_params``, vectorised: the first of ten tries that fits, else
        the central crop clamped to ``ratio``."""
        h, w = np.asarray(sizes, dtype=np.float64).T
        u = uniforms(self.seed, self.epoch, indices, 2 * _TRIES + 3)
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        area = (h * w)[:, None] * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[:, :_TRIES])
        aspect = np.exp(lo + (hi - lo) * u[:, _TRIES : 2 * _TRIES])
        tw = np.rint(np.sqrt(area * aspect))
        th = np.rint(np.sqrt(area / aspect))
        fits = (tw > 0) & (tw <= w[:, None]) & (th > 0) & (th <= h[:, None])
        first = np.argmax(fits, axis=1)
        found = fits[np.arange(len(h)), first]
        bw, bh = tw[np.arange(len(h)), first], th[np.arange(len(h)), first]
        top = np.floor(u[:, -3] * (h - bh + 1))
        left = np.floor(u[:, -2] * (w - bw + 1))
        # the fallback: the whole image, clamped to the ratio range, centred
        in_ratio = w / h
        fw = np.where(in_ratio > self.ratio[1], np.rint(h * self.ratio[1]), w)
        fw = np.where(in_ratio < self.ratio[0], w, fw)
        fh = np.where(in_ratio < self.ratio[0], np.rint(w / self.ratio[0]), h)
        bh, bw = np.where(found, bh, fh), np.where(found, bw, fw)
        top = np.where(found, top, (h - fh) // 2)
        left = np.where(found, left, (w - fw) // 2)
        flip = (u[:, -1] < 0.5) if self.flip else np.zeros(len(h), dtype=bool)
        return np.stack([top, left, bh, bw, flip], axis=1).astype(np.int64)

    def __repr__(self) -> str:
        return (
            f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio}, "
            f"flip={self.flip}, seed={self.seed}"
            f"{'' if self.channels_last else ', channels_last=False'})"
        )
