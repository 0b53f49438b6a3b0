"""Per-image work of a conversion, run in worker processes: decode, resize, crop, encode.

Geometry follows torchvision's tensor transforms: ``Resize(S)`` scales the shorter side to
S with bilinear antialiased interpolation (the long side is ``int(S * long / short)``),
computed by ``torch.nn.functional.interpolate`` on uint8 channels-last pixels, as
torchvision does for tensors (within a level or two of its Pillow path, and ~3x faster
here); ``CenterCrop(C)`` takes the centre, padding with zeros when the image is smaller.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from readers.decode import decode_image, encode_jpeg, is_jpeg, jpeg_size

__all__ = ["Prepared", "Transform", "center_crop", "prepare", "resize_shorter"]

_PIL_FORMAT_EXT = {
    "JPEG": "jpg",
    "PNG": "png",
    "BMP": "bmp",
    "PPM": "ppm",
    "TIFF": "tif",
    "WEBP": "webp",
}


@dataclass(frozen=True)
class Transform:
    """What to do to each image, and which images to refuse unread: the recipe every
    worker receives with each chunk of files it prepares (small and picklable)."""

    encoding: str  # raw | jpeg | original
    resize: int | None = None
    center_crop: int | None = None
    quality: int = 90
    exact_resize: bool = False
    max_pixels: int | None = None  # the decompression-bomb limit; None: Pillow's

    def output_shape(self) -> tuple[int, int, int] | None:
        """The fixed [H, W, 3] every sample gets, or None when shapes vary."""
        if self.encoding == "raw" and self.center_crop:
            return (self.center_crop, self.center_crop, 3)
        return None


@dataclass(frozen=True)
class Prepared:
    """One sample ready to write: raw pixels or encoded bytes, with its image extension."""

    data: bytes | np.ndarray
    ext: str  # jpg, png, ... for encoded data; "raw" for pixels
    shape: tuple[int, int, int]  # [H, W, 3] of the decoded image


def resize_shorter(
    pixels: np.ndarray, size: int, source: tuple[int, int] | None = None
) -> np.ndarray:
    """Scale so the shorter side is ``size``, keeping the aspect (torchvision's rule).

    ``source`` is the ``(height, width)`` the output size is computed from when
    ``pixels`` were decoded downscaled: the result has the full-size path's shape."""
    h, w = source or pixels.shape[:2]
    short, long = (h, w) if h <= w else (w, h)
    new_long = int(size * long / short)
    new_h, new_w = (size, new_long) if h <= w else (new_long, size)
    if pixels.shape[:2] == (new_h, new_w):
        return pixels
    batch = torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1).unsqueeze(0)
    resized = F.interpolate(batch, size=(new_h, new_w), mode="bilinear", antialias=True)
    return resized[0].permute(1, 2, 0).contiguous().numpy()


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


def _original_ext(data: bytes, name: str) -> str:
    if is_jpeg(data):
        return "jpg"
    with Image.open(io.BytesIO(data)) as img:
        ext = _PIL_FORMAT_EXT.get(img.format or "")
    if ext is None:
        raise ValueError(f"{name}: {img.format} images cannot be stored as 'original'")
    return ext


def prepare(data: bytes, name: str, t: Transform) -> Prepared:
    """Turn one source file's bytes into the stored sample; ValueError names a bad file."""
    if t.encoding == "original":  # a full decode: the check that the bytes decode
        pixels = decode_image(data, name, max_pixels=t.max_pixels)
        return Prepared(data, _original_ext(data, name), pixels.shape)
    scaled = t.resize is not None and not t.exact_resize
    full_size = jpeg_size(data) if scaled else None  # (height, width), upright
    min_side = t.resize if full_size else None
    pixels = decode_image(data, name, min_side, max_pixels=t.max_pixels)
    if t.resize:
        pixels = resize_shorter(pixels, t.resize, full_size)
    if t.center_crop:
        pixels = center_crop(pixels, t.center_crop)
    if t.encoding == "jpeg":
        return Prepared(encode_jpeg(pixels, t.quality), "jpg", pixels.shape)
    return Prepared(np.ascontiguousarray(pixels), "raw", pixels.shape)
