"""The converter's per-sample image recipe: decode, orientation, pixel checks, the DCT
rule, resize, crop and encode, for one image at a time (:func:`code_image`).

Unless ``exact_resize``, a JPEG is decoded DCT-scaled (1/2, 1/4 or 1/8) only as far as
leaves its shorter side at least :data:`DCT_REDUCING_GAP` times the ``--resize`` target,
and the resize maps the scaled pixels onto exactly the image they cover (Pillow's
``reducing_gap`` idea): measured against torchvision's Pillow path on real photos, see
docs/FORMATS.md.

An upright, complete 8-bit JPEG of one or three components is decoded and resized in one
call of the compiled kernel (:mod:`readers.images.kernel`, the GIL released): the same
pixels as the path above when nothing is DCT-scaled. Everything else, anything the kernel
refuses, and a process without it (or with ``IMGPACK_KERNEL=0``) take the path above, so
bad input is judged as before. A JPEG it stores is encoded with restart markers unless the
recipe says not (:func:`readers.images.decode.encode_jpeg`).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image

from convert.codec.geometry import center_crop, resize_shorter, shorter_size
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

__all__ = ["DCT_REDUCING_GAP", "Coded", "Transform", "code_image"]

Coded = tuple[bytes | np.ndarray, str, tuple[int, int, int]]
"""One image as it is stored: raw pixels or encoded bytes, its extension (``jpg``, ``png``...
for encoded data, ``raw`` for pixels) and the ``[H, W, 3]`` of the stored image."""

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


def code_image(data: bytes | np.ndarray, name: str, t: Transform) -> Coded:
    """One source image (a file's bytes, or a dataset's raw ``[H, W, 3]`` pixels) as it is
    stored; ValueError names a bad one."""
    if isinstance(data, np.ndarray):
        return _coded_pixels(data, name, t)
    if t.encoding == "original":  # a full decode: the check that the bytes decode
        pixels = decode_image(data, name, max_pixels=t.max_pixels)
        return data, _original_ext(data, name), pixels.shape
    min_side = DCT_REDUCING_GAP * t.resize if t.resize and not t.exact_resize else None
    pixels = _kernel_resized(data, t.resize, min_side, t.max_pixels) if t.resize else None
    if pixels is None:
        stored = decode_stored(data, name, min_side, max_pixels=t.max_pixels)
        pixels = _resized(stored, t.resize)
    return _cropped_and_encoded(pixels, t)


def _coded_pixels(pixels: np.ndarray, name: str, t: Transform) -> Coded:
    """Raw pixels of a dataset source: resized, cropped and stored as ``t`` says (raw to
    raw with no geometry change keeps the very pixels, so the same content checksum)."""
    if t.encoding == "original":
        raise ValueError(f"{name}: raw pixels have no original bytes: use --encoding raw or jpeg")
    check_pixels(pixels.shape[1], pixels.shape[0], name, t.max_pixels)
    return _cropped_and_encoded(resize_shorter(pixels, t.resize) if t.resize else pixels, t)


def _cropped_and_encoded(pixels: np.ndarray, t: Transform) -> Coded:
    """The last steps of every sample: the centre crop, then the stored encoding."""
    if t.center_crop:
        pixels = center_crop(pixels, t.center_crop)
    if t.encoding == "jpeg":
        return encode_jpeg(pixels, t.quality, t.restart_markers), "jpg", pixels.shape
    return np.ascontiguousarray(pixels), "raw", pixels.shape


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


def _original_ext(data: bytes, name: str) -> str:
    if is_jpeg(data):
        return "jpg"
    with Image.open(io.BytesIO(data)) as img:
        ext = _PIL_FORMAT_EXT.get(img.format or "")
    if ext is None:
        raise ValueError(f"{name}: {img.format} images cannot be stored as 'original'")
    return ext
