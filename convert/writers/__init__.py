"""Format writers, keyed by the format ids of ``readers.spec.FORMATS``."""

from convert.writers.base import Layout, Record, ShardedOutput, ShardWriter, WriterFactory
from convert.writers.hdf5 import Hdf5Writer
from convert.writers.lmdb import LmdbWriter
from convert.writers.pt import PtWriter
from convert.writers.wds import WdsWriter

__all__ = ["WRITERS", "Layout", "Record", "ShardWriter", "ShardedOutput"]

WRITERS: dict[str, WriterFactory] = {
    "pt": PtWriter,
    "hdf5": Hdf5Writer,
    "lmdb": LmdbWriter,
    "wds": WdsWriter,
}
