"""Image decoding to uint8 HWC RGB arrays: PyTurboJPEG for JPEG when present, else Pillow.

Every path that decodes (the readers, the converter's checks, the tests' references) goes
through :func:`decode_image`, so a sample decodes to the same pixels whichever decoder the
process has. Colours follow torchvision's ``ImageFolder`` loader (``convert("RGB")``) except
for 16-bit; unlike it, EXIF orientation is applied:

==================  ======================================================================
L, LA               gray replicated to the three channels
P                   the palette colours; transparency (one index or per index) ignored
RGBA, LA, PA        alpha dropped, not composited over a background
I;16 (16-bit gray)  ``>> 8`` (``convert`` would clip at 255); as 8-bit if every value <= 255
I (32-bit integer)  as I;16 when every value fits 16 bits, else ``>> 23``; negatives 0
1                   0 or 255
CMYK, YCCK JPEG     RGB, by Pillow (Adobe-inverted files too)
Orientation 2-8     upright, as ``ImageOps.exif_transpose`` (EXIF, else XMP)
==================  ======================================================================

An image over the decompression-bomb limit (``max_pixels=``, by default Pillow's
``PIL.Image.MAX_IMAGE_PIXELS``) is refused from its header, before decoding. The limit is
an argument, never a process-wide setting that decoding changes: Pillow's own secondary
check in a few plugins (GIF frames, ICO, ICNS) still reads its global, and an image it
refuses there is reported as undecodable.
Pillow judges damaged files on every path (a JPEG libjpeg-turbo warns about goes to it); no
Python warning escapes, but for Pillow's own about a damaged TIFF.
"""

from __future__ import annotations

import io
import logging
import os
import re
import struct
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from PIL import Image, ImageFile

from readers.images.jpeg import (
    EXIF_HEADER,
    JPEG_EOI,
    ORIENTATION,
    dct_scale,
    exif_orientation,
    is_jpeg,
    jpeg_header,
    xmp_orientation,
)
from readers.images.kernel import crop_kernel, decode_whole

__all__ = [
    "ImageTooLargeError",
    "StoredImage",
    "check_pixels",
    "decode_image",
    "decode_stored",
    "decoder_name",
    "encode_jpeg",
    "encoder_name",
    "image_size",
    "orient",
    "pixel_limit",
]

log = logging.getLogger(__name__)

DECODER_ENV = "IMGPACK_DECODER"  # "pillow" forces Pillow even when PyTurboJPEG works
TJFLAG_STOPONWARNING = 8192  # same value in PyTurboJPEG 1.x and 2.x
_EXIF_APP1 = re.compile(rb"(\xff\xe1..)Exif(?=\0\0)", re.DOTALL)  # an EXIF segment's start
# What Pillow raises for data it cannot decode (DecompressionBombError is not among them).
_PIL_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error)


class ImageTooLargeError(ValueError):
    """The image has more pixels than the decompression-bomb limit allows."""


@cache
def _turbojpeg() -> Any | None:
    """The PyTurboJPEG handle, or None (logged once) when it or libturbojpeg is missing."""
    if os.environ.get(DECODER_ENV, "").lower() == "pillow":
        return None
    try:
        from turbojpeg import TurboJPEG

        if not hasattr(TurboJPEG, "_TurboJPEG__report_error"):
            raise RuntimeError("this PyTurboJPEG has no _TurboJPEG__report_error to override")

        class StrictTurboJPEG(TurboJPEG):
            """OSError for libjpeg's warnings too: PyTurboJPEG 1.x/2.x makes them Python
            warnings (not thread-safe to catch) and returns the partly decoded array."""

            def _TurboJPEG__report_error(self, handle: Any) -> None:
                raise OSError(self._TurboJPEG__get_error_string(handle))

        return StrictTurboJPEG()
    except Exception as e:  # ImportError, OSError (no library), RuntimeError (version)
        log.warning("PyTurboJPEG unavailable (%s); decoding JPEG with Pillow", e)
        return None


def decoder_name(crop: bool = False) -> str:
    """Which JPEG decoder this process uses: ``"turbojpeg"`` or ``"pillow"`` (what the
    converter records). With ``crop=True``, the one of reads with ``crop=``:
    ``"turbojpeg+kernel"`` where the compiled crop kernel (:mod:`readers.images.kernel`)
    decodes them, else the same."""
    name = "turbojpeg" if _turbojpeg() is not None else "pillow"
    return f"{name}+kernel" if crop and name == "turbojpeg" and crop_kernel() else name


