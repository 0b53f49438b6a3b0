"""The switch of the optional compiled modules: the crop kernel (``readers/images/jpegcrop.c``),
the batch CRC-32 (``readers/formats/crc32.c``) and the epoch order's Feistel network
(``readers/epochs/feistel.c``).

``setup.py`` builds them where it finds a compiler; each has a pure-Python path beside it,
which every process takes without them, or with ``IMGPACK_KERNEL=0`` (the tests run the
fallbacks that way).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from types import ModuleType

__all__ = ["COMPILED_ENV", "compiled_module", "compiled_off"]

log = logging.getLogger(__name__)

COMPILED_ENV = "IMGPACK_KERNEL"  # "0" turns the compiled modules off


def compiled_off() -> bool:
    """Whether ``IMGPACK_KERNEL=0`` asks for the pure-Python paths (callers read it once)."""
    return os.environ.get(COMPILED_ENV, "").strip() == "0"


@functools.cache
def compiled_module(name: str, instead: str) -> ModuleType | None:
    """The compiled module ``name``, or None where it was not built or ``IMGPACK_KERNEL=0``
    turns it off (the first logged at debug level with ``instead``, what runs in its place)."""
    if compiled_off():
        return None
    try:  # by name: the extension is no .py beside its package's other modules
        return importlib.import_module(name)
    except ImportError as e:
        log.debug("%s is not built (%s); %s", name, e, instead)
        return None
