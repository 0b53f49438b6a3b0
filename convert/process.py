"""Per-image work of a conversion, run in worker processes: decode, resize, crop, encode.

Geometry follows torchvision: ``Resize(S)`` scales the shorter side to S with bilinear
antialiased interpolation (the long side is ``int(S * long / short)``), computed by
``torch.nn.functional.interpolate`` on uint8 channels-last pixels, as torchvision does for
tensors (~3x faster here than Pillow; its pixels differ from Pillow's ``resize(BILINEAR)``
by a level or two on a few pixels, 0.04 levels per image at most on real photos);
``CenterCrop(C)`` takes the centre, padding with zeros when the image is smaller.

Unless ``exact_resize``, a JPEG is decoded DCT-scaled (1/2, 1/4 or 1/8) only as far as
leaves its shorter side at least :data:`DCT_REDUCING_GAP` times the ``--resize`` target,
and the resize maps the scaled pixels onto exactly the image they cover (Pillow's
``reducing_gap`` idea): measured against torchvision's Pillow path on real photos, see
docs/FORMATS.md.

An upright, complete 8-bit JPEG of one or three components is decoded and resized in one
call of the compiled kernel (:mod:`readers.images.kernel`, the GIL released): the same
pixels as the path above when nothing is DCT-scaled. Everything else, anything the kernel
refuses, and a process without it (or with ``IMGPACK_KERNEL=0``) take the path above, so
bad input is judged as before.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from readers.images import kernel as jk
from readers.images.decode import (
    StoredImage,
    check_pixels,
    decode_image,
    decode_stored,
    decoder_name,
    encode_jpeg,
    orient,
    pixel_limit,
)
from readers.images.jpeg import DCT_REDUCING_GAP, dct_scale, is_jpeg

__all__ = [
    "DCT_REDUCING_GAP",
    "Prepared",
    "Transform",
    "center_crop",
    "prepare",
    "resize_shorter",
    "shorter_size",
]

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
    restart_markers: bool = True  # in the JPEGs it encodes (readers.images.decode.encode_jpeg)

    def output_shape(
        self, source_shape: tuple[int, int, int] | None = None
    ) -> tuple[int, int, int] | None:
        """The fixed [H, W, 3] every sample gets, or None when shapes vary;
        ``source_shape``: the one the source's raw pixels all have, if they do."""
        if self.encoding != "raw":
            return None
        if self.center_crop:
            return (self.center_crop, self.center_crop, 3)
        return None if self.resize else source_shape


@dataclass(frozen=True)
class Prepared:
    """One sample ready to write: raw pixels or encoded bytes, with its image extension,
    and its fields' canonical bytes as the source's reader gave them (schema order)."""

    data: bytes | np.ndarray
    ext: str  # jpg, png, ... for encoded data; "raw" for pixels
    shape: tuple[int, int, int]  # [H, W, 3] of the stored image
    fields: tuple[bytes | None, ...] = ()


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


def _original_ext(data: bytes, name: str) -> str:
    if is_jpeg(data):
        return "jpg"
    with Image.open(io.BytesIO(data)) as img:
        ext = _PIL_FORMAT_EXT.get(img.format or "")
    if ext is None:
        raise ValueError(f"{name}: {img.format} images cannot be stored as 'original'")
    return ext


def prepare(data: bytes | np.ndarray, name: str, t: Transform) -> Prepared:
    """Turn one source sample (a file's bytes, or a dataset's raw ``[H, W, 3]`` pixels)
    into the stored sample; ValueError names a bad one."""
    if isinstance(data, np.ndarray):
        return _prepare_pixels(data, name, t)
    if t.encoding == "original":  # a full decode: the check that the bytes decode
        pixels = decode_image(data, name, max_pixels=t.max_pixels)
        return Prepared(data, _original_ext(data, name), pixels.shape)
    min_side = DCT_REDUCING_GAP * t.resize if t.resize and not t.exact_resize else None
    pixels = _kernel_resized(data, t.resize, min_side, t.max_pixels) if t.resize else None
    if pixels is None:
        stored = decode_stored(data, name, min_side, max_pixels=t.max_pixels)
        pixels = _resized(stored, t.resize)
    return _cropped_and_encoded(pixels, t)


def _prepare_pixels(pixels: np.ndarray, name: str, t: Transform) -> Prepared:
    """Raw pixels of a dataset source: resized, cropped and stored as ``t`` says (raw to
    raw with no geometry change keeps the very pixels, so the same content checksum)."""
    if t.encoding == "original":
        raise ValueError(f"{name}: raw pixels have no original bytes: use --encoding raw or jpeg")
    check_pixels(pixels.shape[1], pixels.shape[0], name, t.max_pixels)
    return _cropped_and_encoded(resize_shorter(pixels, t.resize) if t.resize else pixels, t)


def _cropped_and_encoded(pixels: np.ndarray, t: Transform) -> Prepared:
    """The last steps of every sample: the centre crop, then the stored encoding."""
    if t.center_crop:
        pixels = center_crop(pixels, t.center_crop)
    if t.encoding == "jpeg":
        return Prepared(encode_jpeg(pixels, t.quality, t.restart_markers), "jpg", pixels.shape)
    return Prepared(np.ascontiguousarray(pixels), "raw", pixels.shape)


def _kernel_resized(
    data: bytes, size: int, min_side: float | None, max_pixels: int | None
) -> np.ndarray | None:
    """``data`` decoded (DCT-scaled as far as ``min_side`` allows, :func:`dct_scale`) and
    resized to ``size`` in one kernel call, or None where today's path must decode it: not
    a JPEG the kernel takes (EXIF-rotated, CMYK, over ``max_pixels``...), a libjpeg error or
    warning, no kernel, or Pillow as the decoder (whose pixels the kernel's are not)."""
    kernel = jk.crop_kernel() if decoder_name() == "turbojpeg" else None
    if kernel is None:
        return None
    return jk.decode_whole(
        kernel,
        data,
        pixel_limit(max_pixels),
        lambda height, width: shorter_size(height, width, size),
        lambda height, width: dct_scale(width, height, min_side)[1],
    )


def _resized(image: StoredImage, size: int | None) -> np.ndarray:
    """``image`` upright and resized to ``size``. A full-size decode is turned upright
    first; a DCT-scaled one is resized first, while its partial last row and column are
    still at the bottom and right, where :func:`resize_shorter` maps them."""
    if size is None:
        return image.upright()
    if image.scale == 1:
        return resize_shorter(image.upright(), size)
    return orient(resize_shorter(image.pixels, size, image.extent), image.orientation)
