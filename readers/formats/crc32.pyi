"""The compiled batch CRC-32 (``readers/formats/crc32.c``; see :mod:`readers.formats.checks`)."""

from typing_extensions import Buffer

CLMUL: int
"""1 where the CPU's carry-less multiplication computes the CRCs, else 0."""

def crc(value: Buffer, start: int = 0, /) -> int:
    """``zlib.crc32(value, start)`` of one bytes-like value, the GIL released."""

def crcs(values: list[bytes | bytearray | memoryview], out: Buffer, /) -> None:
    """``out[k] = zlib.crc32(values[k])`` into a uint32 buffer of ``len(values)``."""
