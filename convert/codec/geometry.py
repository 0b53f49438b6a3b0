"""The converter's geometry, as torchvision has it: ``Resize(S)`` and ``CenterCrop(C)``.

``Resize(S)`` scales the shorter side to S with bilinear antialiased interpolation (the long
side is ``int(S * long / short)``), as ``torch.nn.functional.interpolate`` computes it on
uint8 channels-last pixels, the way torchvision does for tensors (faster than Pillow; its
pixels differ from Pillow's ``resize(BILINEAR)`` by a level or two on a few pixels, 0.04
levels per image at most on real photos): by the compiled kernel's bit-exact port
(:func:`readers.images.kernel.resize`), so that a conversion never imports torch, or by
torch itself without the kernel. ``CenterCrop(C)`` takes the centre, padding with zeros
when the image is smaller.
"""

from __future__ import annotations

import math

import numpy as np

from readers.images import kernel as jk

__all__ = ["center_crop", "resize_shorter", "shorter_size"]


def resize_shorter(
    pixels: np.ndarray, size: int, extent: tuple[float, float] | None = None
) -> np.ndarray:
    """Scale so the shorter side is ``size``, keeping the aspect (torchvision's rule).

    ``extent`` is the ``(height, width)`` the image spans in ``pixels``, from the top-left
    corner, when that is not the whole array (a DCT-scaled decode,
    :attr:`readers.images.decode.StoredImage.extent`): the output size is computed from it, and
    the resize maps exactly that region onto the output, as the full-size path would."""
    h, w = extent or pixels.shape[:2]
    new_h, new_w = shorter_size(h, w, size)
    whole = (h, w) == pixels.shape[:2]
    if whole and (h, w) == (new_h, new_w):
        return pixels
    kernel = jk.crop_kernel()
    if (
        kernel is not None
        and pixels.dtype == np.uint8
        and pixels.ndim == 3
        and pixels.shape[2] == 3
    ):
        return jk.resize(kernel, pixels, (new_h, new_w), None if whole else (h, w))
    # Here, not at the top: only a process without the kernel imports torch to resize.
    import torch
    import torch.nn.functional as F

    batch = torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1).unsqueeze(0)
    if whole:
        resized = F.interpolate(batch, size=(new_h, new_w), mode="bilinear", antialias=True)
    else:  # the factors fix the mapping; the output, a pixel or so larger, is cut back
        factors = (
            _scale_factor(pixels.shape[0], h, new_h),
            _scale_factor(pixels.shape[1], w, new_w),
        )
        resized = F.interpolate(
            batch,
            scale_factor=factors,
            mode="bilinear",
            antialias=True,
            recompute_scale_factor=False,
        )[:, :, :new_h, :new_w]
    return resized[0].permute(1, 2, 0).contiguous().numpy()


def shorter_size(height: float, width: float, size: int) -> tuple[int, int]:
    """``(height, width)`` after scaling the shorter side to ``size`` (torchvision's
    ``Resize(size)``: the long side is ``int(size * long / short)``)."""
    short, long = (height, width) if height <= width else (width, height)
    new_long = int(size * long / short)
    return (size, new_long) if height <= width else (new_long, size)


def _scale_factor(have: int, spanned: float, out: int) -> float:
    """The factor that maps ``spanned`` of ``have`` input pixels onto ``out``; raised by a
    few ulps where ``int(have * factor)`` (interpolate's output size) would round below
    ``out``."""
    factor = out / spanned
    while int(have * factor) < out:
        factor = math.nextafter(factor, math.inf)
    return factor


def center_crop(pixels: np.ndarray, size: int) -> np.ndarray:
    """The centred ``size``×``size`` crop, zero-padded where the image is smaller."""
    h, w = pixels.shape[:2]
    if h < size or w < size:
        padded = np.zeros((max(h, size), max(w, size), 3), dtype=np.uint8)
        top, left = (padded.shape[0] - h) // 2, (padded.shape[1] - w) // 2
        padded[top : top + h, left : left + w] = pixels
        pixels, h, w = padded, padded.shape[0], padded.shape[1]
    top = round((h - size) / 2.0)
    left = round((w - size) / 2.0)
    return np.ascontiguousarray(pixels[top : top + size, left : left + size])
