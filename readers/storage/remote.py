"""Datasets at URLs: object storage (``s3://``, ``gs://``, anything fsspec knows).

A local path or a ``file://`` URL is a folder; any other ``scheme://`` goes through fsspec,
imported only then, with its own credential chain (for S3: the environment, including
``AWS_ENDPOINT_URL``, ``~/.aws``, instance roles) and any ``storage_options`` given. An
unknown scheme is an error, never a local folder named after the URL.

What each side does with a remote dataset: the converter writes to a local staging folder
and uploads each completed shard (``convert.remote``); random-access readers copy each
shard they open into a local cache (:class:`readers.storage.cache.ShardCache`); ``WdsStream`` reads
byte ranges of the tars, never whole shards.

Faults are translated here, once: every call :class:`RemoteFolder` makes into fsspec turns
what the storage client raised (botocore's ``EndpointConnectionError``, aiohttp's
``ServerDisconnectedError``, a ``PermissionError``...) into a :class:`StorageError` that
names the URL and the cause in one line; the original stays chained as its ``__cause__``.
``FileNotFoundError`` is not a fault: it passes through for the callers that expect it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from readers.spec import DatasetError

__all__ = ["RemoteFolder", "StorageError", "is_url", "local_path", "storage_error"]

_MERGE_GAP = 1 << 20  # bytes between two ranges worth reading rather than a second request
_MAX_BLOCK = 64 << 20  # largest merged range


class StorageError(DatasetError):
    """Object storage could not be used: unreachable, no credentials, permission denied,
    a connection lost. The message names the URL and the cause; ``url`` and ``cause`` hold
    them (None after a DataLoader worker re-raises it from its message)."""

    def __init__(self, message: str, *, url: str | None = None, cause: str | None = None) -> None:
        super().__init__(message)
        self.url, self.cause = url, cause


# What a storage client's exception says, by the names of its classes (the client
# libraries are optional imports; the names are their documented exception types).
_NO_CREDENTIALS = {
    "NoCredentialsError",
    "PartialCredentialsError",
    "CredentialRetrievalError",
    "DefaultCredentialsError",  # google-auth
    "ClientAuthenticationError",  # azure-core
}
_CONNECTION_LOST = {
    "ConnectionResetError",
    "BrokenPipeError",
    "ServerDisconnectedError",
    "ClientPayloadError",
    "ConnectionClosedError",
    "IncompleteRead",
}
_CREDENTIAL_HINTS = {"s3": "set AWS_* or ~/.aws", "s3a": "set AWS_* or ~/.aws"}


def storage_error(url: str, error: BaseException) -> StorageError:
    """The :class:`StorageError` for what a storage client raised while using ``url``."""
    chain = _chain(error)
    names = {c.__name__ for e in chain for c in type(e).__mro__}
    if names & _NO_CREDENTIALS:
        scheme = url.split("://", 1)[0]
        hint = _CREDENTIAL_HINTS.get(scheme, f"configure credentials for {scheme}://")
        return StorageError(f"no credentials for {url} ({hint})", url=url, cause="no credentials")
    if any(isinstance(e, PermissionError) for e in chain):
        cause = f"permission denied ({_one_line(error)})"
        return StorageError(f"{url}: {cause}", url=url, cause=cause)
    why = _connection_fault(chain, names)
    if why is not None:
        endpoint = _endpoint(chain)
        cause = f"cannot reach the storage endpoint{f' {endpoint}' if endpoint else ''} ({why})"
        return StorageError(f"{url}: {cause}", url=url, cause=cause)
    cause = f"storage error ({type(error).__name__}: {_one_line(error)})"
    return StorageError(f"{url}: {cause}", url=url, cause=cause)


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions it was raised from or during, outermost first."""
    chain: list[BaseException] = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def _connection_fault(chain: list[BaseException], names: set[str]) -> str | None:
    """Why a connection failed, in words, or None if this is no connection fault."""
    if any(isinstance(e, ConnectionRefusedError) for e in chain):
        return "connection refused"
    if any(isinstance(e, socket.gaierror) for e in chain):
        return "unknown host"
    if names & _CONNECTION_LOST:
        return "connection lost"
    if any(isinstance(e, TimeoutError) for e in chain) or any("Timeout" in n for n in names):
        return "timed out"
    if any(isinstance(e, ConnectionError) for e in chain) or "EndpointConnectionError" in names:
        return "cannot connect"
    return None


def _endpoint(chain: list[BaseException]) -> str | None:
    """``scheme://host:port`` of the server a client failed to reach, where it says."""
    for e in chain:
        url = getattr(e, "kwargs", {}).get("endpoint_url")  # botocore's errors
        if isinstance(url, str) and "://" in url:
            parts = urlsplit(url)
            return f"{parts.scheme}://{parts.netloc}"
        host, port = getattr(e, "host", None), getattr(e, "port", None)  # aiohttp's
        if isinstance(host, str) and port:
            return f"{host}:{port}"
    return None


def _one_line(error: BaseException) -> str:
    return re.sub(r"\s+", " ", str(error)).strip() or type(error).__name__


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
        with self._faults():
            try:
                self.fs.info(bucket)
            except FileNotFoundError:
                return False
            except PermissionError:
                return True
        return True

    def read(self, name: str) -> bytes:
        with self._faults(name):
            self.fs.invalidate_cache(self.path(name))  # a listing cached before it was written
            return self.fs.cat_file(self.path(name))

    def read_many(self, names: list[str]) -> dict[str, bytes]:
        """The contents of several small objects, fetched concurrently."""
        if not names:
            return {}
        with self._faults(names[0]):
            found = self.fs.cat([self.path(n) for n in names], on_error="return")
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
        with self._faults(name):
            self.fs.invalidate_cache(path)  # another process may have written it
            try:
                size = int(self.fs.info(path)["size"])
                return size, str(self.fs.checksum(path))
            except FileNotFoundError:
                return None

    def names(self) -> list[str]:
        """The names of the objects directly in this folder (none if it does not exist)."""
        folder = self.path("").rstrip("/")
        with self._faults():
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
        with self._faults(name):
            blocks = self.fs.cat_ranges(paths, block_starts, block_ends)
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
        """Copy ``name`` to the local file ``dest``, checking its SHA-256 when given."""
        digest = hashlib.sha256()
        with open(dest, "wb") as f:  # a local fault (a full disk) is not the store's
            with self._faults(name):
                src = self.fs.open(self.path(name), "rb", block_size=8 << 20)
            with src:
                while True:
                    with self._faults(name):
                        chunk = src.read(8 << 20)
                    if not chunk:
                        break
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
        with self._faults(name):
            self.fs.put_file(str(local), self.path(name))

    def write(self, name: str, data: bytes) -> None:
        """Store ``data`` as ``name`` (one whole object: readers see all of it or none)."""
        with self._faults(name):
            self.fs.pipe_file(self.path(name), data)

    def delete(self, names: list[str]) -> None:
        if names:
            with self._faults(names[0]):
                self.fs.rm([self.path(n) for n in names])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_opened": None}

    def __repr__(self) -> str:
        return f"RemoteFolder({self.url!r})"
