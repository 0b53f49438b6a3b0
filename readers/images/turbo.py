"""libjpeg-turbo through ctypes, for the batch path: decode into a buffer we own.

PyTurboJPEG returns a new array per image; here each decode thread keeps one TurboJPEG
handle and one scratch buffer for its life, and ``tjDecompress2`` writes straight into it
(ctypes releases the GIL for the call). DCT-domain scaling (1/2, 1/4, 1/8) is asked for
by the output size, as libjpeg-turbo picks the factor that fits it.

Not used: lossless cropping to MCU boundaries (``tjTransform`` + ``TJXOPT_CROP``) before
decoding. It re-encodes the kept coefficients, and on 256-pixel q90 photos cropping the
central 224x224 through it cost 1.5-2x a full decode (docs/BENCHMARKS.md, "Fused crops");
FFCV 1.0.2 does not use it either (``imdecode(..., enable_crop=False)``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from functools import cache

import numpy as np

from readers.images.decode import TJFLAG_STOPONWARNING, decoder_name

__all__ = ["TurboDecoder", "turbo_decoder"]

log = logging.getLogger(__name__)

TJPF_RGB = 0
_LIBRARY = "libturbojpeg.so.0"


class _ThreadState:
    """One decompressor handle and scratch buffer, owned by one thread."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        self.handle = lib.tjInitDecompress()
        if not self.handle:
            raise OSError("tjInitDecompress failed")
        self.scratch = np.empty(0, dtype=np.uint8)

    def buffer(self, nbytes: int) -> np.ndarray:
        if self.scratch.size < nbytes:
            self.scratch = np.empty(max(nbytes, 2 * self.scratch.size), dtype=np.uint8)
        return self.scratch

    def __del__(self) -> None:
        if getattr(self, "handle", None):
            self._lib.tjDestroy(self.handle)


class TurboDecoder:
    """``tjDecompress2`` into a per-thread scratch buffer, the GIL released meanwhile."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        lib.tjInitDecompress.restype = ctypes.c_void_p
        lib.tjInitDecompress.argtypes = []
        lib.tjDestroy.argtypes = [ctypes.c_void_p]
        lib.tjDecompress2.restype = ctypes.c_int
        lib.tjDecompress2.argtypes = [
            ctypes.c_void_p,  # handle
            ctypes.c_void_p,  # jpegBuf
            ctypes.c_ulong,  # jpegSize
            ctypes.c_void_p,  # dstBuf
            ctypes.c_int,  # width
            ctypes.c_int,  # pitch
            ctypes.c_int,  # height
            ctypes.c_int,  # pixelFormat
            ctypes.c_int,  # flags
        ]
        self._lib = lib
        self._local = threading.local()

    def _state(self) -> _ThreadState:
        state = getattr(self._local, "state", None)
        if state is None:
            state = self._local.state = _ThreadState(self._lib)
        return state

    def decode(self, data: np.ndarray, width: int, height: int, scale: int) -> np.ndarray | None:
        """RGB ``[ceil(height/scale), ceil(width/scale), 3]`` pixels of the JPEG ``data``
        (uint8, its full-size dimensions given) in this thread's scratch buffer, valid
        until its next call; None when libjpeg-turbo fails or warns (the caller then
        lets :func:`readers.decode_image` judge)."""
        w, h = -(-width // scale), -(-height // scale)
        state = self._state()
        out = state.buffer(w * h * 3)
        status = self._lib.tjDecompress2(
            state.handle,
            data.ctypes.data,
            data.size,
            out.ctypes.data,
            w,
            w * 3,
            h,
            TJPF_RGB,
            TJFLAG_STOPONWARNING,
        )
        return out[: w * h * 3].reshape(h, w, 3) if status == 0 else None


@cache
def turbo_decoder() -> TurboDecoder | None:
    """The ctypes decoder, or None where :func:`readers.decode_image` would not use
    libjpeg-turbo either (no PyTurboJPEG or library, or ``IMGPACK_DECODER=pillow``), so
    that both paths decode with the same library."""
    if decoder_name() != "turbojpeg":
        return None
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("turbojpeg") or _LIBRARY)
        return TurboDecoder(lib)
    except (OSError, AttributeError) as e:  # no library, or one without these functions
        log.warning("libturbojpeg not usable through ctypes (%s); crops decode per sample", e)
        return None