@dataclass(frozen=True)
class StoredImage:
    """Decoded pixels as the file stores them, before EXIF orientation, with what a resize
    needs to know about them. A DCT-scaled decode covers the image with
    ``ceil(side / scale)`` pixels a side, the last row and column only partly: the image
    spans :attr:`extent` of them, from the top-left corner."""

    pixels: np.ndarray  # uint8 [ceil(height / scale), ceil(width / scale), 3]
    height: int  # of the full-size image as stored
    width: int
    scale: int  # 1, 2, 4 or 8
    orientation: int  # EXIF orientation; orient() turns the pixels upright

    @property
    def extent(self) -> tuple[float, float]:
        """``(height, width)`` of the image in units of :attr:`pixels` (exact: the scale
        is a power of two)."""
        return self.height / self.scale, self.width / self.scale

    def upright(self) -> np.ndarray:
        """The pixels turned upright (a C-contiguous array)."""
        return orient(self.pixels, self.orientation)


def decode_image(
    data: bytes | memoryview,
    name: str = "",
    min_side: float | None = None,
    *,
    max_pixels: int | None = None,
    verified: bool = False,
) -> np.ndarray:
    """Decode encoded image bytes to an upright uint8 ``[H, W, 3]`` RGB array.

    ``max_pixels`` refuses larger images from their header (None: Pillow's limit,
    ``PIL.Image.MAX_IMAGE_PIXELS``, read per call; 0: no limit).

    ``verified``: the bytes passed the CRC-32 recorded when they were known to decode
    cleanly (:attr:`readers.formats.reader.ShardReader.verified`). A full-size JPEG the
    crop kernel takes then decodes there, its Huffman codes through the kernel's own
    decoder, which keeps a fast path across restart markers where libjpeg-turbo's does not:
    the same pixels (unverified bytes keep TurboJPEG's decode, which judges them).

    With ``min_side``, a JPEG whose shorter side is at least twice that is decoded
    downscaled in the DCT domain (by 2, 4 or 8, keeping the shorter side >= ``min_side``,
    :func:`dct_scale`): several times faster, and other pixels than a full decode then a
    resize (see :func:`decode_stored` for what a resize of them must take into account).

    Complete JPEGs whose header parses go to PyTurboJPEG; everything else, and any JPEG it
    cannot decode cleanly (CMYK, or anything libjpeg-turbo warns about), goes to Pillow,
    which judges damaged files (a truncated JPEG is an error, not a partly grey image).

    Raises:
        ValueError: starting with ``name`` when the bytes are not a decodable image;
            :class:`ImageTooLargeError` when it is over the limit.
    """
    kernel = crop_kernel() if verified and min_side is None else None
    if kernel is not None and _turbojpeg() is not None and is_jpeg(data):
        pixels = decode_whole(kernel, data, pixel_limit(max_pixels), verified=True)
        if pixels is not None:
            return pixels
    return decode_stored(data, name, min_side, max_pixels=max_pixels).upright()


def decode_stored(
    data: bytes | memoryview,
    name: str = "",
    min_side: float | None = None,
    *,
    max_pixels: int | None = None,
) -> StoredImage:
    """:func:`decode_image` before the EXIF orientation is applied, with the full size and
    the DCT scale: what the converter resizes, so that the partial last row and column of
    a scaled decode are still at the bottom and right when it maps them."""
    data = bytes(data)
    if not is_jpeg(data):
        return _decode_pil(data, name, max_pixels=max_pixels)
    header = jpeg_header(data)
    orientation: int | None = None
    scan = len(data)  # where Pillow stops reading markers, if ours don't parse
    if header is not None:
        width, height, orientation, scan = header
        check_pixels(width, height, name, max_pixels)
        tj = _turbojpeg()
        scale = dct_scale(width, height, min_side)
        if tj is not None and data.endswith(JPEG_EOI):
            try:
                pixels = tj.decode(  # pixel_format 0: RGB
                    data,
                    pixel_format=0,
                    scaling_factor=scale if scale != (1, 1) else None,
                    flags=TJFLAG_STOPONWARNING,
                )
            except OSError:
                pass  # CMYK, or damaged: Pillow judges
            else:
                return StoredImage(pixels, height, width, scale[1], orientation)
    # Pillow reads EXIF (up to the first scan) while opening a JPEG, for DPI, and warns if it
    # is malformed. We have the orientation already, so we hide it ("exif" is not "Exif").
    data = _EXIF_APP1.sub(rb"\1exif", data[:scan]) + data[scan:]
    return _decode_pil(data, name, orientation, min_side, max_pixels)


