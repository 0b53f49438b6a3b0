"""Image decoding to uint8 HWC RGB arrays: PyTurboJPEG for JPEG when present, else Pillow.

Every path that decodes (the readers, the converter's checks, the tests' references) goes
through :func:`decode_image`, so a sample decodes to the same pixels everywhere. Colour
rules follow torchvision's ``ImageFolder`` loader: everything becomes 3-channel RGB (``L``,
``P``, ``RGBA``, ``CMYK``, 16-bit all via Pillow's ``convert("RGB")``).
"""

from __future__ import annotations

import io
import logging
import os
from functools import cache
from typing import Any

import numpy as np
from PIL import Image

__all__ = ["decode_image", "decoder_name", "encode_jpeg", "is_jpeg"]

log = logging.getLogger(__name__)

JPEG_MAGIC = b"\xff\xd8\xff"
JPEG_EOI = b"\xff\xd9"
DECODER_ENV = "IMGPACK_DECODER"  # "pillow" forces Pillow even when PyTurboJPEG works


def is_jpeg(data: bytes | memoryview) -> bool:
    """True if ``data`` starts with the JPEG SOI marker (whatever the file is named)."""
    return bytes(data[:3]) == JPEG_MAGIC


@cache
def _turbojpeg() -> Any | None:
    """The PyTurboJPEG handle, or None (logged once) when it or libturbojpeg is missing."""
    if os.environ.get(DECODER_ENV, "").lower() == "pillow":
        return None
    try:
        from turbojpeg import TurboJPEG

        return TurboJPEG()
    except Exception as e:  # ImportError, OSError (no library), RuntimeError (version)
        log.warning("PyTurboJPEG unavailable (%s); decoding JPEG with Pillow", e)
        return None


def decoder_name() -> str:
    """Which JPEG decoder this process uses: ``"turbojpeg"`` or ``"pillow"``."""
    return "turbojpeg" if _turbojpeg() is not None else "pillow"


def decode_image(data: bytes | memoryview, name: str = "") -> np.ndarray:
    """Decode encoded image bytes to a uint8 ``[H, W, 3]`` RGB array.

    Complete JPEGs go to PyTurboJPEG; everything else, and any JPEG it cannot turn into RGB
    (CMYK), goes to Pillow, which also judges damaged files (a truncated JPEG is an error,
    not a partly grey image).

    Raises:
        ValueError: starting with ``name`` when the bytes are not a decodable image.
    """
    tj = _turbojpeg()
    if tj is not None and is_jpeg(data) and bytes(data[-2:]) == JPEG_EOI:
        try:
            return tj.decode(bytes(data), pixel_format=0)  # TJPF_RGB
        except OSError:
            pass
    return pil_to_rgb_array(_open_pil(data, name), name)


def _prefix(name: str) -> str:
    return f"{name}: " if name else ""


def _open_pil(data: bytes | memoryview, name: str) -> Image.Image:
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise ValueError(f"{_prefix(name)}cannot decode image: {e}") from e
    return img


def pil_to_rgb_array(img: Image.Image, name: str = "") -> np.ndarray:
    """Convert a loaded Pillow image of any mode to a uint8 ``[H, W, 3]`` RGB array."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        # Pillow's convert("RGB") clips 16-bit values instead of scaling: scale to 8 bits.
        arr = np.asarray(img, dtype=np.uint32) >> (8 if img.mode != "I" else 24)
        img = Image.fromarray(arr.astype(np.uint8), "L")
    try:
        return np.array(img.convert("RGB"))  # writable, as torch.from_numpy wants
    except (OSError, ValueError) as e:
        raise ValueError(f"{_prefix(name)}cannot convert {img.mode} image to RGB: {e}") from e


def encode_jpeg(pixels: np.ndarray, quality: int) -> bytes:
    """Encode uint8 ``[H, W, 3]`` RGB pixels as baseline 4:2:0 JPEG."""
    tj = _turbojpeg()
    if tj is not None:
        # pixel_format 0 is TJPF_RGB; jpeg_subsample 2 is TJSAMP_420, Pillow's default.
        pixels = np.ascontiguousarray(pixels)
        return tj.encode(pixels, quality=quality, pixel_format=0, jpeg_subsample=2)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=quality)
    return out.getvalue()
