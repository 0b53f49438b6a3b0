"""The samples of one WebDataset tar as its members give them, read once, in order.

A sample is the run of members sharing a key (the member name up to the first ``.`` of its
base name; names starting with ``__`` are WebDataset's metadata), a field the rest of the
name. A member extension met twice within one run starts a second sample with the same key
(``webdataset`` raises there; the scan lists it as a duplicate). An uncompressed tar is
walked by its headers (a local one skipping the image bytes; a URL as a stream), each image
then read by its offset in the tar. A compressed one (gzip, bzip2, xz: ``.tar.gz``,
``.tgz``, or any tar name; recognised by its first bytes) cannot be read by byte range, so
its one stream decompression copies the members into a staged file in a temporary
folder (as many bytes as the samples: ``TMPDIR`` says where), which the workers read by
offset and which is removed with the source.
"""

from __future__ import annotations

import tarfile
import weakref
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from convert.sources.files import open_file
from convert.temp_folders import TempFolder
from readers.storage.remote import is_url

__all__ = ["IMAGE_EXTS", "TAR_SUFFIXES", "Member", "Staging", "TarSample", "split_name", "walk"]

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")  # in order of preference within a sample
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")  # the files a folder or URL is listed for

_COMPRESSION = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}
_STREAM_MODES = {"gzip": "r|gz", "bzip2": "r|bz2", "xz": "r|xz"}
_UNREAD = {b"\x28\xb5\x2f\xfd": "zstd", b"\x04\x22\x4d\x18": "lz4"}  # tarfile has no codec


@dataclass(frozen=True)
class Member:
    """One member of a sample: its name in the tar and where its bytes lie."""

    name: str
    offset: int  # in the tar; for a compressed tar's member, in its staged file
    size: int


@dataclass
class TarSample:
    """The members sharing one key, by extension (lower case), and the label member's
    bytes if the sample has that member."""

    key: str
    members: dict[str, Member] = field(default_factory=dict)
    label: bytes | None = None

    def image(self) -> Member | None:
        """The image member, by :data:`IMAGE_EXTS`' preference, or None."""
        return next((self.members[e] for e in IMAGE_EXTS if e in self.members), None)


class Staging:
    """Where a source keeps the image bytes of its compressed tars (or of a shuffled
    Parquet source's files, ``convert.sources.parquet``) for the workers: one file per
    source file in a temporary folder made at the first one, removed once ``owner`` is
    gone. ``read_from`` names the file a worker reads a source file's images from."""

    def __init__(self, owner: object) -> None:
        self._owner = weakref.ref(owner)
        self._folder: TempFolder | None = None
        self.staged: dict[str, str] = {}  # tar -> its staged file

    def file_for(self, number: int, tar: str) -> Path:
        if self._folder is None:
            self._folder = TempFolder("staged")
            weakref.finalize(self._owner(), self._folder.remove)
        path = Path(self._folder.path) / f"{number:06d}-{tar.rstrip('/').rpartition('/')[2]}.images"
        self.staged[tar] = str(path)
        return path

    def read_from(self, tar: str) -> str:
        return self.staged.get(tar, tar)


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name, or None for a name that is no sample field
    (no extension, or WebDataset's ``__key__``-style metadata)."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot or stem.startswith("__"):
        return None
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def walk(tar: str, number: int, label_member: str, staging: Staging) -> Iterator[TarSample]:
    """The samples of ``tar`` (number ``number`` of its source), in member order; the
    bytes of each ``label_member`` read. ValueError naming ``tar`` if it is no tar, or its
    compression is one that cannot be read."""
    with open_file(tar) as f:
        compression = _compression(tar, f)
        try:
            if compression is None:
                mode = "r|" if is_url(tar) else "r:"
                with tarfile.open(fileobj=f, mode=mode) as tf:
                    yield from _samples(tf, label_member, None)
                return
            with (
                open(staging.file_for(number, tar), "wb") as staged,
                tarfile.open(fileobj=f, mode=_STREAM_MODES[compression]) as tf,
            ):
                yield from _samples(tf, label_member, staged)
        except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
            if compression is None and not isinstance(e, tarfile.TarError):
                raise
            if compression is None:
                raise ValueError(f"{tar}: not a tar, or damaged ({e})") from e
            raise ValueError(
                f"{tar}: cannot read the {compression}-compressed tar (damaged or cut short?): {e}"
            ) from e


def _compression(tar: str, f: BinaryIO) -> str | None:
    """The compression ``f`` starts with (rewound after the peek), or None."""
    head = f.read(6)
    f.seek(0)
    for magic, name in _UNREAD.items():
        if head.startswith(magic):
            raise ValueError(
                f"{tar}: a {name}-compressed tar: only gzip, bzip2 and xz compression are "
                f"read; decompress it first ({name} -d)"
            )
    return next((name for magic, name in _COMPRESSION.items() if head.startswith(magic)), None)


def _samples(
    tf: tarfile.TarFile, label_member: str, staged: BinaryIO | None
) -> Iterator[TarSample]:
    """What :func:`walk` yields, from an open tar; image members copied to ``staged``."""
    sample: TarSample | None = None
    for info in tf:
        if not info.isfile():
            continue
        split = split_name(info.name)
        if split is None:
            continue
        key, ext = split
        if sample is None or key != sample.key or ext in sample.members:
            if sample is not None:
                yield sample
            sample = TarSample(key)
        offset = info.offset_data
        if ext == label_member or staged is not None:
            data = _read(tf, info)
            if ext == label_member:
                sample.label = data
            if staged is not None:
                offset = staged.tell()
                staged.write(data)
        sample.members[ext] = Member(info.name, offset, info.size)
    if sample is not None:
        yield sample


def _read(tf: tarfile.TarFile, info: tarfile.TarInfo) -> bytes:
    member = tf.extractfile(info)
    if member is None:
        raise tarfile.ReadError(f"{info.name}: not a regular file")
    return member.read()
