"""Format writers, keyed by the format ids of ``readers.spec.FORMATS``.

:data:`FORMAT_WRITERS` is the converter's one registration of a format: its shard writer
and its defaults. :data:`WRITERS`, the default shard limits of ``convert.options`` and the
formats that take ``--compression`` are read from it.
"""

from dataclasses import dataclass

from convert.writers.base import Layout, Record, ShardedOutput, ShardWriter, WriterFactory
from convert.writers.hdf5 import Hdf5Writer
from convert.writers.lmdb import LmdbWriter
from convert.writers.pt import PtWriter
from convert.writers.wds import WdsWriter

__all__ = [
    "FORMAT_WRITERS",
    "WRITERS",
    "FormatWriter",
    "Layout",
    "Record",
    "ShardWriter",
    "ShardedOutput",
]


@dataclass(frozen=True)
class FormatWriter:
    """What the converter knows of one format."""

    open: WriterFactory  # ``open(tmp_path, layout)``: one shard's writer
    shard_size: int | None  # default samples a shard; None: one file, no roll-over
    shard_bytes: int | None  # default bytes a shard; None: no limit
    compression: bool = False  # takes --compression


FORMAT_WRITERS: dict[str, FormatWriter] = {
    "pt": FormatWriter(PtWriter, 10_000, 1 << 30),
    "hdf5": FormatWriter(Hdf5Writer, None, None, compression=True),
    "lmdb": FormatWriter(LmdbWriter, None, None),
    "wds": FormatWriter(WdsWriter, 10_000, 1 << 30),
}

WRITERS: dict[str, WriterFactory] = {fmt: w.open for fmt, w in FORMAT_WRITERS.items()}
