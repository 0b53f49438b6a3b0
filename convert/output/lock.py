"""The lock on a folder a conversion writes: a POSIX record lock on ``spec.LOCK_NAME``.

The kernel drops the lock when its process dies, even by SIGKILL, so a stale lock file
never blocks ``--resume``; the file holds the holder's pid, for the message that names it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from readers import spec

__all__ = ["DestinationBusy", "DestinationLock"]


class DestinationBusy(FileExistsError):
    """Another conversion holds the lock on DST."""


class DestinationLock:
    """Exclusive right to write into a dataset folder, held by this process; messages
    name the folder as ``shown_as`` (a bucket DST's URL, for its staging folder's lock)."""

    def __init__(self, dst: Path, shown_as: str | None = None) -> None:
        self.path = dst / spec.LOCK_NAME
        self.shown_as = shown_as or str(dst)
        self._fd: int | None = None

    def holder(self) -> int | None:
        """The pid of another process holding the lock, or None (no file needed)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return _read_pid(fd)
        finally:
            os.close(fd)  # closing releases a lock this process took just now
        return None

    def acquire(self) -> None:
        """Take the lock (creating the file) or raise DestinationBusy naming the holder;
        a no-op when this object holds it already."""
        if self._fd is not None:
            return
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pid = _read_pid(fd)
                os.close(fd)
                raise DestinationBusy(
                    f"{self.shown_as}: another imgpack convert (pid {pid}) is writing "
                    "here; wait for it to finish or stop it first"
                ) from None
            try:  # the holder may have removed the file before we locked it: retry
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Remove the lock file and let go (a no-op if not held)."""
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None
