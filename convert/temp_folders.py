"""The temporary folders a conversion keeps its intermediate files in (the process pool's
spool, a foreign source's span tables and staged images, a Ray task's shard before upload),
and the sweep that removes those a killed conversion left behind.

A run removes its folders when it ends, but a SIGKILL (the OOM killer, ``kill -9``, a lost
node) ends it without a word, and each kill used to leave its folders in the temporary
directory for good. So each folder is held by an exclusive ``flock`` of the process that made
it, for as long as the folder lives: the kernel drops the lock when that process and the
workers it forked are gone, however they died. A folder of ours whose lock can be taken
belongs to no one, and :func:`sweep_temp_folders`, called as each conversion starts, removes
it (locks work across processes of one kernel, so two conversions never take each other's).
A folder is ours by the mark file inside it, not by its name: other tools (and our own
benchmarks and tests) make ``imgpack-*`` folders too, which the sweep must never touch.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
from pathlib import Path

__all__ = ["PREFIX", "TempFolder", "sweep_temp_folders"]

PREFIX = "imgpack-"
"""Every temporary folder's name starts so: ``imgpack-<kind>-<random>``."""

MARK = ".imgpack-temp-folder"
"""The file in each :class:`TempFolder` that makes it one (it holds the maker's pid),
written once the folder is locked: the sweep never sees a folder of ours unlocked."""


class TempFolder:
    """A new folder ``imgpack-<kind>-*`` in ``where`` (None: the temporary directory), held
    by this process (and the processes it forks) until :meth:`remove`."""

    def __init__(self, kind: str, where: str | None = None) -> None:
        self.path = tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-", dir=where)
        self._fd: int | None = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        # New, so no one else holds it. A file system without flock (some FUSE mounts) fails
        # here and in the sweep alike, which then leaves the folder alone: not an error.
        with contextlib.suppress(OSError):
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        Path(self.path, MARK).write_text(f"{os.getpid()}\n", encoding="ascii")

    def remove(self) -> None:
        """Remove the folder, then let go of its lock (once; later calls do nothing)."""
        if self._fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._fd)
        self._fd = None

    def __repr__(self) -> str:
        return f"TempFolder({self.path!r}{'' if self._fd is not None else ', removed'})"


def sweep_temp_folders(where: str | None = None) -> list[Path]:
    """Remove the folders of ours (:class:`TempFolder`: this user's, with :data:`MARK`) in
    ``where`` (None: the temporary directory) that no process holds. Returns the folders
    removed; what cannot be looked at is left alone."""
    root = Path(where or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        candidates = [p for p in root.iterdir() if p.name.startswith(PREFIX)]
        for folder in candidates:
            if _abandoned(folder):
                removed.append(folder)
    return removed


def _abandoned(folder: Path) -> bool:
    """Whether ``folder`` was left by a dead process; if so it is removed, under its lock."""
    try:
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False
        if not stat.S_ISREG((folder / MARK).lstat().st_mode):
            return False
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: a live conversion's
        os.close(fd)
        return False
    try:
        shutil.rmtree(folder, ignore_errors=True)
    finally:
        os.close(fd)
    return not folder.exists()