def _prefix(name: str) -> str:
    return f"{name}: " if name else ""


def pixel_limit(max_pixels: int | None) -> int | None:
    """The decompression-bomb limit in force: ``max_pixels``, or without one Pillow's
    ``PIL.Image.MAX_IMAGE_PIXELS`` (read now); None (or ``max_pixels=0``) for none."""
    return Image.MAX_IMAGE_PIXELS if max_pixels is None else max_pixels or None


def check_pixels(width: int, height: int, name: str, max_pixels: int | None) -> None:
    """Refuse a decompression bomb: over ``max_pixels``, or without one over Pillow's
    limit, read per call so that a program raising it is obeyed. Shared by the Pillow,
    libjpeg-turbo and fused-crop paths, so all refuse the same images (``name``: the sample
    the message names, may be empty).

    Raises:
        ImageTooLargeError: ``width * height`` is over the limit.
    """
    limit = pixel_limit(max_pixels)
    if limit is not None and width * height > limit:
        origin = "PIL.Image.MAX_IMAGE_PIXELS; " if max_pixels is None else ""
        raise ImageTooLargeError(
            f"{_prefix(name)}image is {width}x{height} = {width * height:,} pixels, over the "
            f"decompression-bomb limit of {limit:,} ({origin}imgpack convert --max-pixels "
            "raises it)"
        )


def _pil_orientation(img: Image.Image) -> int:
    """The Orientation Pillow's ``getexif()`` finds, without the warnings and exceptions it
    gives for malformed EXIF: EXIF (JPEG, PNG, WebP), a TIFF's own tag, else XMP."""
    exif = img.info.get("exif")
    if isinstance(exif, bytes):
        orientation = exif_orientation(exif.removeprefix(EXIF_HEADER))
    else:
        orientation = getattr(img, "tag_v2", {}).get(ORIENTATION)
    if orientation is None:
        xmp = img.info.get("XML:com.adobe.xmp") or img.info.get("xmp") or b""
        return xmp_orientation(xmp.encode() if isinstance(xmp, str) else xmp)
    return orientation


def image_size(data: bytes | memoryview, name: str) -> tuple[int, int]:
    """The (height, width) :func:`decode_image` gives ``data``, from its header: upright
    (an EXIF Orientation of 5-8 swaps the sides); ValueError naming ``name``."""
    try:
        with _open_pil(bytes(data)) as img:
            width, height = img.size
            turned = _pil_orientation(img) in range(5, 9)
    except (OSError, ValueError, SyntaxError) as e:
        raise ValueError(f"{name}: cannot read the image's size: {e}") from None
    return (width, height) if turned else (height, width)


