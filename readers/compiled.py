"""The switch of the optional compiled modules: the crop kernel (``readers/images/jpegcrop.c``)
and the batch CRC-32 (``readers/formats/crc32.c``).

``setup.py`` builds them where it finds a compiler; each has a pure-Python path beside it,
which every process takes without them, or with ``IMGPACK_KERNEL=0`` (the tests run the
fallbacks that way).
"""

from __future__ import annotations

import os

__all__ = ["COMPILED_ENV", "compiled_off"]

COMPILED_ENV = "IMGPACK_KERNEL"  # "0" turns the compiled modules off


def compiled_off() -> bool:
    """Whether ``IMGPACK_KERNEL=0`` asks for the pure-Python paths (callers read it once)."""
    return os.environ.get(COMPILED_ENV, "").strip() == "0"
