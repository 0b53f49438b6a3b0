"""Format writers, keyed by the format ids of ``readers.spec.FORMATS``.

:data:`FORMAT_WRITERS` is the converter's one registration of a format: its shard writer
and its defaults. :data:`WRITERS`, the default shard limits of ``convert.options`` and the
formats that take ``--compression`` are read from it.
"""

from dataclasses import dataclass
from pathlib import Path

from convert.writers.base import Layout, Record, ShardedOutput, ShardWriter, WriterFactory
from convert.writers.hdf5 import Hdf5Writer
from convert.writers.lmdb import LmdbWriter
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


def pt_writer(path: Path, layout: Layout) -> ShardWriter:
    """A ``pt`` shard's writer (:class:`convert.writers.pt.PtWriter`), imported when the
    first is made: it lays shards out with torch, which a conversion to another format never
    imports (its main process starts a second sooner, and so do the tests' conversions)."""
    from convert.writers.pt import PtWriter

    return PtWriter(path, layout)


@dataclass(frozen=True)
class FormatWriter:
    """What the converter knows of one format."""

    open: WriterFactory  # ``open(tmp_path, layout)``: one shard's writer
    shard_size: int | None  # default samples a shard; None: one file, no roll-over
    shard_bytes: int | None  # default bytes a shard; None: no limit
    compression: bool = False  # takes --compression


FORMAT_WRITERS: dict[str, FormatWriter] = {
    "pt": FormatWriter(pt_writer, 10_000, 1 << 30),
    "hdf5": FormatWriter(Hdf5Writer, None, None, compression=True),
    "lmdb": FormatWriter(LmdbWriter, None, None),
    "wds": FormatWriter(WdsWriter, 10_000, 1 << 30),
}

WRITERS: dict[str, WriterFactory] = {fmt: w.open for fmt, w in FORMAT_WRITERS.items()}