def orient(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """Turn pixels upright for an EXIF Orientation (other values than 2-8 leave them as they
    are); a C-contiguous copy, as ``torch.from_numpy`` refuses negative strides."""
    if orientation not in range(2, 9):
        return pixels
    if orientation >= 5:
        pixels = pixels.transpose(1, 0, 2)
    if orientation in (3, 4, 7, 8):
        pixels = pixels[::-1]
    if orientation in (2, 3, 6, 7):
        pixels = pixels[:, ::-1]
    return np.ascontiguousarray(pixels)


def _open_pil(data: bytes) -> ImageFile.ImageFile:
    """``Image.open`` less its decompression-bomb check, which warns (printed, or raised
    under ``-W error``) where ours raises: the same search through Pillow's plugins."""
    fp, prefix = io.BytesIO(data), data[:16]
    if not all(hasattr(Image, name) for name in ("ID", "OPEN", "preinit", "init")):
        return Image.open(fp)  # a Pillow without these internals: its own open, and check
    for load_plugins in (Image.preinit, Image.init):
        load_plugins()
        for fmt in tuple(Image.ID):
            factory, accept = Image.OPEN[fmt]
            accepted = not accept or accept(prefix)
            if accepted and not isinstance(accepted, str):
                fp.seek(0)
                try:
                    return factory(fp, "")
                except (SyntaxError, IndexError, TypeError, struct.error):
                    continue  # not this format after all, as in Image.open
    raise Image.UnidentifiedImageError("cannot identify image file")


def _decode_pil(
    data: bytes,
    name: str,
    orientation: int | None = None,
    min_side: float | None = None,
    max_pixels: int | None = None,
) -> StoredImage:
    """Decode with Pillow, which judges damaged files, after our own size check."""
    try:
        img = _open_pil(data)
        width, height = img.size
        check_pixels(width, height, name, max_pixels)
        d = dct_scale(width, height, min_side)[1] if img.format == "JPEG" else 1
        if d > 1:  # the same DCT-domain reduction as libjpeg-turbo's scaling factor
            img.draft(img.mode, (width // d, height // d))
        img.load()
    except ImageTooLargeError:
        raise
    except (*_PIL_ERRORS, Image.DecompressionBombError) as e:
        raise ValueError(f"{_prefix(name)}cannot decode image: {e}") from e
    if orientation is None:
        orientation = _pil_orientation(img)
    return StoredImage(pil_to_rgb_array(img, name), height, width, d, orientation)


def pil_to_rgb_array(img: Image.Image, name: str = "") -> np.ndarray:
    """Convert a loaded Pillow image of any mode to a uint8 ``[H, W, 3]`` RGB array."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        # Pillow's convert("RGB") clips 16-bit values instead of scaling: scale to 8 bits,
        # by what the values span, so that no image comes out black. Every value <= 255:
        # 8-bit data in a 16-bit file, shown as a viewer (Pillow, ImageFolder) shows it;
        # 16 bits: >> 8; more (mode I, a signed 32-bit container, most often of 16-bit
        # TIFF data): >> 23.
        arr = np.clip(np.asarray(img, dtype=np.int64), 0, None)
        top = int(arr.max()) if arr.size else 0
        shift = 0 if top <= 0xFF else 8 if top <= 0xFFFF else 23
        img = Image.fromarray((arr >> shift).astype(np.uint8), "L")
    elif img.mode == "P" and isinstance(img.info.get("transparency"), bytes):
        img = img.convert("RGBA")  # P -> RGB warns about per-index alpha; RGBA -> RGB drops it
    try:
        return np.array(img.convert("RGB"))  # writable, as torch.from_numpy wants
    except (OSError, ValueError) as e:
        raise ValueError(f"{_prefix(name)}cannot convert {img.mode} image to RGB: {e}") from e


def encoder_name(restart_markers: bool = True) -> str:
    """Which JPEG encoder :func:`encode_jpeg` uses in this process (what the converter
    records): ``"kernel+restart-markers"``, ``"kernel"``, ``"turbojpeg"`` or ``"pillow"``."""
    if crop_kernel() is not None:
        return "kernel+restart-markers" if restart_markers else "kernel"
    return "turbojpeg" if _turbojpeg() is not None else "pillow"


def encode_jpeg(pixels: np.ndarray, quality: int, restart_markers: bool = True) -> bytes:
    """Encode uint8 ``[H, W, 3]`` RGB pixels as baseline 4:2:0 JPEG: by the crop kernel
    where it is built (TurboJPEG's bytes, with ``restart_markers`` a marker every MCU: the
    same pixels, ~4 % more bytes, and crops that entropy-decode only the box's
    neighbourhood), else by TurboJPEG, else Pillow (neither writes the markers here)."""
    kernel = crop_kernel()
    if kernel is not None:
        pixels = np.ascontiguousarray(pixels)
        height, width = pixels.shape[:2]
        return kernel.encode(pixels, height, width, quality, 1 if restart_markers else 0)
    tj = _turbojpeg()
    if tj is not None:
        # pixel_format 0 is TJPF_RGB; jpeg_subsample 2 is TJSAMP_420, Pillow's default.
        pixels = np.ascontiguousarray(pixels)
        return tj.encode(pixels, quality=quality, pixel_format=0, jpeg_subsample=2)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=quality)
    return out.getvalue()
