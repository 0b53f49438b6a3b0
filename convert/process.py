"""One sample of a conversion, run in worker processes: its image through the codec room
(:mod:`convert.codec`: decode, orientation, pixel checks, DCT rule, resize, crop, encode),
once per sample, as the :class:`Prepared` sample the writers store. The recipe and the
geometry are also named here, where the executors, the tests and the benchmarks (run over
older commits too) import them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from convert.codec import (
    DCT_REDUCING_GAP,
    Transform,
    center_crop,
    code_image,
    resize_shorter,
    shorter_size,
)

__all__ = [
    "DCT_REDUCING_GAP",
    "Prepared",
    "Transform",
    "center_crop",
    "prepare",
    "resize_shorter",
    "shorter_size",
]


@dataclass(frozen=True)
class Prepared:
    """One sample ready to write: raw pixels or encoded bytes, with its image extension,
    and its fields' canonical bytes as the source's reader gave them (schema order)."""

    data: bytes | np.ndarray
    ext: str  # jpg, png, ... for encoded data; "raw" for pixels
    shape: tuple[int, int, int]  # [H, W, 3] of the stored image
    fields: tuple[bytes | None, ...] = ()


def prepare(data: bytes | np.ndarray, name: str, t: Transform) -> Prepared:
    """Turn one source sample (a file's bytes, or a dataset's raw ``[H, W, 3]`` pixels)
    into the stored sample; ValueError names a bad one."""
    return Prepared(*code_image(data, name, t))
