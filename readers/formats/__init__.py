"""One shard reader per format, by format id: the read side of each format's contract.

Each module documents its format's layout on disk (the names are :mod:`readers.spec`'s)
and defines one :class:`ShardReader`, built as ``reader(path, layout)`` from a local
file; ``wds`` also reads remote tars by byte ranges (:class:`RangedWdsShard`). Nothing
here knows about datasets, epochs or ``torch.utils.data``: :mod:`readers.dataset` opens
shards through a :data:`ShardOpener` (:func:`open_local_shard`, :func:`open_by_ranges`),
checked by :func:`open_checked`.

:data:`FORMAT_READERS` is the read side's one registration of a format (the ids are
``readers.spec.FORMATS``): :data:`SHARD_READERS` and :data:`STREAM_FORMATS` are read from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from readers.formats.hdf5 import Hdf5Shard
from readers.formats.lmdb import LmdbShard
from readers.formats.reader import ShardReader
from readers.formats.wds import RangedWdsShard, WdsShard
from readers.manifest import Manifest
from readers.spec import DatasetError, Layout
from readers.storage.remote import RemoteFolder

__all__ = [
    "FORMAT_READERS",
    "SHARD_READERS",
    "STREAM_FORMATS",
    "FormatReader",
    "RangedWdsShard",
    "ShardOpener",
    "ShardReader",
    "open_by_ranges",
    "open_checked",
    "open_local_shard",
]


def pt_shard(path: str, layout: Layout) -> ShardReader:
    """A ``pt`` shard's reader (:class:`readers.formats.pt.PtShard`), imported when the
    first is opened: it loads shards with torch, which the converter, writing other
    formats through this package, never imports."""
    from readers.formats.pt import PtShard

    return PtShard(path, layout)


@dataclass(frozen=True)
class FormatReader:
    """What the read side knows of one format."""

    shard: Callable[[str, Layout], ShardReader]  # ``shard(path, layout)`` from a local file
    streams: bool = False  # its shards also read as a stream, in order (``stream=True``)
    # ``ranged(remote, name, size, layout)``: a shard in object storage read by byte
    # ranges, never copied whole (None: a remote shard is copied into the cache)
    ranged: Callable[[RemoteFolder, str, int, Layout], ShardReader] | None = None


FORMAT_READERS: dict[str, FormatReader] = {
    "pt": FormatReader(pt_shard),
    "hdf5": FormatReader(Hdf5Shard),
    "lmdb": FormatReader(LmdbShard),
    "wds": FormatReader(WdsShard, streams=True, ranged=RangedWdsShard),
}

SHARD_READERS: dict[str, Callable[[str, Layout], ShardReader]] = {
    fmt: r.shard for fmt, r in FORMAT_READERS.items()
}
STREAM_FORMATS = tuple(fmt for fmt, r in FORMAT_READERS.items() if r.streams)

ShardOpener = Callable[[Manifest, int], ShardReader]
"""Opens shard ``k`` of a dataset: ``opener(manifest, k)``. Picklable (a module-level
function or a ``functools.partial`` of one): DataLoader workers open their own shards."""


def open_local_shard(manifest: Manifest, index: int) -> ShardReader:
    """The default :data:`ShardOpener`: the shard's local file (for a URL, its copy in the
    cache), its size checked, opened by the format's reader."""
    path = manifest.location.shard_file(manifest.shards[index], index)
    return SHARD_READERS[manifest.format](str(path), manifest.layout)


def open_by_ranges(manifest: Manifest, index: int) -> ShardReader:
    """A :data:`ShardOpener` that copies no shard it can read in place: a shard in object
    storage whose format reads by byte ranges (:attr:`FormatReader.ranged`: ``wds``) is
    read so, through its index; any other as :func:`open_local_shard` opens it (a remote
    one copied into the cache first)."""
    remote, ranged = manifest.location.remote, FORMAT_READERS[manifest.format].ranged
    if remote is None or ranged is None:
        return open_local_shard(manifest, index)
    info = manifest.shards[index]
    return ranged(remote, info.path, info.bytes, manifest.layout)


def open_checked(opener: ShardOpener, manifest: Manifest, index: int) -> ShardReader:
    """Shard ``index`` opened by ``opener``, checked to hold the manifest's sample count.

    Raises:
        readers.DatasetError: naming the shard's file or URL, when its count differs.
    """
    expected = manifest.shards[index]
    reader = opener(manifest, index)
    if len(reader.labels) != expected.samples:
        raise DatasetError(
            f"{manifest.location.where(expected.path)}: shard {index} holds "
            f"{len(reader.labels)} samples but the manifest says {expected.samples}"
        )
    return reader
