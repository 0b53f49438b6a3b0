"""Datasets at URLs: object storage (``s3://``, ``gs://``, anything fsspec knows).

A local path or a ``file://`` URL is a folder; any other ``scheme://`` goes through fsspec,
imported only then, with its own credential chain (for S3: the environment, including
``AWS_ENDPOINT_URL``, ``~/.aws``, instance roles) and any ``storage_options`` given. An
unknown scheme is an error, never a local folder named after the URL.

What each side does with a remote dataset: the converter writes to a local staging folder
and uploads each completed shard (``convert.output.remote``); random-access readers copy each
shard they open into a local cache (:class:`readers.storage.cache.ShardCache`); ``WdsStream`` reads
byte ranges of the tars, never whole shards.

Faults are translated here, once: every call :class:`RemoteFolder` makes into fsspec turns
what the storage client raised into a :class:`~readers.storage.faults.StorageError` that
names the URL and the cause in one line (:mod:`readers.storage.faults`).
``FileNotFoundError`` is not a fault: it passes through for the callers that expect it.

A server that stops answering never blocks a reader for long: each call into an async
filesystem (s3fs, gcsfs, adlfs, HTTP) must complete within ``$IMGPACK_STORAGE_TIMEOUT``
seconds (default 60), plus one second per MiB it moves, whatever the client's own
retries; past it, the request is cancelled and a ``StorageError`` says "timed out".
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from readers.spec import DatasetError
from readers.storage.faults import StorageError, refused_credentials, storage_error, timed_out

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "TIMEOUT_ENV",
    "RemoteFolder",
    "StorageError",
    "is_url",
    "local_path",
    "storage_error",
    "storage_timeout",
]

_MERGE_GAP = 1 << 20  # bytes between two ranges worth reading rather than a second request
_MAX_BLOCK = 64 << 20  # largest merged range
_DOWNLOAD_CHUNK = 8 << 20  # bytes a download requests at a time
TIMEOUT_ENV = "IMGPACK_STORAGE_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0
_SLOWEST_RATE = 1 << 20  # bytes a second: a call's time limit grows by 1 s a MiB it moves


def storage_timeout() -> float:
    """The seconds a storage call may take before it fails (plus 1 s a MiB it moves):
    ``$IMGPACK_STORAGE_TIMEOUT`` or 60; ValueError naming the variable if it is no number."""
    text = os.environ.get(TIMEOUT_ENV)
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ValueError(f"{TIMEOUT_ENV}={text!r}: expected seconds, a number above 0")
    return seconds


def _is_fault(error: Exception) -> bool:
    """True for what a storage client raises on a fault: an OSError (not a missing file,
    which callers expect) or a client library's own exception; not a programming error
    (a builtin TypeError, ValueError...) nor an imgpack error."""
    if isinstance(error, (FileNotFoundError, DatasetError)):
        return False
    return isinstance(error, OSError) or type(error).__module__ != "builtins"


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

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.timeout = storage_timeout() if timeout is None else timeout  # see the module
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
            s3 = protocol in ("s3", "s3a")
            extra = " (pip install -e '.[s3]' in the imgpack checkout)" if s3 else ""
            raise ValueError(f"{self.url}: {e}{extra}") from None
        return fs, root.rstrip("/")

    @property
    def fs(self) -> Any:
        return self._fs_and_root[0]

    def path(self, name: str) -> str:
        """The filesystem path (no scheme) of ``name`` in this folder."""
        return f"{self._fs_and_root[1]}/{name}"

    def url_of(self, name: str) -> str:
        return f"{self.url}/{name}" if name else self.url

    @contextlib.contextmanager
    def _faults(self, name: str = "") -> Iterator[None]:
        """Raise what the storage client raises while using ``name`` as a StorageError."""
        try:
            yield
        except Exception as e:
            if not _is_fault(e):
                raise
            raise storage_error(self.url_of(name), e) from e

    def _call(self, name: str, method: str, *args: Any, nbytes: int = 0, **kwargs: Any) -> Any:
        """``fs.method(*args, **kwargs)`` about ``name``, its faults as StorageErrors; on an
        async filesystem within :attr:`timeout` seconds plus one a MiB of ``nbytes``
        (fsspec cancels the request then, whatever retries the client was making)."""
        fs = self.fs
        limit = None
        if getattr(fs, "async_impl", False):
            limit = self.timeout + nbytes / _SLOWEST_RATE
            kwargs["timeout"] = limit
        try:
            with self._faults(name):
                return getattr(fs, method)(*args, **kwargs)
        except StorageError as e:
            if limit is not None and type(e.__cause__).__name__ == "FSTimeoutError":
                raise timed_out(self.url_of(name), limit, TIMEOUT_ENV) from e.__cause__
            if isinstance(e.__cause__, PermissionError) and not refused_credentials(e):
                refused = self._credentials_refusal()
                if refused is not None:
                    raise storage_error(self.url_of(name), refused) from refused
            raise

    def _credentials_refusal(self) -> Exception | None:
        """After a refusal that does not say why (a 403 to a HEAD request has no body):
        the error of listing the bucket if that says the credentials are refused (an
        unknown key, a wrong secret), else None (permission denied, as it said)."""
        bucket = self.bucket
        if bucket is None:
            return None
        self.fs.invalidate_cache(bucket)
        try:
            self.fs.ls(
                bucket, detail=False, **({"timeout": self.timeout} if self.fs.async_impl else {})
            )
        except Exception as e:
            return e if refused_credentials(e) else None
        return None

    @property
    def bucket(self) -> str | None:
        """The bucket (container) this folder lies in, for object stores that have them."""
        if not hasattr(self.fs, "split_path"):  # s3fs, gcsfs, adlfs do
            return None
        return self._fs_and_root[1].split("/", 1)[0]

    def bucket_exists(self) -> bool:
        """False if the folder's bucket does not exist. A bucket this identity may not
        inspect counts as existing: the listing or the first write then says why not."""
        bucket = self.bucket
        if bucket is None:
            return True
        try:
            self._call("", "info", bucket)
        except FileNotFoundError:
            return False
        except StorageError as e:
            if isinstance(e.__cause__, PermissionError):
                return True
            raise
        return True

    def read(self, name: str) -> bytes:
        self.fs.invalidate_cache(self.path(name))  # a listing cached before it was written
        return self._call(name, "cat_file", self.path(name))

    def read_many(self, names: list[str]) -> dict[str, bytes]:
        """The contents of several small objects, fetched concurrently."""
        if not names:
            return {}
        found = self._call(names[0], "cat", [self.path(n) for n in names], on_error="return")
        out = {}
        for name in names:
            data = found.get(self.path(name))
            if isinstance(data, Exception):
                if isinstance(data, FileNotFoundError):
                    continue  # deleted since it was listed
                with self._faults(name):
                    raise data
            out[name] = data
        return out

    def size(self, name: str) -> int | None:
        """The size of ``name`` in bytes, or None if it does not exist."""
        stat = self.stat(name)
        return stat[0] if stat is not None else None

    def stat(self, name: str) -> tuple[int, str] | None:
        """The size of ``name`` and the store's checksum of its content (the ETag, for S3:
        fsspec's ``checksum``), or None if it does not exist."""
        path = self.path(name)
        self.fs.invalidate_cache(path)  # another process may have written it
        try:
            size = int(self._call(name, "info", path)["size"])
        except FileNotFoundError:
            return None
        with self._faults(name):
            try:
                return size, str(self.fs.checksum(path))
            except FileNotFoundError:
                return None

    def names(self) -> list[str]:
        """The names of the objects directly in this folder (none if it does not exist)."""
        folder = self.path("").rstrip("/")
        self.fs.invalidate_cache(folder)
        try:
            listed = self._call("", "ls", folder, detail=False)
        except FileNotFoundError:
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in listed)

    def read_ranges(self, name: str, starts: list[int], ends: list[int]) -> list[bytes]:
        """The byte ranges ``[start, end)`` of ``name``, in the order asked: ranges closer
        than 1 MiB are merged into one request, and the requests run concurrently.
        FileNotFoundError if ``name`` is not in the store."""
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
        nbytes = sum(end - start for start, end in zip(block_starts, block_ends, strict=True))
        blocks = self._call(name, "cat_ranges", paths, block_starts, block_ends, nbytes=nbytes)
        out: list[bytes] = [b""] * len(starts)
        block = 0
        for i, start, end in zip(order, sorted_starts, sorted_ends, strict=True):
            while end > block_ends[block]:
                block += 1
            data = blocks[block]
            if isinstance(data, Exception):
                with self._faults(name):
                    raise data
            offset = start - block_starts[block]
            out[i] = data[offset : offset + end - start]
            if len(out[i]) != end - start:
                raise DatasetError(f"{self.url_of(name)}: bytes {start}-{end} lie past its end")
        return out

    def download(self, name: str, dest: Path, sha256: str | None = None) -> None:
        """Copy ``name`` to the local file ``dest``, checking its SHA-256 when given
        (FileNotFoundError with ``filename`` ``name`` if it is not in the store), 8 MiB a
        request."""
        size = self.size(name)
        if size is None:  # ``filename``: which of a shard's files is missing
            raise FileNotFoundError(errno.ENOENT, "no such object", name)
        digest = hashlib.sha256()
        path = self.path(name)
        with open(dest, "wb") as f:  # a local fault (a full disk) is not the store's
            for start in range(0, size, _DOWNLOAD_CHUNK):
                end = min(start + _DOWNLOAD_CHUNK, size)
                chunk = self._call(name, "cat_file", path, start=start, end=end, nbytes=end - start)
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
        nbytes = local.stat().st_size
        self._call(name, "put_file", str(local), self.path(name), nbytes=nbytes)

    def write(self, name: str, data: bytes) -> None:
        """Store ``data`` as ``name`` (one whole object: readers see all of it or none)."""
        self._call(name, "pipe_file", self.path(name), data, nbytes=len(data))

    def delete(self, names: list[str]) -> None:
        if names:
            self._call(names[0], "rm", [self.path(n) for n in names])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_opened": None}

    def __repr__(self) -> str:
        return f"RemoteFolder({self.url!r})"
