"""A local cache of remote shards for the random-access readers, bounded in size.

``pt``, ``hdf5`` and ``lmdb`` shards are opened by memory-mapping a local file, and a
shuffled epoch touches every part of every shard, so those readers (and ``WdsDataset``)
copy each remote shard into the cache the first time a process opens it, then read it as a
local dataset. The cache is one folder shared by every process that names it:

- a file appears only complete and checked (downloaded to a temporary name, its SHA-256
  compared with the manifest's, then renamed), so no process ever opens a torn file;
- over the size limit, the least recently opened shards are deleted (the modification
  time is bumped on each open), under a lock so that two processes do not both evict. A
  shard that a process still has open stays readable until it closes it (POSIX keeps
  the file), so the folder can briefly hold more than the limit.

Defaults: ``$IMGPACK_CACHE_DIR`` or ``~/.cache/imgpack``, limit ``$IMGPACK_CACHE_LIMIT``
or 50 GiB (a size such as ``200GB`` or ``500GiB``: :func:`parse_size`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import uuid
from collections.abc import Collection, Iterator
from pathlib import Path

from readers import spec
from readers.storage.remote import RemoteFolder

__all__ = ["DEFAULT_CACHE_LIMIT", "ShardCache", "parse_size"]

DEFAULT_CACHE_LIMIT = 50 << 30
CACHE_DIR_ENV = "IMGPACK_CACHE_DIR"
CACHE_LIMIT_ENV = "IMGPACK_CACHE_LIMIT"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i)?)?b?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes from ``123``, ``"500MB"`` (500,000,000) or ``"1GiB"`` (2**30): K/M/G/T are
    powers of 1000, KiB/MiB/GiB/TiB of 1024; ValueError for anything else."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size like 512MB or 1GiB")
    number, prefix, binary = float(match.group(1)), match.group(2), match.group(3)
    if not prefix:
        return int(number)
    return int(number * (1024 if binary else 1000) ** ("kmgt".index(prefix.lower()) + 1))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        pass
    return True


class ShardCache:
    """The cache folder and its size limit (picklable: paths and numbers only)."""

    def __init__(
        self, folder: str | os.PathLike[str] | None = None, limit: int | str | None = None
    ) -> None:
        default = Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "imgpack")
        self.folder = Path(folder or default).absolute()
        self.limit = parse_size(limit or os.environ.get(CACHE_LIMIT_ENV) or DEFAULT_CACHE_LIMIT)

    def mirror(self, url: str) -> Path:
        """The local folder that holds the cached shards of the dataset at ``url``."""
        return self.folder_for("datasets", url)

    def folder_for(self, kind: str, url: str) -> Path:
        """``kind/<hash of url>`` in the cache folder: one local folder per remote dataset
        (``datasets``: shard copies, evicted by size; ``staging``: a conversion's)."""
        return self.folder / kind / hashlib.sha256(url.encode()).hexdigest()[:16]

    def fetch(
        self, remote: RemoteFolder, names: dict[str, str], expected_size: dict[str, int]
    ) -> None:
        """Make sure each file ``names`` lists (name -> SHA-256) is in ``remote``'s mirror,
        downloading what is missing or of the wrong size; bump the rest as just used."""
        mirror = self.mirror(remote.url)
        mirror.mkdir(parents=True, exist_ok=True)
        fetched = []
        for name, sha256 in names.items():
            dest = mirror / name
            with contextlib.suppress(FileNotFoundError):
                size = dest.stat().st_size
                if name not in expected_size or size == expected_size[name]:
                    os.utime(dest)  # recently used: evicted last
                    continue
            tmp = mirror / f"{spec.TMP_PREFIX}{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
            try:
                remote.download(name, tmp, sha256)
                os.replace(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)
            fetched.append(dest)
        if fetched:
            self.evict(keep=set(fetched) | {mirror / n for n in names})

    def evict(self, keep: Collection[Path] = ()) -> None:
        """Delete the least recently used files until the cache is within its limit."""
        with self._locked():
            files = []
            for path in self._files():
                with contextlib.suppress(FileNotFoundError):
                    st = path.stat()
                    files.append((st.st_mtime, st.st_size, path))
            total = sum(size for _, size, _ in files)
            for _, size, path in sorted(files):
                if total <= self.limit:
                    break
                if path in keep:
                    continue
                path.unlink(missing_ok=True)
                total -= size

    def _files(self) -> Iterator[Path]:
        root = self.folder / "datasets"
        for folder, _, names in os.walk(root):
            for name in names:
                if not name.startswith(spec.TMP_PREFIX):
                    yield Path(folder) / name
                elif not _alive(int(name.rsplit(".", 2)[-2] or 0)):
                    (Path(folder) / name).unlink(missing_ok=True)  # a killed download's

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def __repr__(self) -> str:
        return f"ShardCache({str(self.folder)!r}, limit={self.limit})"
