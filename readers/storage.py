"""Datasets at URLs: object storage (``s3://``, ``gs://``, anything fsspec knows).

A local path or a ``file://`` URL is a folder; any other ``scheme://`` goes through fsspec,
imported only then, with its own credential chain (for S3: the environment, including
``AWS_ENDPOINT_URL``, ``~/.aws``, instance roles) and any ``storage_options`` given. An
unknown scheme is an error, never a local folder named after the URL.

What each side does with a remote dataset: the converter writes to a local staging folder
and uploads each completed shard (``convert.remote``); random-access readers copy each
shard they open into a local cache (:class:`readers.cache.ShardCache`); ``WdsStream`` reads
byte ranges of the tars, never whole shards.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from readers.spec import DatasetError

__all__ = ["RemoteFolder", "is_url", "local_path"]

_MERGE_GAP = 1 << 20  # bytes between two ranges worth reading rather than a second request
_MAX_BLOCK = 64 << 20  # largest merged range


def is_url(path: str | os.PathLike[str]) -> bool:
    """True for ``scheme://...`` other than ``file://``: a location fsspec must reach."""
    text = os.fspath(path)
    return isinstance(text, str) and "://" in text and not text.startswith("file://")


def local_path(path: str | os.PathLike[str]) -> Path:
    """A local path, from a path or a ``file://`` URL."""
    text = os.fspath(path)
    return Path(text[len("file://") :] if text.startswith("file://") else text)


class RemoteFolder:
    """A folder in an fsspec filesystem, named by URL: what readers and the converter do
    there. Picklable; the filesystem is made on first use in each process (fsspec keeps one
    instance per process, so a DataLoader worker never shares a forked connection pool)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self._opened: tuple[int, Any, str] | None = None  # (pid, filesystem, root path)

    @property
    def _fs_and_root(self) -> tuple[Any, str]:
        """The filesystem of this process: fsspec's async filesystems refuse to be used
        after a fork (a DataLoader worker), so a forked copy makes its own."""
        if self._opened is None or self._opened[0] != os.getpid():
            self._opened = (os.getpid(), *self._open())
        return self._opened[1], self._opened[2]

    def _open(self) -> tuple[Any, str]:
        import fsspec  # only where a URL is used

        protocol = self.url.split("://", 1)[0]
        try:
            fs, root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        except ValueError as e:
            raise ValueError(
                f"{self.url}: unknown storage scheme {protocol!r} ({e}): use a local path or "
                "a URL that fsspec knows (s3://, gs://, az://, ...)"
            ) from None
        except ImportError as e:
            extra = " (pip install 'imgpack[s3]')" if protocol in ("s3", "s3a") else ""
            raise ValueError(f"{self.url}: {e}{extra}") from None
        return fs, root.rstrip("/")

    @property
    def fs(self) -> Any:
        return self._fs_and_root[0]

    def path(self, name: str) -> str:
        """The filesystem path (no scheme) of ``name`` in this folder."""
        return f"{self._fs_and_root[1]}/{name}"

    def url_of(self, name: str) -> str:
        return f"{self.url}/{name}"

    def read(self, name: str) -> bytes:
        self.fs.invalidate_cache(self.path(name))  # a listing cached before it was written
        return self.fs.cat_file(self.path(name))

    def size(self, name: str) -> int | None:
        """The size of ``name`` in bytes, or None if it does not exist."""
        self.fs.invalidate_cache(self.path(name))  # another process may have written it
        try:
            return int(self.fs.info(self.path(name))["size"])
        except FileNotFoundError:
            return None

    def names(self) -> list[str]:
        """The names of the objects directly in this folder (none if it does not exist)."""
        folder = self.path("").rstrip("/")
        self.fs.invalidate_cache(folder)
        try:
            listed = self.fs.ls(folder, detail=False)
        except FileNotFoundError:
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in listed)

    def read_ranges(self, name: str, starts: list[int], ends: list[int]) -> list[bytes]:
        """The byte ranges ``[start, end)`` of ``name``, in the order asked: ranges closer
        than 1 MiB are merged into one request, and the requests run concurrently."""
        from fsspec.utils import merge_offset_ranges

        path = self.path(name)
        order = sorted(range(len(starts)), key=starts.__getitem__)
        sorted_starts = [starts[i] for i in order]
        sorted_ends = [ends[i] for i in order]
        paths, block_starts, block_ends = merge_offset_ranges(
            [path] * len(order),
            sorted_starts,
            sorted_ends,
            max_gap=_MERGE_GAP,
            max_block=_MAX_BLOCK,
            sort=False,
        )
        blocks = self.fs.cat_ranges(paths, block_starts, block_ends)
        out: list[bytes] = [b""] * len(starts)
        block = 0
        for i, start, end in zip(order, sorted_starts, sorted_ends, strict=True):
            while end > block_ends[block]:
                block += 1
            data = blocks[block]
            if isinstance(data, Exception):
                raise OSError(f"{self.url_of(name)}: cannot read bytes {start}-{end}: {data}")
            offset = start - block_starts[block]
            out[i] = data[offset : offset + end - start]
            if len(out[i]) != end - start:
                raise DatasetError(f"{self.url_of(name)}: bytes {start}-{end} lie past its end")
        return out

    def download(self, name: str, dest: Path, sha256: str | None = None) -> None:
        """Copy ``name`` to the local file ``dest``, checking its SHA-256 when given."""
        digest = hashlib.sha256()
        with self.fs.open(self.path(name), "rb", block_size=8 << 20) as src, open(dest, "wb") as f:
            while chunk := src.read(8 << 20):
                digest.update(chunk)
                f.write(chunk)
        if sha256 is not None and digest.hexdigest() != sha256:
            dest.unlink(missing_ok=True)
            raise DatasetError(
                f"{self.url_of(name)}: SHA-256 differs from the manifest's: modified since "
                "the conversion (run imgpack verify)"
            )

    def upload(self, local: Path, name: str) -> None:
        """Copy the local file to ``name`` (multipart where the filesystem does it)."""
        self.fs.put_file(str(local), self.path(name))

    def delete(self, names: list[str]) -> None:
        if names:
            self.fs.rm([self.path(n) for n in names])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_opened": None}

    def __repr__(self) -> str:
        return f"RemoteFolder({self.url!r})"
